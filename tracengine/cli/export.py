"""`tracengine export`: a trace as Chrome/Perfetto trace-event JSON."""
from tracengine.cli.common import EXIT_OK, add_parser


def add_to(sub):
    p = add_parser(sub, "export", "export a trace for other tools",
                   "Export a trace as Chrome/Perfetto trace-event JSON (open it in ui.perfetto.dev).")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--perfetto", metavar="OUT", required=True, help="write Chrome/Perfetto trace-event JSON to OUT")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(run=run)


def run(args) -> int:
    from tracengine.analysis.export_stream import export_perfetto
    from tracengine.cli.outputs import check_outputs
    check_outputs({"--perfetto": args.perfetto}, {"trace": args.trace}, args.force)
    from tracengine.cli.fleet_commands import fleet_export_command, is_fleet_trace
    if is_fleet_trace(args.trace):     # a process per replica, transfers as flows (docs/cluster.md)
        return fleet_export_command(args.trace, args.perfetto)
    written = export_perfetto(args.trace, args.perfetto)
    print(f"wrote {args.perfetto}: {written['num_trace_events']:,} trace events, "
          f"{written['metadata']['num_steps']:,} steps, {written['num_requests']:,} requests; "
          f"open it in ui.perfetto.dev or chrome://tracing")
    return EXIT_OK
