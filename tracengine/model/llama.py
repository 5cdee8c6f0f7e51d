"""LlamaForCausalLM (Llama 2 and 3.x, Llama 3's rope scaling in layers.py),
MistralForCausalLM (Llama's layers; its sliding window is checked against
max_model_len by the registry) and Qwen2ForCausalLM (a q/k/v bias)."""
from tracengine.model.decoder import DecoderForCausalLM, SelfAttention


class LlamaForCausalLM(DecoderForCausalLM):

    def make_attention(self, hf_config) -> SelfAttention:
        bias = getattr(hf_config, "attention_bias", False)
        return SelfAttention(hf_config, qkv_bias=bias, o_bias=bias)


class MistralForCausalLM(LlamaForCausalLM):
    pass


class Qwen2ForCausalLM(DecoderForCausalLM):

    def make_attention(self, hf_config) -> SelfAttention:
        return SelfAttention(hf_config, qkv_bias=True, o_bias=False)
