"""`tracengine replay` (re-execution, `--state`, what-if with `--set`) and
`tracengine diff`. Exit 0 when a check holds, 1 when it does not; bad input
raises a TracengineError (exit 2 in cli.py)."""
import json

from tracengine.cli.outputs import check_outputs, note_torn_tail
from tracengine.engine.config import parse_override
from tracengine.errors import TraceError
from tracengine.replay.diff import SCHEDULING_TYPES, diff_traces
from tracengine.replay.fold import Fold
from tracengine.replay.metrics import side_by_side
from tracengine.replay.reexec import reexecute
from tracengine.replay.render import divergence_report, format_event, render_state, render_step
from tracengine.trace.events import to_builtins
from tracengine.trace.tracelog import TraceReader, TraceWriter

EXIT_OK, EXIT_FAILED_CHECK = 0, 1


def _event_json(event):
    return None if event is None else to_builtins(event)


def cmd_replay(args) -> int:
    from tracengine.cli.simulate import check_plot_figure
    check_plot_figure(args)
    overrides = dict(parse_override(text) for text in args.set)
    if args.state is not None:
        if overrides or args.record or args.json or args.sweep:
            raise TraceError("--state shows the recorded state; it does not combine with --set, --sweep, --record "
                             "or --json")
        return show_state(args.trace, args.state)
    from tracengine.cli.simulate import input_files, step_time_from_args
    if not args.sweep and (args.slo or args.plot or args.jobs is not None):
        raise TraceError("--slo, --plot and --jobs go with --sweep (for one run's goodput: --record it and "
                         "`tracengine stats --slo`)")
    check_outputs({"--record": args.record}, input_files(args), args.force)
    step_time = step_time_from_args(args)
    timed = args.arrivals == "time" or step_time is not None
    if not (overrides or args.record or timed or args.sweep):
        return run_replay(args.trace, args.json, args.policy)
    if timed and args.arrivals == "steps":
        raise TraceError("--step-time and --roofline time a what-if in simulated time; "
                         "they do not combine with --arrivals steps")
    with TraceReader(args.trace) as reader:    # read once, for the arrivals and the runs
        events = list(reader.events())
        note_torn_tail(reader)
    if args.arrivals is None:    # time when the trace has arrival times, steps otherwise
        from tracengine.replay.simulate import has_arrivals
        timed = timed or has_arrivals(events)
    if args.sweep:
        from tracengine.cli.simulate import run_sweep_replay
        return run_sweep_replay(args.trace, events, overrides, timed, step_time, args)
    if timed:
        from tracengine.cli.simulate import run_timed_whatif
        return run_timed_whatif(args.trace, events, overrides, args.record, step_time, args.policy, args.json)
    return run_whatif(args.trace, events, overrides, args.record, args.json, args.policy)


def show_state(path, step: int) -> int:
    with TraceReader(path) as reader:
        fold = Fold(reader.events())
        note_torn_tail(reader)
    if not -1 <= step < fold.num_steps:
        raise TraceError(f"{path}: no step {step}; the trace has steps 0..{fold.num_steps - 1} (-1: before the first)")
    print(render_state(fold.state_at(step)), end="")
    return EXIT_OK


def run_replay(path, as_json: bool = False, policy: str | None = None) -> int:
    with TraceReader(path) as reader:
        result = reexecutor(reader.header, policy)(reader.events())
        note_torn_tail(reader)
    if as_json:
        d = result.divergence
        print(json.dumps({
            "trace": str(path), "reproduced": result.ok, "num_steps": result.num_steps,
            "num_events": result.num_events, "num_unfinished": result.num_unfinished, "seconds": result.seconds,
            "divergence": None if d is None else {"step": d.step, "index": d.index, "reason": d.reason,
                                                  "expected": _event_json(d.expected),
                                                  "actual": _event_json(d.actual)}}, indent=2))
        return EXIT_OK if result.ok else EXIT_FAILED_CHECK
    if result.ok:
        print(f"{path}: {result.num_steps} steps and {result.num_events} events reproduced exactly "
              f"({result.seconds:.2f} s, {result.events_per_second:,.0f} events/s)")
        if result.num_unfinished:
            print(f"note: the trace ends before {result.num_unfinished} of its sequences finished")
        return EXIT_OK
    with TraceReader(path) as reader:
        print(divergence_report(str(path), result, reader.events()), end="")
    return EXIT_FAILED_CHECK


def reexecutor(header, policy: str | None = None):
    """The re-execution for the engine that made the trace: tracengine's, or vLLM's own scheduler."""
    if header.engine == "vllm":
        if policy is not None:
            raise TraceError("--policy replays a trace of tracengine's scheduler; this one is vLLM's")
        from tracengine.vllm.replay import reexecute as reexecute_vllm
        return reexecute_vllm
    return lambda events: reexecute(events, policy)


def run_whatif(path, events, overrides: dict, record, as_json: bool = False, policy: str | None = None) -> int:
    """`events`: those of the trace at `path`, read."""
    from tracengine.replay.whatif import whatif
    result = whatif(events, overrides, policy=policy)
    if record:
        write_trace(record, result.events)
    if as_json:
        print(json.dumps({
            "trace": str(path), "changes": [{"name": n, "old": old, "new": new} for n, old, new in result.changes],
            "recorded": result.original, "what_if": result.new,
            "num_past_output": result.num_past_output, "record": record}, indent=2))
        return EXIT_OK
    changes = ", ".join(f"{name} {old} -> {new}" for name, old, new in result.changes) or "no config change"
    print(f"what-if on {path}: {changes}")
    print(side_by_side(result.original, result.new, "recorded", "what-if"))
    if result.num_past_output:
        print(f"note: {result.num_past_output} sequences ran past their recorded output (filler tokens)")
    if record:
        print(f"wrote {record}")
    return EXIT_OK


def write_trace(path, events) -> None:
    with TraceWriter(path, events[0]) as writer:
        for event in events[1:]:
            writer.emit(event)


def cmd_diff(args) -> int:
    with TraceReader(args.a) as reader_a, TraceReader(args.b) as reader_b:
        d = diff_traces(reader_a.events(), reader_b.events())
        note_torn_tail(reader_a)
        note_torn_tail(reader_b)
    a_sched = [e for e in d.a_events if isinstance(e, SCHEDULING_TYPES)]
    b_sched = [e for e in d.b_events if isinstance(e, SCHEDULING_TYPES)]
    if args.json:
        print(json.dumps({
            "a": str(args.a), "b": str(args.b), "identical": d.identical,
            "config_changes": [{"name": n, "a": a, "b": b} for n, a, b in d.config_changes],
            "step": d.step, "index": None if d.identical else d.index,
            "a_event": None if d.identical else _event_json(a_sched[d.index] if d.index < len(a_sched) else None),
            "b_event": None if d.identical else _event_json(b_sched[d.index] if d.index < len(b_sched) else None),
            "a_stats": d.a_stats, "b_stats": d.b_stats}, indent=2))
        return EXIT_OK if d.identical else EXIT_FAILED_CHECK
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
