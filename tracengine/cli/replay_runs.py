"""What `tracengine replay` runs and prints, whichever scheduler a trace ran (tracengine's, or vLLM's
through cli/vllm_backend.py): re-execution, --state, the what-if in steps and in simulated time,
and sweeps of what-ifs; each takes the backend's own function where the backends differ."""
import json
import os

from tracengine.analysis.render import render_state
from tracengine.analysis.tables import make_table, table_text
from tracengine.cli.common import EXIT_FAILED_CHECK, EXIT_OK
from tracengine.cli.outputs import check_outputs, note_torn_tail
from tracengine.cli.steptime import (describe_step_time, input_files, print_unvaried_note,
                                     step_time_json)
from tracengine.cli.sweeps import (print_sweep,
                                   sweep_options)
from tracengine.errors import TraceError, TracengineError
from tracengine.replay.fold import Fold
from tracengine.replay.metrics import side_by_side
from tracengine.replay.reexec import divergence_report, reexecute
from tracengine.trace.events import to_builtins
from tracengine.trace.tracelog import TraceReader, write_trace
from tracengine.analysis.figures import Figures, to_json_object


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


def pick_figure(s, *keys):
    """The figure at `keys` in a run's stats (or a fleet's stats dict), or None where one is missing."""
    value = s
    for key in keys:
        value = value.get(key) if isinstance(value, (dict, Figures)) else None
    return value


def timed_rows(s: dict) -> list[tuple[str, float | None, str]]:
    """(label, value, format) rows of a stats dict, for the simulated-time table."""
    rows = []
    for label, keys, scale, fmt in TIMED_ROWS:
        value = pick_figure(s, *keys)
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
    """`events`: those of the trace at `path`, read. `makers`: the module whose prepare_timed and
    prepare_steps make the variants (vLLM's scheduler's for a vLLM trace: vllm/sweeps.py),
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
