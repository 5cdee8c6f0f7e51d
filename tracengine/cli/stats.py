"""`tracengine stats`: the serving figures of a trace."""

from tracengine.cli.common import add_parser


def add_to(sub):
    p = add_parser(sub, "stats", "serving figures of a trace",
                   "Serving figures of a trace: queueing, TTFT, ITL, TPOT and end-to-end latency from each\n"
                   "request's arrival, in steps and ms; request and token throughput over the run; goodput\n"
                   "under --slo objectives; preemptions, prefix-cache hits, KV use (docs/stats.md).")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--json", action="store_true", help="the figures as one JSON object")
    p.add_argument("--slo", action="append", default=[], metavar="NAME=VALUE",
                   help="a service-level objective for goodput, e.g. ttft=200ms, tpot=50ms, e2e=2s (repeatable; "
                   "a request is good when it meets every one)")
    p.set_defaults(run=run)


def run(args) -> int:
    from tracengine.analysis.stats import parse_slos
    from tracengine.cli.backends import commands_for_trace
    return commands_for_trace(args.trace).stats(args.trace, parse_slos(args.slo), args.json)
