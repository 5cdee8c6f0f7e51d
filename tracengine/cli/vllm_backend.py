"""`tracengine replay` on a trace of vLLM's own scheduler: re-execution through
vLLM's scheduler, `--state`, and the what-if in steps or in simulated time
(`--set` any field of the header's config: vLLM's scheduler and cache fields,
`num_gpu_blocks`, `scheduler_kind`), one run or a sweep; and `simulate
--scheduler vllm`. The output is the one `replay` and `simulate` print for
tracengine's traces and workloads (cli/replay.py, cli/simulate.py)."""
from tracengine.errors import ConfigError

# tracengine's engine flags that name a vLLM field under another name
FLAG_ALIASES = {"kvcache_block_size": "block_size", "num_kvcache_blocks": "num_gpu_blocks"}


def run_replay(args) -> int:
    """As cli/replay.run, with vLLM's scheduler (cli/scheduler_backend.py)."""
    from tracengine.cli.scheduler_backend import run_scheduler_replay
    from tracengine.replay.scheduler_backends import VLLM
    return run_scheduler_replay(args, VLLM, vllm_overrides, parsed_field,
                                "--set policy=priority for vLLM's priority policy")


def vllm_overrides(args, config: dict) -> dict:
    """The fields the user gave (--set NAME=VALUE, or an engine flag that is a vLLM field), typed
    as the recorded value is."""
    from tracengine.cli.flags import flag_fields
    from tracengine.vllm.build import settable_fields
    given = {}
    for name in flag_fields():
        value = getattr(args, name, None)
        if value is not None:
            field = FLAG_ALIASES.get(name, name)
            if field not in settable_fields():
                raise ConfigError(f"--{name.replace('_', '-')} is not a field of vLLM's scheduler; known: "
                                  f"{', '.join(settable_fields())}")
            given[field] = value
    from tracengine.cli.scheduler_backend import set_fields
    return set_fields(args.set, config, parsed_field, given)


def parsed_field(text: str, config: dict) -> tuple[str, object]:
    """`NAME=VALUE` (--set, --sweep's values) as a vLLM field and its value, typed as `config` has it."""
    from tracengine.cli.scheduler_backend import parsed_field as field_of
    from tracengine.vllm.build import settable_fields
    return field_of(text, config, "vLLM", settable_fields(), FLAG_ALIASES)


def run_simulate(args) -> int:
    """`tracengine simulate WORKLOAD --scheduler vllm`: vllm/simulate.py, printed as simulate prints;
    a --sweep's variants through vLLM's scheduler (replay/scheduler_backends.VLLM)."""
    from tracengine.cli.steptime import step_time_from_args
    from tracengine.cli.sweeps import sweep_options
    from tracengine.errors import TracengineError
    from tracengine.vllm import require_vllm
    from tracengine.vllm.build import default_config
    from tracengine.vllm.simulate import simulate
    require_vllm("simulate --scheduler vllm runs vLLM's scheduler")
    if args.workload_file and args.workload:
        raise TracengineError("give the workload file once: as WORKLOAD or as --workload")
    if args.search:
        raise TracengineError("--search is not supported with --scheduler vllm yet (--sweep is)")
    base = default_config()
    overrides = vllm_overrides(args, base)
    variants, slo = sweep_options(args, overrides, parse=lambda text: parsed_field(text, base))
    step_time = step_time_from_args(args)
    if step_time is None:
        raise TracengineError("simulate needs step times: --step-time FILE (tracengine calibrate) or --roofline CONFIG")
    if "num_gpu_blocks" not in overrides and not (variants and "num_gpu_blocks" in variants[0]):
        raise TracengineError("simulate --scheduler vllm needs num_gpu_blocks (--set num_gpu_blocks=N or "
                              "--num-kvcache-blocks N): a simulation has no device to size the cache")
    from tracengine.cli.scheduler_backend import simulate_through_scheduler
    from tracengine.replay.scheduler_backends import VLLM
    return simulate_through_scheduler(args, "vLLM", {**base, **overrides}, variants, slo, step_time, simulate,
                                      VLLM.SIMULATE)
