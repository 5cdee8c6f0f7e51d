"""`tracengine calibrate`, `tracengine simulate` and the time-aware what-if of
`tracengine replay --set` (docs/simulation.md): the step-time flags, and the
recorded / simulated / what-if table in ms and steps."""
import os
from contextlib import contextmanager

from tracengine.cli.outputs import check_outputs
from tracengine.errors import TracengineError

EXIT_OK = 0


def add_step_time_arguments(p):
    g = p.add_argument_group("step time (simulated time; docs/simulation.md)")
    g.add_argument("--step-time", metavar="FILE", help="a step-time model from `tracengine calibrate` (JSON)")
    g.add_argument("--roofline", metavar="CONFIG", help="a roofline from a model's config.json (or its directory)")
    g.add_argument("--hardware", help="roofline hardware preset: H200, H100, H100-PCIe, A100 (any case)")
    g.add_argument("--peak-tflops", type=float, metavar="X", help="roofline peak dense TFLOP/s (overrides the preset)")
    g.add_argument("--bandwidth-tbs", type=float, metavar="X", help="roofline memory bandwidth in TB/s")
    g.add_argument("--overhead-ms", type=float, metavar="X", help="roofline fixed time per step (default 1 ms)")


def input_files(args) -> dict:
    """The files a replay or simulate command reads, by name, for check_outputs: no output is one of them."""
    roofline = getattr(args, "roofline", None)
    if roofline and os.path.isdir(roofline):
        roofline = os.path.join(roofline, "config.json")
    return {"trace": getattr(args, "trace", None), "workload file": getattr(args, "workload", None),
            "step-time model": getattr(args, "step_time", None), "model config": roofline}


def step_time_from_args(args):
    """The model the flags name, or None (a what-if then calibrates on its own trace)."""
    from tracengine.sim.roofline import ModelShape, RooflineStepTime
    from tracengine.sim.steptime import load_step_time
    hardware_flags = any(getattr(args, name, None) is not None
                         for name in ("hardware", "peak_tflops", "bandwidth_tbs", "overhead_ms"))
    if args.step_time and args.roofline:
        raise TracengineError("give one of --step-time and --roofline")
    if args.step_time:
        if hardware_flags:
            raise TracengineError("--hardware, --peak-tflops, --bandwidth-tbs and --overhead-ms shape a --roofline")
        return load_step_time(args.step_time)
    if args.roofline:
        return RooflineStepTime.for_hardware(ModelShape.from_file(args.roofline), args.hardware, args.peak_tflops,
                                             args.bandwidth_tbs, args.overhead_ms)
    if hardware_flags:
        raise TracengineError("--hardware, --peak-tflops, --bandwidth-tbs and --overhead-ms shape a --roofline")
    return None


def describe_step_time(model, trace_path: str = "") -> str:
    if model.kind == "roofline":
        return (f"roofline of {model.model.name or 'the model'} on {model.hardware} "
                f"({model.peak_flops / 1e12:g} TFLOP/s, {model.bandwidth / 1e12:g} TB/s, "
                f"{model.overhead_ns / 1e6:g} ms per step)")
    src = model.source
    where = f"calibrated on {src.get('trace') or trace_path or 'a trace'}"
    return f"linear model {where} ({src.get('model', '?')} on {src.get('device', '?')}, {src.get('dtype', '?')})"


# -- calibrate --------------------------------------------------------------------------------


