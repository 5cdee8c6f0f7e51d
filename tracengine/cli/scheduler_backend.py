"""`tracengine replay` on a trace of another engine's own scheduler (vLLM's, SGLang's), written
once over that scheduler's record (replay/scheduler_backends.py) and its backend's reading of the
fields a command line names (cli/vllm_backend.py, cli/sglang_backend.py): re-execution,
--state, the what-if in steps or in simulated time, sweeps of either; and `simulate --scheduler
vllm|sglang` once the backend read its config. The output is the one `replay` and `simulate`
print for tracengine's traces and workloads."""
from tracengine.engine.config import parse_field
from tracengine.errors import ConfigError, TraceError
from tracengine.trace.tracelog import TraceReader


def run_scheduler_replay(args, backend, overrides_of, parse, policy_hint: str) -> int:
    """As cli/replay.run, with `backend`'s scheduler (a replay/scheduler_backends record):
    re-execution, --state, the what-if in steps or in simulated time (--step-time, --roofline, or a
    trace with arrival times), sweeps of either. `overrides_of(args, config)`: the fields the user
    gave, typed as `config` has them; `parse(text, config)`: one NAME=VALUE so (--sweep's values);
    `policy_hint`: which of its fields is the scheduler's own policy (what --policy is told)."""
    from tracengine.cli import replay_runs
    from tracengine.cli.fleet_commands import fleet_changes
    from tracengine.cli.outputs import note_torn_tail
    from tracengine.cli.steptime import step_time_from_args
    from tracengine.cli.sweeps import check_executor_flags, check_plot_figure
    from tracengine.engine.user_classes import resolve
    if args.policy:
        raise TraceError(f"--policy names a tracengine scheduling policy; {backend.a_trace} runs {backend.name}'s "
                         f"scheduler ({policy_hint})")
    if fleet_changes(args):
        raise TraceError(f"{backend.a_trace} runs one {backend.name} scheduler; a fleet's what-if is tracengine's")
    check_plot_figure(args)
    check_executor_flags(args, bool(args.sweep))
    with TraceReader(args.trace) as reader:
        header = reader.header
    note_not_recorded(header)
    if args.state is None or names_fields(args):    # --state alone folds the trace (replay/*_fold.py): no engine
        resolve(backend.check_version)(header)
    overrides = overrides_of(args, header.config)
    replay_runs.check_flags_combine(args, overrides)
    if args.state is not None:
        return replay_runs.show_state(args.trace, args.state)
    step_time = step_time_from_args(args)
    timed = args.arrivals == "time" or step_time is not None
    if not (overrides or args.record or timed or args.sweep):
        return replay_runs.run_replay(args.trace, args.json, replayer=resolve(backend.reexecute))
    if timed and args.arrivals == "steps":
        raise TraceError("--step-time and --roofline time a what-if in simulated time; "
                         "they do not combine with --arrivals steps")
    with TraceReader(args.trace) as reader:
        events = list(reader.events())
        note_torn_tail(reader)
    if args.arrivals is None:    # time when the trace has arrival times, steps otherwise
        from tracengine.replay.timed import has_arrivals
        timed = timed or has_arrivals(events)
    if args.sweep:
        return replay_runs.run_sweep_replay(args.trace, events, overrides, timed, step_time, args, backend,
                                           lambda text: parse(text, header.config))
    if timed:
        return replay_runs.run_timed_whatif(args.trace, events, overrides, args.record, step_time,
                                           as_json=args.json, timed_whatif=resolve(backend.timed_whatif))
    return replay_runs.print_whatif(args.trace, resolve(backend.whatif)(events, overrides), args.record, args.json)


def note_not_recorded(header) -> None:
    """Before a replay starts: on stderr, what the trace does not hold (a feature recorded anyway)."""
    import sys

    from tracengine.trace.header import not_recorded_note
    note = not_recorded_note(header)
    if note is not None:
        print(f"tracengine: note: {note}", file=sys.stderr)


