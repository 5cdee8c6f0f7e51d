"""`tracengine stats`, `export` and `tui`: views of a trace."""
import json
import os
import sys
import time

from tracengine.errors import TraceError


def cmd_stats(args) -> int:
    from tracengine.analysis.stats import parse_slos, render, stats
    slo = parse_slos(args.slo)
    from tracengine.trace.tracelog import TraceReader
    with TraceReader(args.trace) as reader:
        if reader.header.fleet:      # per replica and for the fleet (docs/cluster.md)
            from tracengine.cli.fleet import fleet_stats_command
            return fleet_stats_command(args.trace, slo, args.json)
    s = stats(args.trace, slo or None)
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        from tracengine.cli.outputs import table_console
        table_console().print(render(s, title=str(args.trace)))
    return 0


def cmd_export(args) -> int:
    from tracengine.analysis.export import REQUESTS_PID, export_perfetto
    from tracengine.cli.outputs import check_outputs
    check_outputs({"--perfetto": args.perfetto}, {"trace": args.trace}, args.force)
    from tracengine.trace.tracelog import TraceReader
    with TraceReader(args.trace) as reader:
        fleet = bool(reader.header.fleet)
    if fleet:     # a process per replica, transfers as flows (docs/cluster.md)
        from tracengine.analysis.fleet_export import export_fleet_perfetto
        doc = export_fleet_perfetto(args.trace, args.perfetto)
        print(f"wrote {args.perfetto}: {len(doc['traceEvents']):,} trace events, {doc['metadata']['num_replicas']} "
              f"replicas; open it in ui.perfetto.dev or chrome://tracing")
        return 0
    doc = export_perfetto(args.trace, args.perfetto)
    num_requests = sum(1 for e in doc["traceEvents"] if e["ph"] == "M" and e["pid"] == REQUESTS_PID
                       and e["name"] == "thread_name")
    print(f"wrote {args.perfetto}: {len(doc['traceEvents']):,} trace events, {doc['metadata']['num_steps']:,} "
          f"steps, {num_requests:,} requests; open it in ui.perfetto.dev or chrome://tracing")
    return 0


def open_index(path: str, follow: bool, wait_s: float = 10.0):
    """The trace's index; a missing or unreadable trace fails here, before the app
    starts. Following, a recording that has not written its header yet is waited for."""
    deadline = time.monotonic() + wait_s
    if follow and not (os.path.exists(path) and os.path.getsize(path)):
        print(f"tracengine: waiting for {path} to be written", file=sys.stderr)
        while time.monotonic() < deadline and not (os.path.exists(path) and os.path.getsize(path)):
            time.sleep(0.1)
    from tracengine.tui.trace_index import TraceIndex
    return TraceIndex(path)


def cmd_tui(args) -> int:
    if os.path.isfile(args.trace) and os.path.getsize(args.trace):
        from tracengine.trace.tracelog import TraceReader
        with TraceReader(args.trace) as reader:
            fleet = bool(reader.header.fleet)
        if fleet:      # one replica at a time (docs/cluster.md)
            if args.follow:
                raise TraceError("a fleet trace is shown whole: --follow follows one engine's")
            from tracengine.tui.fleet import run_fleet_tui
            return run_fleet_tui(args.trace)
    index = open_index(args.trace, args.follow)
    try:
        if index.num_steps == 0 and not args.follow:
            detail = f": {index.problem}" if index.problem else ""
            raise TraceError(f"{args.trace}: no complete step to show{detail}")
        from tracengine.tui.app import TraceApp
        app = TraceApp(index, follow=args.follow)
        app.run()
    finally:
        index.close()
    return app.return_code or 0      # Textual has printed a crash's traceback; the exit code says so
