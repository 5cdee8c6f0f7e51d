"""What `tracengine replay` runs and prints, whichever scheduler a trace ran (tracengine's, or vLLM's
through cli/vllm_backend.py): re-execution, --state, the what-if in steps and in simulated time,
and sweeps of what-ifs; each takes the backend's own function where the backends differ."""
import json
import os

from tracengine.analysis.figures import figure_at, to_json_object
from tracengine.analysis.render import render_state
from tracengine.analysis.tables import make_table, table_text
from tracengine.cli.common import EXIT_FAILED_CHECK, EXIT_OK
from tracengine.cli.outputs import check_outputs, note_torn_tail
from tracengine.cli.flags import config_overrides
from tracengine.cli.steptime import (describe_step_time, input_files, print_unvaried_note, step_time_from_args,
                                     step_time_json)
from tracengine.cli.sweeps import check_executor_flags, check_plot_figure, print_sweep, sweep_options
from tracengine.errors import TraceError, TracengineError
from tracengine.replay.fold import Fold
from tracengine.replay.metrics import side_by_side
from tracengine.replay.reexec import divergence_report, reexecute
from tracengine.trace.views import to_builtins
from tracengine.trace.tracelog import TraceReader, write_trace


# -- the what-if in simulated time ------------------------------------------------------------


# (label, keys into a stats dict, scale, format) of each row of the simulated-time table: every
# figure is `tracengine stats`' own, named as stats names it
TIMED_ROWS = [("duration ms", ("steps", "total_s"), 1e3, "{:,.1f}"),
              ("steps", ("steps", "num_steps"), 1, "{:,}"),
              ("prefill steps", ("steps", "num_prefill_steps"), 1, "{:,}"),
              ("preemptions", ("preemption", "num_preemptions"), 1, "{:,}"),
              ("completion tokens/s", ("throughput", "completion_tokens_per_s"), 1, "{:,.1f}")]
for _name, _label in (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "e2e")):
    TIMED_ROWS += [(f"{_label} {p} ms", ("latency", _name, "seconds", p), 1e3, "{:,.2f}") for p in ("p50", "p90", "p99")]
    TIMED_ROWS.append((f"{_label} p50 steps", ("latency", _name, "steps", "p50"), 1, "{:,.1f}"))


def _event_json(event):
    return None if event is None else to_builtins(event)


def check_flags_combine(args, overrides: dict) -> None:
    """--state goes alone, --slo/--plot/--jobs only with --sweep, and --record never over an input
    or (without --force) an existing file; a TraceError says which."""
    if args.state is not None and (overrides or args.record or args.json or args.sweep):
        raise TraceError("--state shows the recorded state; it does not combine with --set, --sweep, --record "
                         "or --json")
    if not args.sweep and (args.slo or args.plot or args.jobs is not None):
        raise TraceError("--slo, --plot and --jobs go with --sweep (for one run's goodput: --record it and "
                         "`tracengine stats --slo`)")
    check_outputs({"--record": args.record}, input_files(args), args.force)


def show_state(path, step: int) -> int:
    with TraceReader(path) as reader:
        fold = Fold(reader.events())
        note_torn_tail(reader)
    if not -1 <= step < fold.num_steps:
        raise TraceError(f"{path}: no step {step}; the trace has steps 0..{fold.num_steps - 1} (-1: before the first)")
    print(render_state(fold.state_at(step)), end="")
    return EXIT_OK


def run_replay(path, as_json: bool = False, policy: str | None = None, replayer=None) -> int:
    """`replayer`: the re-execution to run (vLLM's, for a vLLM trace); tracengine's by default."""
    with TraceReader(path) as reader:
        result = replayer(reader.events()) if replayer is not None else reexecute(reader.events(), policy)
        if result.ok and result.num_steps == 0:     # nothing was compared: no verdict to give
            torn = reader.describe_torn_tail()
            raise TraceError(f"{path}: the trace has no complete step to replay{f' ({torn})' if torn else ''}")
        note_torn_tail(reader)
    if as_json:
        d = result.divergence
        print(json.dumps({
            "trace": str(path), "reproduced": result.ok, "num_steps": result.num_steps,
            "num_events": result.num_events, "num_unfinished": result.num_unfinished, "seconds": result.seconds,
            "divergence": None if d is None else {"step": d.step, "index": d.index, "reason": d.reason,
                                                  "expected": _event_json(d.expected),
                                                  "actual": _event_json(d.actual)}}, indent=2, default=to_json_object))
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


def run_whatif(path, events, overrides: dict, record, as_json: bool = False, policy: str | None = None) -> int:
    """`events`: those of the trace at `path`, read."""
    from tracengine.replay.whatif import whatif
    return print_whatif(path, whatif(events, overrides, policy=policy), record, as_json)