def names_fields(args) -> bool:
    """Whether the command line names a field (--set, or an engine flag)."""
    from tracengine.cli.flags import flag_fields
    return bool(args.set) or any(getattr(args, name, None) is not None for name in flag_fields())


def set_fields(texts, config: dict, parse, flags: dict | None = None) -> dict:
    """The fields --set NAME=VALUE gives (`parse(text, config)`: one so) over those engine flags
    gave (`flags`), typed as `config` has them; a field given twice is refused, not overwritten."""
    given = dict(flags or {})
    for text in texts:
        name, value = parse(text, config)
        if name in given:
            raise ConfigError(f"{name} is given " + ("as a flag and in --set" if name in (flags or {}) else
                                                     "twice in --set"))
        given[name] = value
    return given


def parsed_field(text: str, config: dict, engine: str, settable: list, aliases: dict | None = None):
    """`NAME=VALUE` (--set, --sweep's values) as one of `engine`'s `settable` fields (`aliases`: a
    name's other names) and its value, typed as `config` has it."""
    return parse_field(text, config, settable, f"{engine} config field", aliases)


def simulate_through_scheduler(args, name: str, config: dict, variants, slo, step_time, simulate, sweep_runner: str,
                               before_run=None, search=None) -> int:
    """`simulate --scheduler vllm|sglang` once the backend read its config: the workload through
    `simulate(config, requests, step_time)` (or a --sweep's variants, made by `sweep_runner`),
    printed as simulate prints. `before_run()`: what must not count in the run's time. `search`:
    (the --set fields, how swept values are typed) for a --search (cli/search.py)."""
    import time

    from tracengine.analysis.stats import render, stats
    from tracengine.cli.common import print_table
    from tracengine.cli.flags import DEFAULT_VOCAB_SIZE, workload_for_simulation, workload_spec
    from tracengine.cli.outputs import check_outputs
    from tracengine.cli.steptime import describe_step_time, input_files, print_unvaried_note
    from tracengine.cli.sweeps import print_sweep
    from tracengine.errors import TracengineError
    from tracengine.sim.engine import check_token_prompts
    if args.record and variants is not None:
        raise TracengineError("--record writes one run; a --sweep makes many")
    check_outputs({"--record": args.record}, input_files(args), args.force)
    vocab_size = args.vocab_size or (step_time.model.vocab_size if step_time.kind == "roofline" else DEFAULT_VOCAB_SIZE)
    workload = args.workload_file or args.workload
    requests = workload_for_simulation(args, workload, vocab_size)
    check_token_prompts(requests)
    if variants is not None or search is not None:
        from tracengine.sim.spec import PreparedSources, SweepSpec, workload_source
        source, prepared = workload_source(workload_spec(args, workload=workload), vocab_size), PreparedSources()
        prepared.add(source, requests)
        if search is not None:
            from tracengine.cli.search import run_search
            if before_run is not None:
                before_run()
            return run_search(args, search[0], step_time, requests, source, prepared, sweep_runner, config, search[1])
        spec = SweepSpec(sweep_runner, source.digest, config, step_time.to_dict(), slo)
        print(f"simulate {len(requests):,} requests through {name}'s scheduler with {describe_step_time(step_time)}")
        rc = print_sweep(spec, source, prepared, variants, args)
        print_unvaried_note(step_time)
        return rc
    if before_run is not None:
        before_run()
    wall, cpu = time.perf_counter(), time.process_time()
    events = simulate(config, requests, step_time)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if args.record:
        from tracengine.trace.tracelog import write_trace
        write_trace(args.record, events)
    s = stats(events, slo)
    print(f"simulated {len(requests):,} requests through {name} {events[0].engine_version}'s scheduler with "
          f"{describe_step_time(step_time)}: {s['steps']['num_steps']:,} steps in {wall:.2f} s wall, {cpu:.2f} s CPU")
    print_table(render(s, title="simulated run"))
    if args.record:
        print(f"wrote {args.record}")
    return 0
