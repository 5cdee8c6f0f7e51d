"""What the commands that read a trace do with one engine's trace, tracengine's or vLLM's
scheduler's (cli/backends.py picks these, or a fleet's, by the trace's header): its stats, its
step table, its export, the viewer and the diff of two."""
import json
import os
import sys
import time

from tracengine.analysis.figures import to_json_object
from tracengine.cli.common import EXIT_FAILED_CHECK, EXIT_OK, print_table
from tracengine.errors import TraceError


def stats_command(path, slo: dict, as_json: bool) -> int:
    from tracengine.analysis.stats import render, stats
    s = stats(path, slo or None)
    if as_json:
        print(json.dumps(s, indent=2, default=to_json_object))
    else:
        print_table(render(s, title=str(path)))
    return EXIT_OK


def step_tables(reader, steps, seq) -> list[str]:
    """The step table of the trace `reader` reads (one: one engine's)."""
    from tracengine.analysis.render import render_steps
    return [render_steps(reader.events(), steps, seq)]


def export_command(path, out) -> int:
    from tracengine.analysis.export_stream import export_perfetto
    written = export_perfetto(path, out)
    print(f"wrote {out}: {written['num_trace_events']:,} trace events, "
          f"{written['metadata']['num_steps']:,} steps, {written['num_requests']:,} requests; "
          f"open it in ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


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


def tui_command(path, follow: bool) -> int:
    index = open_index(path, follow)
    try:
        if index.num_steps == 0 and not follow:
            detail = f": {index.problem}" if index.problem else ""
            raise TraceError(f"{path}: no complete step to show{detail}")
        from tracengine.tui.app import TraceApp
        app = TraceApp(index, follow=follow)
        app.run()
    finally:
        index.close()
    return app.return_code or EXIT_OK      # Textual has printed a crash's traceback; the exit code says so


def event_check(header):
    """The frame-by-frame check of one engine's events (replay/event_check.py)."""
    from tracengine.replay.event_check import EventCheck
    return EventCheck(header)


def _event_json(event):
    from tracengine.trace.views import to_builtins
    return None if event is None else to_builtins(event)


def diff_command(args, reader_a, reader_b) -> int:
    """The first scheduling difference between two engines' traces, and the runs side by side."""
    from tracengine.analysis.render import format_event, render_step
    from tracengine.cli.outputs import note_torn_tail
    from tracengine.replay.diff import diff_traces, scheduling_events
    from tracengine.replay.metrics import side_by_side
    d = diff_traces(reader_a.events(), reader_b.events())
    note_torn_tail(reader_a)
    note_torn_tail(reader_b)
    a_sched, b_sched = scheduling_events(d.a_events), scheduling_events(d.b_events)
    if args.json:
        print(json.dumps({
            "a": str(args.a), "b": str(args.b), "identical": d.identical,
            "config_changes": [{"name": n, "a": a, "b": b} for n, a, b in d.config_changes],
            "workload_difference": d.workload_difference,
            "step": d.step, "index": None if d.identical else d.index,
            "a_event": None if d.identical else _event_json(a_sched[d.index] if d.index < len(a_sched) else None),
            "b_event": None if d.identical else _event_json(b_sched[d.index] if d.index < len(b_sched) else None),
            "a_stats": d.a_stats, "b_stats": d.b_stats}, indent=2, default=to_json_object))
        return EXIT_OK if d.identical else EXIT_FAILED_CHECK
    if d.workload_difference:     # first: a difference of scheduling follows from it, not from the engine
        print(f"the two traces ran different workloads: {d.workload_difference}")
    if d.config_changes:
        print("config: " + ", ".join(f"{name} {a} vs {b}" for name, a, b in d.config_changes))
    if d.identical:
        print(f"no scheduling difference in {d.a_stats.steps.num_steps} steps")
        return EXIT_OK
    print(f"first scheduling difference at step {d.step}:")
    print(f"  a: {render_step(d.a_events) if d.a_events else '(the trace has ended)'}")
    print(f"  b: {render_step(d.b_events) if d.b_events else '(the trace has ended)'}")
    print(f"  first differing event (#{d.index} of the step's scheduling events):")
    print(f"    a: {format_event(a_sched[d.index] if d.index < len(a_sched) else None, wall_clock=False)}")
    print(f"    b: {format_event(b_sched[d.index] if d.index < len(b_sched) else None, wall_clock=False)}")
    print(side_by_side(d.a_stats, d.b_stats, "a", "b"))
    return EXIT_FAILED_CHECK