def print_whatif(path, result, record, as_json: bool = False) -> int:
    """A what-if's result (replay/whatif.py's WhatIfResult), its trace written to `record`."""
    if record:
        write_trace(record, result.events)
    if as_json:
        print(json.dumps({
            "trace": str(path), "changes": [{"name": n, "old": old, "new": new} for n, old, new in result.changes],
            "recorded": result.original, "what_if": result.new,
            "num_past_output": result.num_past_output, "record": record}, indent=2, default=to_json_object))
        return EXIT_OK
    changes = ", ".join(f"{name} {old} -> {new}" for name, old, new in result.changes) or "no config change"
    print(f"what-if on {path}: {changes}")
    print(side_by_side(result.original, result.new, "recorded", "what-if"))
    if result.num_past_output:
        print(f"note: {result.num_past_output} sequences ran past their recorded output (filler tokens)")
    if record:
        print(f"wrote {record}")
    return EXIT_OK


def timed_rows(s: dict) -> list[tuple[str, float | None, str]]:
    """(label, value, format) rows of a stats dict, for the simulated-time table."""
    rows = []
    for label, keys, scale, fmt in TIMED_ROWS:
        value = figure_at(s, *keys)
        rows.append((label, None if value is None else value * scale, fmt))
    return rows


def _cell(value, fmt) -> str:
    return "-" if value is None else fmt.format(value)


def relative_error(predicted, recorded):
    if predicted is None or recorded is None:
        return None
    if recorded == 0:
        return 0.0 if predicted == 0 else None
    return (predicted - recorded) / recorded


def timed_table(recorded: dict, self_check: dict, new: dict | None) -> str:
    """recorded | the recorded config in simulated time | its error | the what-if."""
    header = ["", "recorded", "simulated", "error"] + (["what-if", "vs recorded"] if new is not None else [])
    table = [header]
    for i, (label, value, fmt) in enumerate(timed_rows(recorded)):
        sim = timed_rows(self_check)[i][1]
        err = relative_error(sim, value)
        row = [label, _cell(value, fmt), _cell(sim, fmt), "-" if err is None else f"{err:+.1%}"]
        if new is not None:
            w = timed_rows(new)[i][1]
            change = relative_error(w, value)
            row += [_cell(w, fmt), "-" if change is None else f"{change:+.1%}"]
        table.append(row)
    return table_text(make_table(header, table[1:]))


def run_sweep_replay(path, events: list, overrides: dict, timed: bool, step_time, args, makers=None,
                     parse=None) -> int:
    """`events`: those of the trace at `path`, read. `makers`: whose prepare_timed and
    prepare_steps make the variants (vLLM's scheduler's for a vLLM trace: replay/scheduler_backends.VLLM),
    replay/sweeps.py by default; `parse`: as sweep_options'."""
    from tracengine.sim.spec import PreparedSources, Source
    from tracengine.sim.sweep import IN_STEPS, IN_TIME
    if makers is None:
        from tracengine.replay import sweeps as makers
    prepare_steps, prepare_timed = makers.prepare_steps, makers.prepare_timed
    variants, slo = sweep_options(args, overrides, IN_TIME if timed else IN_STEPS, parse)
    if args.record:
        raise TracengineError("--record writes one run; a --sweep makes many")
    source, prepared = Source.of("trace", path), PreparedSources()
    if timed:
        spec, model = prepare_timed(prepared, source, events, step_time, os.path.basename(path), overrides, slo,
                                    args.policy)
        meta = {"trace": str(path), "arrivals": "time", "step_time": step_time_json(model, path)}
        title = f"sweep of {path} in simulated time; step times: {describe_step_time(model, path)}"
    else:
        spec = prepare_steps(prepared, source, events, overrides, args.policy)
        meta = {"trace": str(path), "arrivals": "steps", "step_time": None}
        title = (f"sweep of {path} at the recorded arrival steps, in steps (a step-exact what-if has no time: "
                 f"for ms, sweep in simulated time)")
    if not args.json:
        print(title)
    rc = print_sweep(spec, source, prepared, variants, args, {**meta, "overrides": overrides})
    if timed and not args.json:
        print_unvaried_note(model)
    return rc


