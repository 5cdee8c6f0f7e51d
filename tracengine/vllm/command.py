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
