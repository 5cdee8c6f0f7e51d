"""`tracengine export`: a trace as Chrome/Perfetto trace-event JSON."""
from tracengine.cli.common import add_parser


def add_to(sub):
    p = add_parser(sub, "export", "export a trace for other tools",
                   "Export a trace as Chrome/Perfetto trace-event JSON (open it in ui.perfetto.dev).")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--perfetto", metavar="OUT", required=True, help="write Chrome/Perfetto trace-event JSON to OUT")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(run=run)


def run(args) -> int:
    from tracengine.cli.backends import commands_for_trace
    from tracengine.cli.outputs import check_outputs
    check_outputs({"--perfetto": args.perfetto}, {"trace": args.trace}, args.force)
    return commands_for_trace(args.trace).export(args.trace, args.perfetto)