def run_timed_whatif(path, events: list, overrides: dict, record, step_time, policy: str | None = None,
                     as_json: bool = False, timed_whatif=None) -> int:
    """`events`: those of the trace at `path`, read. `timed_whatif`: the what-if to run (vLLM's
    scheduler's for a vLLM trace: vllm/timed.py), replay/timed.py's by default."""
    from tracengine.analysis.stats import stats
    if timed_whatif is None:
        from tracengine.replay.timed import timed_whatif
    # `replay` checked --record (exists without --force, or the input) before calling
    result = timed_whatif(events, overrides, step_time, os.path.basename(path), policy)
    recorded, self_check = stats(result.recorded), stats(result.self_check)
    new = stats(result.new) if overrides else None
    if as_json:
        import json
        if record:
            write_trace(record, result.new)
        print(json.dumps({
            "trace": str(path), "arrivals": "time", "step_time": step_time_json(result.step_time, path),
            "changes": [{"name": n, "old": old, "new": new} for n, old, new in result.changes],
            "recorded": recorded, "simulated": self_check, "what_if": new,
            "num_past_output": result.num_past_output, "record": record}, indent=2, default=to_json_object))
        return EXIT_OK
    changes = ", ".join(f"{name} {old} -> {new}" for name, old, new in result.changes) or "no config change"
    print(f"what-if on {path} in simulated time: {changes}")
    print(f"step times: {describe_step_time(result.step_time, path)}")
    print(timed_table(recorded, self_check, new))
    print("simulated: the recorded config in simulated time, so `error` is how far the step-time model "
          "is from this run")
    print_unvaried_note(result.step_time)
    if result.num_past_output:
        print(f"note: {result.num_past_output} sequences ran past their recorded output (filler tokens)")
    if record:
        write_trace(record, result.new)
        print(f"wrote {record}")
    return EXIT_OK


def replay_engine_trace(args) -> int:
    """`tracengine replay` of one engine's trace (tracengine's): re-execution, --state, the
    what-if in steps or in simulated time, one or a sweep, or its workload through a fleet."""
    return _replay(args, fleet_trace=False)


def replay_fleet_trace(args) -> int:
    """`tracengine replay` of a fleet's trace: re-executed whole, or its what-if (docs/cluster.md)."""
    return _replay(args, fleet_trace=True)


def _replay(args, fleet_trace: bool) -> int:
    check_plot_figure(args)
    check_executor_flags(args, bool(args.sweep))
    from tracengine.cli.fleet_commands import take_scoped_sets
    scoped = take_scoped_sets(args)      # a pool's or a replica's fields: a fleet's (docs/cluster.md)
    overrides = config_overrides(args)
    check_flags_combine(args, overrides)
    if args.state is not None:
        return show_state(args.trace, args.state)
    step_time = step_time_from_args(args)
    timed = args.arrivals == "time" or step_time is not None
    from tracengine.cli.fleet_commands import fleet_changes
    from tracengine.fleet.overrides import is_fleet_name
    reshaped = any(name != "router" for name in fleet_changes(args)) or bool(scoped) or \
        any(is_fleet_name(text.partition("=")[0].strip().replace("-", "_")) for text in args.sweep)
    if fleet_trace or reshaped or args.router:
        return run_fleet_replay(args, fleet_trace, reshaped, overrides, timed, step_time, scoped)
    if not (overrides or args.record or timed or args.sweep):
        return run_replay(args.trace, args.json, args.policy)
    if timed and args.arrivals == "steps":
        raise TraceError("--step-time and --roofline time a what-if in simulated time; "
                         "they do not combine with --arrivals steps")
    with TraceReader(args.trace) as reader:    # read once, for the arrivals and the runs
        events = list(reader.events())
        note_torn_tail(reader)
    if args.arrivals is None:    # time when the trace has arrival times, steps otherwise
        from tracengine.replay.timed import has_arrivals
        timed = timed or has_arrivals(events)
    if args.sweep:
        return run_sweep_replay(args.trace, events, overrides, timed, step_time, args)
    if timed:
        return run_timed_whatif(args.trace, events, overrides, args.record, step_time, args.policy, args.json)
    return run_whatif(args.trace, events, overrides, args.record, args.json, args.policy)


def run_fleet_replay(args, fleet_trace: bool, reshaped: bool, overrides: dict, timed: bool, step_time,
                     scoped: dict) -> int:
    """A fleet trace re-executed whole (alone, --router: with that router), or a trace's workload
    through another fleet (docs/cluster.md), one or a sweep. `scoped`: the pools' and replicas'
    --set fields."""
    from tracengine.cli.fleet_commands import fleet_changes, fleet_replay_command, fleet_whatif_command
    if args.arrivals == "steps":
        raise TraceError("a fleet runs in time: --arrivals steps is one engine's")
    with TraceReader(args.trace) as reader:
        events = list(reader.events())
        note_torn_tail(reader)
    if args.sweep:
        from tracengine.cli.fleet_sweeps import fleet_sweep_command
        return fleet_sweep_command(args, events, overrides, scoped, step_time)
    if fleet_trace and not (reshaped or overrides or args.record or timed):
        return fleet_replay_command(args.trace, events, args.json, args.policy, args.router)
    changes = {**overrides, **fleet_changes(args), **scoped}     # over the recorded fleet, as a sweep's base
    return fleet_whatif_command(args.trace, events, changes, args.record, step_time, args.policy, args.json)
