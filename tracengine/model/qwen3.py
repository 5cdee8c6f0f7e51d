"""Qwen3ForCausalLM: Llama's decoder with a per-head RMSNorm of q and k and
`attention_bias` on the q/k/v and o projections."""
from tracengine.model.decoder import DecoderForCausalLM, SelfAttention


class Qwen3ForCausalLM(DecoderForCausalLM):

    def make_attention(self, hf_config) -> SelfAttention:
        bias = getattr(hf_config, "attention_bias", False)
        return SelfAttention(hf_config, qkv_bias=bias, o_bias=bias, qk_norm=True)
