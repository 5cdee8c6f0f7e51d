"""What a trace header records of a vLLM scheduler: the flat config (every scalar field of
vLLM's SchedulerConfig, the CacheConfig fields that decide scheduling, `max_model_len`, the KV
cache's one full-attention group: `num_gpu_blocks`, `num_kv_heads`, `head_size`, `kv_dtype`, and
`scheduler_kind`, "sync" for Scheduler, "async" for AsyncScheduler), and the header itself.
The recorder writes it; build.py rebuilds a scheduler from it."""
import dataclasses
import os

from tracengine.vllm.connector import connector_config
from tracengine.vllm.kv_groups import groups_config
from tracengine.vllm.offloading import offloading_fields
from tracengine.vllm.spec import dynamic_fields
from tracengine.vllm.synthetic import header_fields as synthetic_header_fields

# CacheConfig fields that decide scheduling (block size and count, the prefix cache)
CACHE_FIELDS = ("block_size", "enable_prefix_caching", "prefix_caching_hash_algo", "sliding_window")
KV_FIELDS = ("num_kv_heads", "head_size", "kv_dtype")
# a LoRA config's fields, in a header only where LoRA is on (max_loras: adapters in one batch)
LORA_FIELDS = ("max_loras", "max_cpu_loras", "max_lora_rank")
# a speculative config's fields (header name -> SpeculativeConfig's), in a header only where drafts are on
SPEC_FIELDS = {"speculative_method": "method", "num_speculative_tokens": "num_speculative_tokens",
               "prompt_lookup_min": "prompt_lookup_min", "prompt_lookup_max": "prompt_lookup_max"}

# SchedulerConfig fields that name code or are vLLM's own bookkeeping, not a scheduling value;
# and disable_hybrid_kv_cache_manager, which vLLM resolves from the platform and the KV cache
# groups (a server's resolution, given back, is refused where the platform differs) and which
# changes nothing with the one full-attention group tracengine records
_SKIPPED_SCHEDULER_FIELDS = ("scheduler_cls", "is_multimodal_model", "runner_type", "disable_hybrid_kv_cache_manager")
_SCALARS = (str, int, float, bool, type(None))


def scheduler_field_names() -> list[str]:
    from vllm.config import SchedulerConfig
    # a pydantic field declared init=False keeps it on its FieldInfo, not on the dataclass field
    return [f.name for f in dataclasses.fields(SchedulerConfig)
            if f.init and getattr(f.default, "init", None) is not False
            and f.name not in _SKIPPED_SCHEDULER_FIELDS and not f.name.startswith("_")]


def header_config(scheduler) -> dict:
    """The flat config a trace header records for a running vLLM scheduler."""
    vllm_config = scheduler.vllm_config
    config: dict = {}
    for name in scheduler_field_names():
        value = getattr(vllm_config.scheduler_config, name)
        if isinstance(value, _SCALARS):
            config[name] = value
    for name in CACHE_FIELDS:
        config[name] = getattr(vllm_config.cache_config, name)
    config["max_model_len"] = vllm_config.model_config.max_model_len
    # the first KV cache group (features.py refuses others, or the header names them not recorded)
    spec = scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    config["num_gpu_blocks"] = scheduler.kv_cache_config.num_blocks
    config["num_kv_heads"] = getattr(spec, "num_kv_heads", 0)
    config["head_size"] = getattr(spec, "head_size", 0)
    config["kv_dtype"] = str(spec.dtype).removeprefix("torch.")
    config["scheduler_kind"] = "async" if _is_async(type(scheduler)) else "sync"
    spec = vllm_config.speculative_config
    if spec is not None:      # (features.py refuses a method a trace does not hold)
        config.update({name: getattr(spec, attribute) for name, attribute in SPEC_FIELDS.items()})
        config.update(synthetic_header_fields(spec))
        config.update(dynamic_fields(spec))
        if config["max_num_scheduled_tokens"] == config["max_num_batched_tokens"]:
            config["max_num_scheduled_tokens"] = None     # vLLM's default with drafts: the budget's, whatever it is
    if vllm_config.lora_config is not None:
        config.update({name: getattr(vllm_config.lora_config, name) for name in LORA_FIELDS})
    config.update(connector_config(scheduler))
    config.update(offloading_fields(scheduler))
    config.update(groups_config(scheduler.kv_cache_config))
    return config


def _is_async(cls) -> bool:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    return issubclass(cls, AsyncScheduler)


def trace_header(scheduler, not_recorded=()):
    """The TraceHeader of a recording of `scheduler`: engine "vllm", its version, its config, and
    what it does not hold (`not_recorded`: features.py's, where the user records anyway)."""
    import platform
    import time

    import torch
    import vllm

    from tracengine.trace.events import ModelInfo, TraceHeader
    from tracengine.trace.tracelog import FORMAT_VERSION
    from tracengine.version import __version__
    model_config = scheduler.vllm_config.model_config
    architectures = getattr(model_config.hf_config, "architectures", None) or ["unknown"]
    model = ModelInfo(os.path.basename(str(model_config.model)) if scheduler_is_stub(model_config) else
                      str(model_config.model), str(model_config.dtype).removeprefix("torch."), architectures[0])
    return TraceHeader(FORMAT_VERSION, __version__, header_config(scheduler), model,
                       str(scheduler.vllm_config.device_config.device_type or platform.machine()), str(torch.__version__),
                       model_config.seed if model_config.seed is not None else 0, time.time(),
                       scheduler.vllm_config.parallel_config.tensor_parallel_size, engine="vllm",
                       engine_version=vllm.__version__, not_recorded=list(not_recorded))


def scheduler_is_stub(model_config) -> bool:
    """A scheduler built here (replay, simulation): its model is a temporary folder."""
    return os.path.basename(str(model_config.model)).startswith("tracengine-vllm-")

