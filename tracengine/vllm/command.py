"""`tracengine replay` on a trace of vLLM's own scheduler: re-execution through
vLLM's scheduler, `--state`, and the what-if in steps (`--set` any field of
the header's config: vLLM's scheduler and cache fields, `num_gpu_blocks`,
`scheduler_kind`). The output is the one `replay` prints for tracengine's
traces (cli/replay.py)."""
from tracengine.errors import ConfigError, TraceError
from tracengine.trace.tracelog import TraceReader

# tracengine's engine flags that name a vLLM field under another name
FLAG_ALIASES = {"kvcache_block_size": "block_size", "num_kvcache_blocks": "num_gpu_blocks"}


def run_replay(args) -> int:
    from tracengine.cli import replay as cli_replay
    from tracengine.cli.outputs import check_outputs, note_torn_tail
    from tracengine.cli.steptime import input_files
    unsupported = [flag for flag, given in (
        ("--sweep", args.sweep), ("--step-time", getattr(args, "step_time", None)),
        ("--roofline", getattr(args, "roofline", None)), ("--arrivals time", args.arrivals == "time"),
        ("--policy", args.policy), ("--slo", getattr(args, "slo", None)), ("--plot", getattr(args, "plot", None)))
        if given]
    if unsupported:
        raise TraceError(f"{unsupported[0]} is not supported on a trace of vLLM's scheduler yet "
                         f"(replay, --state, --set and --record are)")
    with TraceReader(args.trace) as reader:
        header = reader.header
    overrides = vllm_overrides(args, header.config)
    if args.state is not None:
        if overrides or args.record or args.json:
            raise TraceError("--state shows the recorded state; it does not combine with --set, --record or --json")
        return cli_replay.show_state(args.trace, args.state)
    if not (overrides or args.record):
        from tracengine.vllm.replay import reexecute
        return cli_replay.run_replay(args.trace, args.json, replayer=reexecute)
    check_outputs({"--record": args.record}, input_files(args), args.force)
    with TraceReader(args.trace) as reader:
        events = list(reader.events())
        note_torn_tail(reader)
    from tracengine.vllm.whatif import whatif
    return cli_replay.print_whatif(args.trace, whatif(events, overrides), args.record, args.json)


def vllm_overrides(args, config: dict) -> dict:
    """The fields the user gave (--set NAME=VALUE, or an engine flag that is a vLLM field), typed
    as the recorded value is."""
    from tracengine.cli.flags import flag_fields
    from tracengine.vllm.build import settable_fields
    known = settable_fields()
    given = {}
    for name in flag_fields():
        value = getattr(args, name, None)
        if value is not None:
            field = FLAG_ALIASES.get(name, name)
            if field not in known:
                raise ConfigError(f"--{name.replace('_', '-')} is not a field of vLLM's scheduler; known: "
                                  f"{', '.join(known)}")
            given[field] = value
    for text in args.set:
        name, sep, raw = text.partition("=")
        name = FLAG_ALIASES.get(name.strip().replace("-", "_"), name.strip().replace("-", "_"))
        if not sep:
            raise ConfigError(f"expected NAME=VALUE, got {text!r}")
        if name not in known:
            raise ConfigError(f"unknown vLLM config field {name!r}; known: {', '.join(known)}")
        if name in given:
            raise ConfigError(f"{name} is given twice (as a flag and in --set, or twice in --set)")
        given[name] = typed(name, raw.strip(), config.get(name))
    return given


def typed(name: str, raw: str, recorded):
    """`raw` as the type of the recorded value (a number, a bool, a string; "none" for None)."""
    if raw.lower() == "none":
        return None
    kinds = [type(recorded)] if recorded is not None else [int, float, str]
    for kind in kinds:
        try:
            if kind is bool:
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                return raw.lower() in ("true", "1", "yes")
            return kind(raw)
        except ValueError:
            continue
    raise ConfigError(f"{name} expects {type(recorded).__name__}, got {raw!r}")


def run_simulate(args) -> int:
    """`tracengine simulate WORKLOAD --scheduler vllm`: vllm/simulate.py, printed as simulate prints."""
    import time

    from tracengine.analysis.stats import render, stats
    from tracengine.cli.common import print_table
    from tracengine.cli.outputs import check_outputs
    from tracengine.cli.simulate import DEFAULT_VOCAB_SIZE, workload_for_simulation
    from tracengine.cli.steptime import describe_step_time, input_files, step_time_from_args
    from tracengine.errors import TracengineError
    from tracengine.sim.engine import check_token_prompts
    from tracengine.trace.events import ListSink
    from tracengine.vllm.build import default_config
    from tracengine.vllm.simulate import header, simulate
    if args.workload_file and args.workload:
        raise TracengineError("give the workload file once: as WORKLOAD or as --workload")
    if args.sweep:
        raise TracengineError("--sweep is not supported with --scheduler vllm yet")
    step_time = step_time_from_args(args)
    if step_time is None:
        raise TracengineError("simulate needs step times: --step-time FILE (tracengine calibrate) or --roofline CONFIG")
    base = default_config()
    overrides = vllm_overrides(args, base)
    if "num_gpu_blocks" not in overrides:
        raise TracengineError("simulate --scheduler vllm needs num_gpu_blocks (--set num_gpu_blocks=N or "
                              "--num-kvcache-blocks N): a simulation has no device to size the cache")
    config = {**base, **overrides, "scheduler_kind": "sync"}
    check_outputs({"--record": args.record}, input_files(args), args.force)
    vocab_size = args.vocab_size or (step_time.model.vocab_size if step_time.kind == "roofline" else DEFAULT_VOCAB_SIZE)
    requests = workload_for_simulation(args, args.workload_file or args.workload, vocab_size)
    check_token_prompts(requests)
    head = header(config, step_time)
    sink = ListSink()
    wall, cpu = time.perf_counter(), time.process_time()
    simulate(config, requests, step_time, sink)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    events = [head] + sink.events
    if args.record:
        from tracengine.trace.tracelog import write_trace
        write_trace(args.record, events)
    s = stats(events)
    print(f"simulated {len(requests):,} requests through vLLM {head.engine_version}'s scheduler with "
          f"{describe_step_time(step_time)}: {s['steps']['num_steps']:,} steps in {wall:.2f} s wall, {cpu:.2f} s CPU")
    print_table(render(s, title="simulated run"))
    if args.record:
        print(f"wrote {args.record}")
    return 0