def cmd_calibrate(args) -> int:
    from tracengine.sim.steptime import FEATURES, PARTS, PHASES, calibrate, save, unvaried_note
    from tracengine.trace.tracelog import TraceReader
    check_outputs({"--output": args.output}, {"trace": args.trace}, args.force)
    from tracengine.cli.outputs import note_torn_tail
    with TraceReader(args.trace) as reader:
        model = calibrate(reader.events(), os.path.basename(args.trace))
        note_torn_tail(reader)
    src, err = model.source, model.error
    print(f"calibrated on {args.trace}: {src['num_steps']} steps of {src['model']} on {src['device']} ({src['dtype']})")
    for label, e in (("held-out steps (every 5th, fitted without them)", err["held_out"]),
                     ("all steps (the saved fit)", err["all_steps"])):
        print(f"{label}: {e['num_steps']} steps")
        for name, title in (("total", "step time"), ("model", "model part")):
            f = e[name]
            print(f"  {title:<10} per step: median error {f['median_abs_ms']:.3f} ms ({f['median_rel']:.1%}), "
                  f"mean {f['mean_abs_ms']:.3f} ms; total {f['predicted_ms']:,.1f} ms predicted vs "
                  f"{f['recorded_ms']:,.1f} ms recorded ({f['total_rel']:+.1%})")
    print(f"loop gap between busy steps: {model.gap_ns / 1e6:.3f} ms; from an arrival to the step it wakes "
          f"an idle engine for: {model.wake_ns / 1e6:.3f} ms")
    print("coefficients, ns per unit: " + ", ".join(FEATURES))
    for phase in PHASES:
        for part in PARTS:
            weights = model.coefficients[phase][part]
            print(f"  {phase:<7} {part:<14} " + "  ".join(f"{w:>12.4g}" for w in weights))
    note = unvaried_note(model)
    if note:
        print(note)
    if args.output:
        save(model, args.output)
        print(f"wrote {args.output}")
    return EXIT_OK


# -- the time-aware what-if -------------------------------------------------------------------


def _pick(s: dict, *keys):
    value = s
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


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


def timed_rows(s: dict) -> list[tuple[str, float | None, str]]:
    """(label, value, format) rows of a stats dict, for the simulated-time table."""
    rows = []
    for label, keys, scale, fmt in TIMED_ROWS:
        value = _pick(s, *keys)
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
    widths = [max(len(r[c]) for r in table) for c in range(len(header))]
    return "\n".join("  ".join(cell.ljust(widths[0]) if c == 0 else cell.rjust(widths[c])
                               for c, cell in enumerate(r)) for r in table)


def run_sweep_replay(path, events: list, overrides: dict, timed: bool, step_time, args) -> int:
    """`events`: those of the trace at `path`, read."""
    from tracengine.replay.timed import TimedReplay
    from tracengine.sim.sweep import IN_STEPS, IN_TIME
    from tracengine.replay.timed import StepVariant, TimedVariant
    variants, slo = sweep_options(args, overrides, IN_TIME if timed else IN_STEPS)
    if args.record:
        raise TracengineError("--record writes one run; a --sweep makes many")
    if timed:
        replay = TimedReplay(events, step_time, os.path.basename(path))
        run_variant = TimedVariant(replay, overrides, slo, args.policy)
        meta = {"trace": str(path), "arrivals": "time", "step_time": step_time_json(replay.ensure_step_time(), path)}
        title = f"sweep of {path} in simulated time; step times: {describe_step_time(replay.step_time, path)}"
    else:
        run_variant = StepVariant(events, overrides, args.policy)
        meta = {"trace": str(path), "arrivals": "steps", "step_time": None}
        title = (f"sweep of {path} at the recorded arrival steps, in steps (a step-exact what-if has no time: "
                 f"for ms, sweep in simulated time)")
    if not args.json:
        print(title)
    rc = print_sweep(run_variant, variants, args, {**meta, "overrides": overrides})
    if timed and not args.json:
        print_unvaried_note(replay.step_time)
    return rc


def print_unvaried_note(model):
    """The features the model's calibration recording never varied: the self-check cannot show
    what a what-if that varies them gets wrong."""
    from tracengine.sim.steptime import unvaried_note
    note = unvaried_note(model)
    if note:
        print(note)


def step_time_json(model, trace_path: str = "") -> dict:
    return {"kind": model.kind, "description": describe_step_time(model, trace_path), **model.to_dict()}


