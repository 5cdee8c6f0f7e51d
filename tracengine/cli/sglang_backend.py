"""`tracengine replay` on a trace of SGLang's own scheduler: re-execution through SGLang's real
scheduler (tracengine/sglang/replay.py), and the what-if in steps or in simulated time (`--set`
any of the header's SGLang fields: chunked_prefill_size, max_total_tokens, max_running_requests,
schedule_policy, schedule_conservativeness, ...), one run or a sweep; and `simulate --scheduler
sglang`. The output is the one `replay` and `simulate` print for tracengine's traces and
workloads."""
import functools

from tracengine.errors import ConfigError


def run_replay(args) -> int:
    """As cli/replay.run, with SGLang's scheduler (cli/scheduler_backend.py)."""
    from tracengine.cli.scheduler_backend import run_scheduler_replay
    from tracengine.replay.scheduler_backends import SGLANG
    return run_scheduler_replay(args, SGLANG, lambda args, config: sglang_overrides(args.set, config), parsed_field,
                                "--set schedule_policy=lpm for SGLang's")


def sglang_overrides(texts, config: dict) -> dict:
    """--set NAME=VALUE as SGLang fields, typed as the recorded value is."""
    from tracengine.cli.scheduler_backend import set_fields
    return set_fields(texts, config, parsed_field)


def parsed_field(text: str, config: dict) -> tuple[str, object]:
    """`NAME=VALUE` (--set, --sweep's values) as an SGLang field and its value, typed as `config` has it."""
    from tracengine.cli.scheduler_backend import parsed_field as field_of
    from tracengine.sglang.build import settable_fields
    return field_of(text, config, "SGLang", settable_fields())


def run_simulate(args) -> int:
    """`tracengine simulate WORKLOAD --scheduler sglang`: sglang/simulate.py, printed as simulate
    prints; a --sweep's variants through SGLang's scheduler (replay/scheduler_backends.SGLANG)."""
    from tracengine.cli.steptime import step_time_from_args
    from tracengine.cli.sweeps import sweep_options
    from tracengine.errors import TracengineError
    from tracengine.sglang import require_sglang
    from tracengine.sglang.build import default_config
    from tracengine.sglang.simulate import simulate
    require_sglang("simulate --scheduler sglang runs SGLang's scheduler")
    if args.workload_file and args.workload:
        raise TracengineError("give the workload file once: as WORKLOAD or as --workload")
    from tracengine.cli.search import check_search_flags
    check_search_flags(args)
    from tracengine.cli.flags import flag_fields
    flags = [name for name in flag_fields() if getattr(args, name, None) is not None]
    if flags:
        raise ConfigError(f"--{flags[0].replace('_', '-')} is tracengine's engine's; SGLang's scheduler takes "
                          "--set NAME=VALUE (max_total_tokens, chunked_prefill_size, ...)")
    base = default_config()
    overrides = sglang_overrides(args.set, base)
    parse = functools.partial(parsed_field, config=base)
    if args.search:     # its flags are checked by cli/search.run_search, once the workload is read
        from tracengine.cli.sweeps import check_executor_flags
        check_executor_flags(args, True)
        variants, slo = None, None
    else:
        variants, slo = sweep_options(args, overrides, parse=parse)
    step_time = step_time_from_args(args)
    if step_time is None:
        raise TracengineError("simulate needs step times: --step-time FILE (tracengine calibrate) or --roofline CONFIG")
    from tracengine.cli.scheduler_backend import simulate_through_scheduler
    from tracengine.sglang.imports import scheduler_module
    # SGLang's import is not the simulation's time
    from tracengine.replay.scheduler_backends import SGLANG
    return simulate_through_scheduler(args, "SGLang", {**base, **overrides}, variants, slo, step_time, simulate,
                                      SGLANG.SIMULATE, before_run=scheduler_module,
                                      search=(overrides, parse) if args.search else None)
