"""`tracengine replay` on a trace of SGLang's own scheduler: re-execution through SGLang's real
scheduler (tracengine/sglang/replay.py), and the what-if in steps (`--set` any of the header's
SGLang fields: chunked_prefill_size, max_total_tokens, max_running_requests, schedule_policy,
schedule_conservativeness, ...), printed as `replay` prints tracengine's."""
from tracengine.errors import ConfigError, TraceError
from tracengine.trace.tracelog import TraceReader


def run_replay(args) -> int:
    from tracengine.cli import replay_runs
    from tracengine.sglang.replay import check_sglang_version
    if args.policy:
        raise TraceError("--policy names a tracengine scheduling policy; an SGLang trace runs SGLang's scheduler "
                         "(--set schedule_policy=lpm for SGLang's)")
    unsupported = [flag for flag, given in (("--state", args.state is not None), ("--sweep", bool(args.sweep)),
                                            ("--step-time", getattr(args, "step_time", None) is not None),
                                            ("--roofline", getattr(args, "roofline", None) is not None))
                   if given]
    if unsupported:
        raise TraceError(f"{unsupported[0]} is not supported on an SGLang trace yet (re-execution and --set are)")
    with TraceReader(args.trace) as reader:
        header = reader.header
    check_sglang_version(header)
    overrides = sglang_overrides(args.set, header.config)
    if not (overrides or args.record):
        from tracengine.sglang.replay import reexecute
        return replay_runs.run_replay(args.trace, args.json, replayer=reexecute)
    from tracengine.cli.outputs import check_outputs
    check_outputs({"--record": args.record}, {"TRACE": args.trace}, args.force)
    with TraceReader(args.trace) as reader:
        events = list(reader.events())
    from tracengine.sglang.whatif import whatif
    return replay_runs.print_whatif(args.trace, whatif(events, overrides), args.record, args.json)


def sglang_overrides(texts, config: dict) -> dict:
    """--set NAME=VALUE as SGLang fields, typed as the recorded value is."""
    from tracengine.cli.vllm_backend import typed
    from tracengine.sglang.build import settable_fields
    given = {}
    for text in texts:
        name, sep, raw = text.partition("=")
        name = name.strip().replace("-", "_")
        if not sep:
            raise ConfigError(f"expected NAME=VALUE, got {text!r}")
        if name not in settable_fields():
            raise ConfigError(f"unknown SGLang config field {name!r}; known: {', '.join(settable_fields())}")
        if name in given:
            raise ConfigError(f"{name} is given twice in --set")
        given[name] = typed(name, raw.strip(), config.get(name))
    return given