def run_timed_whatif(path, events: list, overrides: dict, record, step_time, policy: str | None = None,
                     as_json: bool = False) -> int:
    """`events`: those of the trace at `path`, read."""
    from tracengine.analysis.stats import stats
    from tracengine.replay.timed import timed_whatif
    # `replay` checked --record (exists without --force, or the input) before calling
    result = timed_whatif(events, overrides, step_time, os.path.basename(path), policy)
    recorded, self_check = stats(result.recorded), stats(result.self_check)
    new = stats(result.new) if overrides else None
    if as_json:
        import json
        if record:
            write_events(record, result.new)
        print(json.dumps({
            "trace": str(path), "arrivals": "time", "step_time": step_time_json(result.step_time, path),
            "changes": [{"name": n, "old": old, "new": new} for n, old, new in result.changes],
            "recorded": recorded, "simulated": self_check, "what_if": new,
            "num_past_output": result.num_past_output, "record": record}, indent=2))
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
        write_events(record, result.new)
        print(f"wrote {record}")
    return EXIT_OK


def write_events(path, events):
    from tracengine.trace.tracelog import TraceWriter
    with TraceWriter(path, events[0]) as writer:
        for event in events[1:]:
            writer.emit(event)



# -- simulate ---------------------------------------------------------------------------------

DEFAULT_VOCAB_SIZE = 151_936     # Qwen3's: the made-up token ids of a length-only workload stay below it


def workload_for_simulation(args, vocab_size: int):
    from tracengine.workload.sources import workload_requests
    args.prompt = args.prompts_file = None     # text prompts need a tokenizer: simulate has none
    args.temperature = None                    # no model samples: the synthetic runner's tokens
    if not args.workload and getattr(args, "num_prompts", None) is None and not getattr(args, "prompt_lens", None):
        raise TracengineError("simulate needs a WORKLOAD file, --num-prompts or --prompt-lens")
    return workload_requests(args, vocab_size)


def add_sweep_arguments(p):
    g = p.add_argument_group("sweeps (one row per variant, in parallel processes)")
    g.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="run every value of a config field (repeatable: the grid of all of them)")
    g.add_argument("--jobs", type=int, metavar="N", help="worker processes (default: one per core)")
    g.add_argument("--slo", action="append", default=[], metavar="NAME=VALUE",
                   help="goodput objective, e.g. ttft=200ms, tpot=50ms, e2e=2s (repeatable)")
    g.add_argument("--plot", metavar="OUT.png", help="draw --plot-figure against the first swept value "
                   "(needs matplotlib: the 'plot' extra)")
    g.add_argument("--plot-figure", help="the figure --plot draws: throughput, ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, "
                   "tpot_p99_ms, e2e_p50_ms, e2e_p99_ms, preemptions or goodput (default ttft_p99_ms); of a "
                   "step-exact sweep: tokens_per_step, ttft_p50_steps, ttft_p99_steps, tpot_p50_steps, "
                   "tpot_p99_steps, e2e_p50_steps, e2e_p99_steps or preemptions (default ttft_p99_steps)")


def sweep_options(args, overrides: dict, figures=None):
    """(variants, slo) of the sweep flags; variants is None without --sweep. `overrides`: the
    --set fields, which no --sweep may name too (one of the two would silently win). `figures`:
    the sweep's (replay.sweep.IN_TIME, the default, or IN_STEPS), which --plot-figure names one of."""
    from tracengine.analysis.stats import parse_slos
    from tracengine.sim.sweep import IN_STEPS, IN_TIME, parse_sweep
    figures = figures or IN_TIME
    check_plot_figure(args)
    slo = parse_slos(args.slo) or None
    if not args.sweep:
        if args.plot or args.jobs is not None:
            raise TracengineError("--plot and --jobs go with --sweep")
        return None, slo
    if slo and figures is IN_STEPS:
        raise TracengineError("--slo objectives are times, and a step-exact sweep (--arrivals steps, or a trace "
                              "without arrival times) has none: its figures are in steps")
    args.plot_figure = args.plot_figure or figures.default_figure
    if args.plot_figure not in figures.names:
        of = " of a step-exact sweep (in steps)" if figures is IN_STEPS else ""
        raise TracengineError(f"--plot-figure{of} is one of {', '.join(figures.names)}, got {args.plot_figure!r}")
    if args.plot and args.plot_figure == "goodput" and not slo:
        raise TracengineError("--plot-figure goodput needs an --slo objective (without one no run has a goodput)")
    if args.jobs is not None and args.jobs <= 0:
        raise TracengineError(f"--jobs must be positive, got {args.jobs}")
    check_outputs({"--plot": args.plot}, input_files(args), getattr(args, "force", False))
    if args.plot:
        check_plot_format(args.plot)
    variants = parse_sweep(args.sweep)
    both = [name for name in variants[0] if name in overrides]
    if both:
        raise TracengineError(f"--set and --sweep both name {', '.join(both)}; give its values to --sweep alone")
    return variants, slo


