"""A vLLM model's KV cache groups in a trace header: every group (full attention, sliding window,
Mamba, ... as vLLM 0.33's kv_cache_interface defines them) with its spec, so that a replay rebuilds
the scheduler's KV cache manager (vLLM's hybrid coordinator where there are several) as recorded.

The header's config is flat: the groups are one string, `kv_cache_groups` (JSON: per group its
spec's class and its fields, and its number of layers), present only for a model whose KV cache is
not the one full-attention group the other fields describe, so a one-group trace reads as before.

The block events of every group (each names its group) are group_blocks.py's."""
import dataclasses
import enum
import json
from fractions import Fraction


def _encode(value):
    import torch
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, enum.Enum):
        return {"enum": value.name}
    if isinstance(value, Fraction):
        return {"fraction": [value.numerator, value.denominator]}
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    return value


def _decode(value, default):
    import torch
    if isinstance(value, dict):
        if "dtype" in value:
            return getattr(torch, value["dtype"])
        if "enum" in value:
            return type(default)[value["enum"]]
        if "fraction" in value:
            return Fraction(*value["fraction"])
    if isinstance(value, list):
        return tuple(_decode(v, None) for v in value)
    return value


def groups_config(kv_cache_config) -> dict:
    """The header's `kv_cache_groups` ({} for the one full-attention group)."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) == 1 and type(groups[0].kv_cache_spec).__name__ == "FullAttentionSpec":
        return {}
    described = []
    for group in groups:
        spec = group.kv_cache_spec
        fields = {f.name: _encode(getattr(spec, f.name)) for f in dataclasses.fields(spec) if f.init}
        described.append({"spec": type(spec).__name__, "num_layers": len(group.layer_names), "fields": fields})
    return {"kv_cache_groups": json.dumps(described, separators=(",", ":"))}


def recorded_groups(config: dict):
    """build.py's `kv_cache_groups` for a header that records them; None: the one group."""
    if not config.get("kv_cache_groups"):
        return None
    from vllm.v1 import kv_cache_interface
    groups = []
    for i, described in enumerate(json.loads(config["kv_cache_groups"])):
        cls = getattr(kv_cache_interface, described["spec"])
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        spec = cls(**{name: _decode(value, defaults.get(name)) for name, value in described["fields"].items()})
        layers = [f"group{i}.layer{j}" for j in range(described["num_layers"])]
        groups.append(kv_cache_interface.KVCacheGroupSpec(layers, spec))
    return lambda spec: groups
