"""`tracengine stats`: the serving figures of a trace."""
import json

from tracengine.cli.common import EXIT_OK, add_parser, print_table
from tracengine.analysis.figures import to_json_object


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
    from tracengine.analysis.stats import parse_slos, render, stats
    slo = parse_slos(args.slo)
    from tracengine.cli.fleet_commands import fleet_stats_command, is_fleet_trace
    if is_fleet_trace(args.trace):      # per replica and for the fleet (docs/cluster.md)
        return fleet_stats_command(args.trace, slo, args.json)
    s = stats(args.trace, slo or None)
    if args.json:
        print(json.dumps(s, indent=2, default=to_json_object))
    else:
        print_table(render(s, title=str(args.trace)))
    return EXIT_OK
