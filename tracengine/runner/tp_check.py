"""The tensor-parallel layouts a model and a machine can run, checked before
any worker process starts, so a bad one is one line."""
import torch
import torch.distributed as dist

from tracengine.engine.config import Config
from tracengine.errors import ConfigError


def check_tensor_parallel(config: Config, hf_config, device: torch.device):
    """Refuse, in one line, a layout this model or machine cannot run."""
    size = config.tensor_parallel_size
    if size == 1:
        return
    name = f"tensor_parallel_size={size}"
    num_heads, num_kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    if num_heads % size:
        raise ConfigError(f"{name} does not divide the model's {num_heads} attention heads")
    if num_kv_heads % size and size % num_kv_heads:
        raise ConfigError(f"{name} and the model's {num_kv_heads} KV heads divide neither way "
                          f"(each rank needs whole KV heads, or a KV head replicated over whole ranks)")
    # A MoE model splits each expert's intermediate features like a dense MLP's.
    for what in ("intermediate_size", "moe_intermediate_size", "vocab_size"):
        if getattr(hf_config, what, None) and getattr(hf_config, what) % size:
            raise ConfigError(f"{name} does not divide the model's {what} {getattr(hf_config, what)}")
    if not dist.is_available():
        raise ConfigError(f"{name} needs torch.distributed, which this torch build lacks")
    if device.type == "cuda":
        first, count = device.index or 0, torch.cuda.device_count()
        if first + size > count:
            raise ConfigError(f"{name} on {device} needs CUDA devices {first}..{first + size - 1}, "
                              f"but {count} exist")
        if not dist.is_nccl_available():
            raise ConfigError(f"{name} on CUDA needs NCCL, which this torch build lacks")
    elif device.type != "cpu":
        raise ConfigError(f"{name} runs on the CPU or CUDA, not {device}")
    elif not dist.is_gloo_available():
        raise ConfigError(f"{name} on the CPU needs gloo, which this torch build lacks")
