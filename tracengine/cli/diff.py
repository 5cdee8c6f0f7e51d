"""`tracengine diff`: the first scheduling difference between two traces."""
import json

from tracengine.analysis.render import format_event, render_step
from tracengine.cli.common import EXIT_FAILED_CHECK, EXIT_OK, add_parser
from tracengine.cli.outputs import note_torn_tail
from tracengine.replay.diff import diff_traces, scheduling_events
from tracengine.replay.metrics import side_by_side
from tracengine.trace.events import to_builtins
from tracengine.trace.tracelog import TraceReader
from tracengine.analysis.figures import to_json_object


def add_to(sub):
    p = add_parser(sub, "diff", "first scheduling divergence between two traces",
                   "Compare two traces' scheduling events step by step: print the first difference and\n"
                   "the two runs side by side (exit 1 when they differ).")
    p.add_argument("a", help="the first trace")
    p.add_argument("b", help="the second trace")
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.set_defaults(run=run)


def _event_json(event):
    return None if event is None else to_builtins(event)


def run(args) -> int:
    with TraceReader(args.a) as reader_a, TraceReader(args.b) as reader_b:
        if reader_a.header.fleet or reader_b.header.fleet:    # docs/cluster.md
            from tracengine.cli.fleet_commands import fleet_diff_command
            a_events, b_events = list(reader_a.events()), list(reader_b.events())
            note_torn_tail(reader_a)
            note_torn_tail(reader_b)
            return fleet_diff_command(args, a_events, b_events)
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
        print(f"no scheduling difference in {d.a_stats['steps']['num_steps']} steps")
        return EXIT_OK
    print(f"first scheduling difference at step {d.step}:")
    print(f"  a: {render_step(d.a_events) if d.a_events else '(the trace has ended)'}")
    print(f"  b: {render_step(d.b_events) if d.b_events else '(the trace has ended)'}")
    print(f"  first differing event (#{d.index} of the step's scheduling events):")
    print(f"    a: {format_event(a_sched[d.index] if d.index < len(a_sched) else None, wall_clock=False)}")
    print(f"    b: {format_event(b_sched[d.index] if d.index < len(b_sched) else None, wall_clock=False)}")
    print(side_by_side(d.a_stats, d.b_stats, "a", "b"))
    return EXIT_FAILED_CHECK
