"""The architectures tracengine runs, keyed by the `architectures` a
checkpoint's config.json names (as vLLM dispatches), and the checks a
checkpoint's config must pass before a model is built. Each model class
declares how checkpoint names map onto its parameters
(`packed_modules_mapping`), so the loader stays generic."""
from tracengine.errors import ConfigError, ModelError

# architecture -> (module under tracengine.model, class): imported when built.
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
}
# A config.json without `architectures`: its model_type names one.
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def architecture_of(config) -> str:
    """The architecture a config names (an object with attributes, or the
    config.json dict), checked: ModelError names it and the supported ones."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    architectures = get("architectures") or []
    model_type = get("model_type")
    name = architectures[0] if architectures else MODEL_TYPES.get(model_type, f"model_type {model_type!r}")
    if name not in ARCHITECTURES:
        raise ModelError(f"unsupported architecture {name}; supported: {', '.join(ARCHITECTURES)}")
    return name


def model_class(hf_config) -> type:
    import importlib
    module, cls = ARCHITECTURES[architecture_of(hf_config)]
    return getattr(importlib.import_module(f"tracengine.model.{module}"), cls)


def check_model_config(hf_config, path: str):
    """Refuse, in one line, what the models here do not implement."""
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ModelError(f"hidden_act {hf_config.hidden_act!r} in {path} is not supported; only silu")
    if getattr(hf_config, "mlp_bias", False):
        raise ModelError(f"mlp_bias in {path} is not supported")


def sliding_window_of(hf_config) -> int | None:
    """The attention window the reference applies in some layer, if any:
    Mistral's `sliding_window`; Qwen's only where `layer_types` (transformers 5)
    names a sliding layer, or else with `use_sliding_window`."""
    window = getattr(hf_config, "sliding_window", None)
    layer_types = getattr(hf_config, "layer_types", None)
    if isinstance(layer_types, list):
        return window if "sliding_attention" in layer_types else None
    if hasattr(hf_config, "use_sliding_window") and not hf_config.use_sliding_window:
        return None
    return window


def check_max_model_len(hf_config, max_model_len: int):
    """Sliding-window attention is not implemented: a window at least as long
    as every sequence (max_model_len) is full causal attention, anything
    shorter is refused."""
    window = sliding_window_of(hf_config)
    if window is not None and window < max_model_len:
        raise ConfigError(f"max_model_len={max_model_len} is longer than the model's sliding window of {window} "
                          f"tokens, and sliding-window attention is not implemented; set max_model_len to at "
                          f"most {window}")
