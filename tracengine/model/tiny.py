"""Tiny random checkpoints of every architecture in the registry, written
with transformers' own config and model classes (nothing downloaded), in
Hugging Face's layout, with the embedded model's tokenizer: what the tests
and benchmarks check each architecture on. Each one names its architecture
in config.json as a real checkpoint does."""
import os
import shutil

from tracengine.model import EMBEDDED_MODEL_DIR

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# Shared by all: the embedded tokenizer's vocabulary, 4 query heads over 2 KV heads (GQA).
SHAPE = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
             bos_token_id=0, eos_token_id=0, pad_token_id=0, initializer_range=0.1)
# architecture -> (transformers config class, what sets it apart). The larger initializer_range than
# the usual 0.02 spreads the logits, so that greedy argmaxes are not near-ties.
TINY = {
    "LlamaForCausalLM": ("LlamaConfig", dict(
        tie_word_embeddings=False,
        # Llama 3's scaling, with an original context short enough that all three bands occur at head_dim 16.
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "MistralForCausalLM": ("MistralConfig", dict(tie_word_embeddings=False, sliding_window=512,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "Qwen2ForCausalLM": ("Qwen2Config", dict(tie_word_embeddings=True,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "Qwen3ForCausalLM": ("Qwen3Config", dict(tie_word_embeddings=False, attention_bias=True,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Layer 0 sparse (4 experts, top 2, renormalised), layer 1 a dense MLP.
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", dict(tie_word_embeddings=True, num_experts=4, num_experts_per_tok=2,
                                                   moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1],
                                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}


def tiny_hf_config(architecture: str, **changes):
    import transformers
    config_class, extra = TINY[architecture]
    config = getattr(transformers, config_class)(**{**SHAPE, **extra, **changes})
    config.architectures = [architecture]
    return config


def write_tiny_checkpoint(path: str, architecture: str, seed: int = 0, **changes) -> str:
    """A random float32 checkpoint of `architecture` in `path` (created); returns `path`."""
    import torch
    import transformers
    config = tiny_hf_config(architecture, **changes)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config)
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:   # the engine loads a tokenizer; the checks' prompts are token ids
        shutil.copy(os.path.join(EMBEDDED_MODEL_DIR, name), path)
    return path
