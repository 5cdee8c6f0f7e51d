"""`tracengine tui`: step through a trace in the terminal (live with --follow)."""

from tracengine.cli.common import add_parser


def add_to(sub):
    p = add_parser(sub, "tui", "step through a trace in the terminal",
                   "Step through a trace in the terminal: queues, block map and events at each step.")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--follow", action="store_true", help="follow a trace that is still being recorded")
    p.set_defaults(run=run)


def run(args) -> int:
    from tracengine.cli.backends import commands_for_trace
    return commands_for_trace(args.trace).tui(args.trace, args.follow)