def check_plot_figure(args):
    """--plot-figure names what --plot draws: without --plot nothing would read it."""
    if args.plot_figure is not None and not args.plot:
        raise TracengineError("--plot-figure goes with --plot (it names the figure the plot draws)")


PLOT_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")   # matplotlib's own


def check_plot_format(path: str):
    """The image format is the --plot file's extension; one matplotlib does not write is said
    before the runs (without one it would write PATH.png, beside the file that was checked)."""
    extension = os.path.splitext(path)[1].lstrip(".").lower()
    if extension not in PLOT_FORMATS:
        raise TracengineError(f"--plot {path!r}: name the image format by the extension, one of "
                              f"{', '.join('.' + f for f in PLOT_FORMATS)}")


def print_sweep(run_variant, variants, args, meta: dict | None = None) -> int:
    """The sweep's table, or with --json (`meta` given) one object: `meta`'s keys and each
    variant's overrides with its row of figures (replay.sweep.row_of or step_row_of: stats' own;
    which, `run_variant.figures` says)."""
    import time
    from tracengine.sim.sweep import plot_rows, render_rows, run_sweep
    if args.plot:    # fail before the runs, not after them
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise TracengineError("--plot needs matplotlib: pip install 'tracengine[plot]'") from None
    start = time.perf_counter()
    rows = run_sweep(run_variant, variants, args.jobs)
    jobs = min(args.jobs or os.cpu_count() or 1, len(variants))
    if meta is not None and getattr(args, "json", False):
        import json
        if args.plot:
            plot_rows(args.plot, variants, rows, args.plot_figure, run_variant.figures)
        print(json.dumps({**meta, "plot": args.plot or None,
                          "variants": [{"set": v, "figures": r} for v, r in zip(variants, rows)]}, indent=2))
        return EXIT_OK
    print(render_rows(variants, rows, run_variant.figures))
    print(f"{len(variants)} variants in {time.perf_counter() - start:.2f} s on {jobs} worker"
          f"{'s' if jobs > 1 else ''}; {run_variant.figures.units}")
    if args.plot:
        plot_rows(args.plot, variants, rows, args.plot_figure, run_variant.figures)
        print(f"wrote {args.plot}")
    return EXIT_OK


