"""Hugging Face checkpoint directories: find, validate, configure, load.

The weight loader is generic: the model's `packed_modules_mapping` routes
checkpoint names to fused parameters and each parameter's `weight_loader`
cuts its piece. Loaders get safetensors slices, not tensors, so a
tensor-parallel rank reads only the rows or columns of its own shard.
Whatever a user can get wrong about a directory raises ModelError with a
one-line message naming the directory."""
import os
from glob import glob

import torch
from safetensors import safe_open
from torch import nn

from tracengine.errors import ModelError
from tracengine.jsonfile import load_json_object
from tracengine.model import EMBEDDED_MODEL_DIR
from tracengine.model.layers import rope_parameters_of
from tracengine.model.linear import default_weight_loader
from tracengine.model.registry import architecture_of, check_model_config

# Buffers that some checkpoints carry but the model derives from its config.
IGNORED_WEIGHT_SUFFIXES = ("rotary_emb.inv_freq",)


def resolve_model_dir(model: str) -> str:
    """Config.model as a directory: "" names the embedded tiny model; a path that
    does not exist and reads as a Hugging Face id (`Qwen/Qwen3-0.6B`) is looked up
    in the local Hugging Face cache. Nothing is downloaded."""
    if not model:
        return EMBEDDED_MODEL_DIR
    path = os.path.abspath(os.path.expanduser(model))
    if os.path.exists(path) or not is_hub_id(model):
        return path
    return cached_snapshot(model)


def is_hub_id(model: str) -> bool:
    """`name` or `org/name` of letters, digits and -_. (what the Hub allows)."""
    parts = model.split("/")
    return (len(parts) <= 2 and not model.startswith((".", "~")) and
            all(p and p not in (".", "..") and all(c.isalnum() or c in "-_." for c in p) for p in parts))


def hub_cache_dir() -> str:
    """Where huggingface_hub keeps downloads, by its own environment variables."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return os.path.expanduser(os.environ[name])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def cached_snapshot(model_id: str) -> str:
    """The snapshot directory of `model_id` in the local cache: the revision
    refs/main names, else the only one there."""
    cache = hub_cache_dir()
    repo = os.path.join(cache, "models--" + model_id.replace("/", "--"))
    snapshots = os.path.join(repo, "snapshots")
    revisions = sorted(os.listdir(snapshots)) if os.path.isdir(snapshots) else []
    if not revisions:
        raise ModelError(f"model {model_id!r} is neither a directory nor in the Hugging Face cache {cache} "
                         f"(nothing is downloaded: fetch it with `huggingface-cli download {model_id}`)")
    try:
        with open(os.path.join(repo, "refs", "main"), encoding="utf-8") as f:
            revision = f.read().strip()
    except OSError:
        revision = ""
    if revision in revisions:
        return os.path.join(snapshots, revision)
    if len(revisions) == 1:
        return os.path.join(snapshots, revisions[0])
    raise ModelError(f"model {model_id!r} has {len(revisions)} snapshots in {snapshots} and no refs/main; "
                     f"give the directory of one")


def weight_files(path: str) -> list[str]:
    return sorted(glob(os.path.join(path, "*.safetensors")))


def load_hf_config(path: str):
    """The transformers config of a checkpoint directory of a supported
    architecture (registry.py), checked first so that a bad directory fails
    with one line rather than a traceback."""
    if not os.path.isdir(path):
        raise ModelError(f"model directory not found: {path}")
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ModelError(f"no config.json in model directory {path}")
    raw = load_json_object(config_file, "a model config", ModelError)
    try:
        architecture_of(raw)
    except ModelError as e:
        raise ModelError(f"{e} (in {path})") from None
    if not weight_files(path):
        raise ModelError(f"no *.safetensors weights in model directory {path}")

    from transformers import AutoConfig
    try:
        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"cannot read config.json in {path}: {first_line}") from None
    check_model_config(hf_config, path)
    rope_parameters_of(hf_config)   # raises for rope types not implemented
    return hf_config


def checkpoint_dtype(hf_config) -> torch.dtype | None:
    """The dtype the checkpoint was saved in, if the config says."""
    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _target(name: str, mapping: dict) -> tuple[str, object]:
    """Checkpoint name -> (parameter name, shard id or None). Matched on whole
    name components, so "up_proj" never matches inside "gate_up_proj"."""
    parts = name.split(".")
    for checkpoint_name, (packed_name, shard_id) in mapping.items():
        if checkpoint_name in parts:
            parts[parts.index(checkpoint_name)] = packed_name
            return ".".join(parts), shard_id
    return name, None


def _expected_shards(param_name: str, mapping: dict) -> set:
    parts = param_name.split(".")
    shards = {shard_id for packed_name, shard_id in mapping.values() if packed_name in parts}
    return shards or {None}


@torch.inference_mode()
def load_model(model: nn.Module, path: str):
    """Load every *.safetensors in `path` into `model`. Every parameter must
    be filled and every checkpoint tensor must have a home. A sharded model
    (built under `tp_layout`) reads only its shards."""
    mapping = getattr(model, "packed_modules_mapping", {})
    files = weight_files(path)
    if not files:
        raise ModelError(f"no *.safetensors weights in model directory {path}")
    loaded: dict[int, set] = {}   # id(param) -> shard ids filled (None: the whole tensor)
    for file in files:
        with safe_open(file, "pt", "cpu") as f:
            for name in f.keys():
                if name.endswith(IGNORED_WEIGHT_SUFFIXES):
                    continue
                target, shard_id = _target(name, mapping)
                try:
                    param = model.get_parameter(target)
                except AttributeError:
                    raise ModelError(f"weight {name!r} in {file} matches no parameter of "
                                     f"{type(model).__name__}") from None
                weight_loader = getattr(param, "weight_loader", default_weight_loader)
                try:
                    if shard_id is None:
                        weight_loader(param, f.get_slice(name))
                    else:
                        weight_loader(param, f.get_slice(name), shard_id)
                except ModelError as e:
                    raise ModelError(f"weight {name!r} in {file}: {e}") from None
                loaded.setdefault(id(param), set()).add(shard_id)
    # named_parameters() lists a tied lm_head once, under the embedding's name;
    # a fused parameter is complete only when each of its shards was loaded.
    missing = [name for name, param in model.named_parameters()
               if not _expected_shards(name, mapping) <= loaded.get(id(param), set())]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ModelError(f"checkpoint in {path} has no weight for {missing[0]}{more}")
