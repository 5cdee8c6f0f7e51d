"""`tracengine tui`: step through a trace in the terminal (live with --follow)."""
import os
import sys
import time

from tracengine.cli.common import EXIT_OK, add_parser
from tracengine.errors import TraceError


def add_to(sub):
    p = add_parser(sub, "tui", "step through a trace in the terminal",
                   "Step through a trace in the terminal: queues, block map and events at each step.")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--follow", action="store_true", help="follow a trace that is still being recorded")
    p.set_defaults(run=run)


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


def run(args) -> int:
    from tracengine.cli.fleet_commands import is_fleet_trace
    if is_fleet_trace(args.trace):      # one replica at a time (docs/cluster.md)
        if args.follow:
            raise TraceError("a fleet trace is shown whole: --follow follows one engine's")
        from tracengine.tui.fleet_app import run_fleet_tui
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
    return app.return_code or EXIT_OK      # Textual has printed a crash's traceback; the exit code says so