@contextmanager
def simulation_progress(num_requests: int, enabled: bool = True):
    """A progress bar on stderr (the results go to stdout): finished requests and the simulated
    time so far. Yields the run's `on_progress` (None when disabled: the loop then checks nothing);
    the bar starts at its first report, so a run refused before its first step prints none."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    progress = Progress(TextColumn("Simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.fields[simulated_s]:,.1f} s simulated"),
                        console=Console(stderr=True), transient=False)
    task = None

    def on_progress(num_finished: int, now_ns: int):
        nonlocal task
        if task is None:
            progress.start()
            task = progress.add_task("simulate", total=num_requests, simulated_s=0.0)
        progress.update(task, completed=num_finished, simulated_s=now_ns / 1e9)

    try:
        yield on_progress
    finally:
        if task is not None:
            progress.stop()


def cmd_simulate(args) -> int:
    import time
    from tracengine.engine.config import parse_override
    from tracengine.sim.engine import simulate, simulate_config, simulation_header, timed_requests
    if args.workload_file and args.workload:
        raise TracengineError("give the workload file once: as WORKLOAD or as --workload")
    args.workload = args.workload_file or args.workload
    overrides = dict(parse_override(text) for text in args.set)
    variants, slo = sweep_options(args, overrides)
    step_time = step_time_from_args(args)
    if step_time is None:
        raise TracengineError("simulate needs step times: --step-time FILE (tracengine calibrate) or --roofline CONFIG")
    if args.record and variants is not None:
        raise TracengineError("--record writes one run; a --sweep makes many")
    check_outputs({"--record": args.record}, input_files(args), args.force)
    vocab_size = args.vocab_size
    if vocab_size is None:
        vocab_size = step_time.model.vocab_size if step_time.kind == "roofline" else DEFAULT_VOCAB_SIZE
    elif vocab_size <= 0:
        raise TracengineError(f"--vocab-size must be positive, got {vocab_size}")
    requests = timed_requests(workload_for_simulation(args, vocab_size))
    from tracengine.cli.fleet import fleet_spec_from_args
    fleet = fleet_spec_from_args(args, step_time)
    if fleet is not None and fleet.is_single:    # one replica: today's simulation, its trace and all
        fleet = None
    if fleet is not None and variants is not None:
        raise TracengineError("a --sweep runs one engine; a fleet (--replicas, --prefill-replicas) runs alone")
    if variants is not None:
        from tracengine.sim.sweep import SimulateVariant
        print(f"simulate {len(requests):,} requests with {describe_step_time(step_time)}")
        rc = print_sweep(SimulateVariant(requests, overrides, step_time, slo), variants, args)
        print_unvaried_note(step_time)
        return rc
    config = simulate_config(overrides, requests)
    if fleet is not None:
        return simulate_fleet_run(args, config, requests, step_time, fleet, slo)
    header = simulation_header(config, step_time)
    from tracengine.analysis.timeline import RequestTimelineSink
    with simulation_progress(len(requests), enabled=not args.quiet) as on_progress:
        wall, cpu = time.perf_counter(), time.process_time()
        if args.record:
            from tracengine.trace.tracelog import TraceWriter
            # stored as they are: a simulated prompt's made-up tokens hardly deflate, and deflating
            # them costs more than simulating (docs/simulation.md)
            with TraceWriter(args.record, header, deflate=False) as writer:
                sink = RequestTimelineSink(header, writer)
                simulate(config, requests, step_time, sink, header, on_progress)
        else:
            sink = RequestTimelineSink(header)
            simulate(config, requests, step_time, sink, header, on_progress)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    from tracengine.analysis.stats import render, stats
    from tracengine.cli.outputs import table_console
    s = stats(sink.timeline, slo)
    print(f"simulated {len(requests):,} requests with {describe_step_time(step_time)}: "
          f"{s['steps']['num_steps']:,} steps in {wall:.2f} s wall, {cpu:.2f} s CPU")
    table_console().print(render(s, title="simulated run"))
    print_unvaried_note(step_time)
    if args.record:
        print(f"wrote {args.record}")
    return EXIT_OK


def simulate_fleet_run(args, config, requests, step_time, fleet, slo) -> int:
    import time
    from tracengine.cli.fleet import print_fleet_stats, simulate_fleet_command
    with simulation_progress(len(requests), enabled=not args.quiet) as on_progress:
        wall, cpu = time.perf_counter(), time.process_time()
        s = simulate_fleet_command(args, config, requests, step_time, fleet, slo, on_progress)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    num_steps = sum(p["stats"]["steps"]["num_steps"] for p in s["replicas"])
    print(f"simulated {len(requests):,} requests with {describe_step_time(step_time)}: "
          f"{num_steps:,} replica steps in {wall:.2f} s wall, {cpu:.2f} s CPU")
    print_fleet_stats(s, "simulated fleet")
    print_unvaried_note(step_time)
    if args.record:
        print(f"wrote {args.record}")
    return EXIT_OK
