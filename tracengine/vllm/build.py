"""vLLM's V1 scheduler built from flat data: the config fields a trace header
records (header.py's `header_config`) and the scheduler they rebuild (`build_scheduler`),
with its real KVCacheManager, block pool and prefix cache, on any machine:
the device is "cpu", the model a folder holding only a config.json.

The header's config is flat (scalars, as a TraceHeader holds it): every
scalar field of vLLM's SchedulerConfig, the CacheConfig fields that decide
scheduling, `max_model_len`, the KV cache's one full-attention group
(`num_gpu_blocks`, `num_kv_heads`, `head_size`, `kv_dtype`), and
`scheduler_kind` ("sync" for Scheduler, "async" for AsyncScheduler)."""
import json
import os
import tempfile

from tracengine.errors import ConfigError
from tracengine.vllm.connector import standin_transfer_config
from tracengine.vllm.kv_groups import recorded_groups
from tracengine.vllm.header import CACHE_FIELDS, LORA_FIELDS, SPEC_FIELDS, scheduler_field_names
from tracengine.vllm.offloading import OFFLOADING_FIELDS, is_native_offloading, offloading_transfer_config
from tracengine.vllm.spec import DYNAMIC_FIELD, dynamic_options
from tracengine.vllm.synthetic import SYNTHETIC_FIELDS, synthetic_options


def settable_fields() -> list[str]:
    """The names `replay --set` and `simulate --scheduler vllm` accept for a vLLM trace."""
    return scheduler_field_names() + list(CACHE_FIELDS) + ["max_model_len", "num_gpu_blocks", "scheduler_kind"] + \
        list(SPEC_FIELDS) + list(SYNTHETIC_FIELDS) + list(LORA_FIELDS) + [DYNAMIC_FIELD] + list(OFFLOADING_FIELDS)


def default_config(**overrides) -> dict:
    """A small vLLM config in the header's terms (tests, `simulate --scheduler vllm`)."""
    config = {"max_num_batched_tokens": 2048, "max_num_seqs": 128, "enable_chunked_prefill": True,
              "policy": "fcfs", "long_prefill_token_threshold": 0, "block_size": 16,
              "enable_prefix_caching": True, "prefix_caching_hash_algo": "sha256", "sliding_window": None,
              "max_model_len": 4096, "num_gpu_blocks": 1024, "num_kv_heads": 2, "head_size": 64,
              "kv_dtype": "float32", "scheduler_kind": "sync"}
    return apply_overrides(config, overrides)


def apply_overrides(config: dict, overrides: dict) -> dict:
    unknown = sorted(set(overrides) - set(settable_fields()))
    if unknown:
        raise ConfigError(f"unknown vLLM config field {unknown[0]!r}; known: {', '.join(settable_fields())}")
    return {**config, **overrides}


def build_scheduler(config: dict, scheduler_cls=None, record: str = "", vllm_options=None, kv_cache_groups=None,
                    additional_config: dict | None = None, model_options: dict | None = None,
                    speculative: dict | None = None, cache_options: dict | None = None, live_offloading: bool = False):
    """vLLM's scheduler for a header's `config`: `scheduler_cls` (a Scheduler subclass), or
    the recording class of the recorded kind, recording to `record` if given as vLLM's
    engine core would have it (else not until `record_to`; $TRACENGINE_RECORD is not read).
    `vllm_options(model_config)`: more VllmConfig fields (a test's features, which a header does
    not rebuild); `kv_cache_groups(spec)`: the KV cache's groups in place of the one `spec`;
    `additional_config`: more of "tracengine"'s options; `model_options`: more ModelConfig fields;
    `speculative`: a SpeculativeConfig's fields (method, num_speculative_tokens, ...), for the
    comparison of speculative decoding with tracengine's (compare.py); `cache_options`: more
    CacheConfig fields (a test's native KV offloading, `kv_offloading_size`); `live_offloading`: the
    config's native CPU offloading by vLLM's own connector (offloading.py; a run in simulated
    time), not the recorded answers' stand-in. Raises ConfigError for a value vLLM refuses."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    if scheduler_cls is None:
        from tracengine.vllm.recorder import recording_classes
        kind = "RecordingAsyncScheduler" if config.get("scheduler_kind") == "async" else "RecordingScheduler"
        scheduler_cls = recording_classes()[kind]
    names = set(scheduler_field_names())
    block_size = config["block_size"]
    try:
        with tempfile.TemporaryDirectory(prefix="tracengine-vllm-") as model_dir:
            write_model_config(model_dir, config)
            model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True,
                                       max_model_len=config["max_model_len"], dtype="float32", seed=0,
                                       **(model_options or {}))
            scheduler_config = SchedulerConfig(
                max_model_len=config["max_model_len"], is_encoder_decoder=False,
                **{k: v for k, v in config.items() if k in names})
            cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=config["enable_prefix_caching"],
                                       prefix_caching_hash_algo=config["prefix_caching_hash_algo"],
                                       sliding_window=config.get("sliding_window"), **(cache_options or {}))
            cache_config.num_gpu_blocks = config["num_gpu_blocks"]
            options = vllm_options(model_config) if vllm_options is not None else {}
            if config.get("speculative_method") or config.get("num_speculative_tokens"):
                options["speculative_config"] = speculative_config(config, model_config)
            if speculative:
                from vllm.config import ParallelConfig, SpeculativeConfig
                options["speculative_config"] = SpeculativeConfig(
                    **speculative, target_model_config=model_config, target_parallel_config=ParallelConfig())
            if config.get("max_loras"):
                from vllm.config import LoRAConfig
                options["lora_config"] = LoRAConfig(**{name: config[name] for name in LORA_FIELDS})
            if "kv_transfer_config" in options:
                pass
            elif live_offloading and is_native_offloading(config):
                options["kv_transfer_config"] = offloading_transfer_config(config)
            elif config.get("kv_connector"):
                options["kv_transfer_config"] = standin_transfer_config(config)
            vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config,
                                     cache_config=cache_config, device_config=DeviceConfig(device="cpu"),
                                     additional_config={"tracengine": {"record": record, **(additional_config or {})}},
                                     **options)
    except (ValueError, TypeError) as exc:     # pydantic's ValidationError is a ValueError
        raise ConfigError(f"vLLM refuses the config: {_first_line(exc)}") from None
    kv_cache_groups = kv_cache_groups or recorded_groups(config)      # a hybrid model's, as recorded
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=config["num_kv_heads"],
                             head_size=config["head_size"], dtype=getattr(torch, config["kv_dtype"]))
    kv_cache_config = KVCacheConfig(num_blocks=config["num_gpu_blocks"], kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)] if kv_cache_groups is None
                                    else kv_cache_groups(spec))
    return scheduler_cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                         structured_output_manager=StructuredOutputManager(vllm_config),
                         block_size=block_size, log_stats=True)


def speculative_config(config: dict, model_config):
    """vLLM's SpeculativeConfig of a header's SPEC_FIELDS (drafts with no method named: ngram's, as
    a run without a model drafts) and its synthetic acceptance (synthetic.py)."""
    from vllm.config import ParallelConfig, SpeculativeConfig
    options = {attribute: config.get(name) for name, attribute in SPEC_FIELDS.items()}
    options["method"] = options["method"] or "ngram"
    return SpeculativeConfig(target_model_config=model_config, target_parallel_config=ParallelConfig(),
                             **options, **synthetic_options(config), **dynamic_options(config))


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def write_model_config(model_dir: str, config: dict) -> None:
    """A tiny Llama architecture: the scheduler reads only lengths from the model."""
    hf_config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
                 "intermediate_size": 256, "num_attention_heads": 4, "num_hidden_layers": 1,
                 "num_key_value_heads": config["num_kv_heads"], "head_dim": config["head_size"],
                 "vocab_size": 32000, "max_position_embeddings": config["max_model_len"],
                 "torch_dtype": "float32"}
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(hf_config, f)

