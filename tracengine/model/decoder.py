"""The decoder every architecture here shares (Llama's layout, which Mistral,
Qwen2, Qwen3 and Qwen3-MoE keep), in plain torch, on packed tokens: inputs
are flat [num_tokens] ids and positions of several sequences back to back,
and the per-forward Context tells attention where each sequence starts and
where its cache lives. An architecture (llama.py, qwen3.py, qwen3_moe.py)
is a subclass of DecoderForCausalLM that says how its attention and MLPs
are built. Parameter names follow Hugging Face's checkpoints, except the
fused projections named in `packed_modules_mapping`."""
import torch
from torch import nn

from tracengine.model.attention import Attention
from tracengine.model.context import get_context
from tracengine.model.layers import RMSNorm, RotaryEmbedding, SiluAndMul, apply_rotary, rms_norm, rope_parameters_of
from tracengine.model.linear import (MergedColumnParallelLinear, ParallelLMHead, QKVParallelLinear,
                                     RowParallelLinear, VocabParallelEmbedding, divide, get_tp_rank_size,
                                     local_num_kv_heads)


def head_dim_of(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


class SelfAttention(nn.Module):
    """Fused q/k/v projection, rotary embedding, attention, o projection.
    `qkv_bias`, `o_bias`: Llama and Qwen3 put `attention_bias` on both, Qwen2
    has a q/k/v bias and none on o. `qk_norm`: Qwen3's per-head RMSNorm of q
    and k, before the rotation."""

    def __init__(self, hf_config, qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False):
        super().__init__()
        _, tp_size = get_tp_rank_size()
        hidden_size = hf_config.hidden_size
        self.head_dim = head_dim_of(hf_config)
        self.num_heads = divide(hf_config.num_attention_heads, tp_size)
        self.num_kv_heads = local_num_kv_heads(hf_config.num_key_value_heads, tp_size)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(hidden_size, self.head_dim, hf_config.num_attention_heads,
                                          hf_config.num_key_value_heads, bias=qkv_bias)
        self.o_proj = RowParallelLinear(hf_config.num_attention_heads * self.head_dim, hidden_size, bias=o_bias)
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5, self.num_kv_heads)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=hf_config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=hf_config.rms_norm_eps)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
        """`rope`: the forward's RotaryEmbedding.cos_sin(positions)."""
        qkv = self.qkv_proj(hidden)
        num_tokens, qk_size = qkv.size(0), self.q_size + self.kv_size
        # q and k heads side by side: one rotation (and one normalisation) for
        # both, each head still normalised over its own head_dim with its own weight.
        qk = qkv[:, :qk_size].view(num_tokens, -1, self.head_dim)
        if self.qk_norm:
            qk = rms_norm(qk, None, self.q_norm.eps)
            qk[:, :self.num_heads].mul_(self.q_norm.weight)
            qk[:, self.num_heads:].mul_(self.k_norm.weight)
        qk = apply_rotary(qk, *rope)
        q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, qk_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(q, k, v).flatten(1))


class GatedMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up in one matmul. With
    `reduce_results` False a tensor-parallel rank returns its partial sum."""

    def __init__(self, hidden_size: int, intermediate_size: int, reduce_results: bool = True):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size, intermediate_size])
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, reduce_results=reduce_results)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):

    def __init__(self, hf_config, self_attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hf_config.hidden_size, eps=hf_config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hf_config.hidden_size, eps=hf_config.rms_norm_eps)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], hidden: torch.Tensor,
                residual: torch.Tensor | None):
        # The residual stream is carried beside the hidden state and added
        # inside the next norm, instead of after each block.
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(rope, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DecoderModel(nn.Module):

    def __init__(self, hf_config, layers: list[DecoderLayer]):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(hf_config.vocab_size, hf_config.hidden_size)
        self.rotary_emb = RotaryEmbedding(head_dim_of(hf_config), hf_config.max_position_embeddings,
                                          rope_parameters_of(hf_config))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hf_config.hidden_size, eps=hf_config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        rope = self.rotary_emb.cos_sin(positions)   # the same for every layer
        for layer in self.layers:
            hidden, residual = layer(rope, hidden, residual)
        return self.norm(hidden, residual)[0]


class DecoderForCausalLM(nn.Module):
    # checkpoint name -> (fused parameter name, shard id for its weight_loader)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    # Whether a decode forward may be captured in a CUDA graph: not when it
    # takes a data-dependent path (MoE routing picks which experts run).
    supports_cuda_graphs = True

    def __init__(self, hf_config):
        super().__init__()
        layers = [DecoderLayer(hf_config, self.make_attention(hf_config), self.make_mlp(hf_config, layer_idx))
                  for layer_idx in range(hf_config.num_hidden_layers)]
        self.model = DecoderModel(hf_config, layers)
        self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
        if getattr(hf_config, "tie_word_embeddings", False):
            # One Parameter under two names: a tied checkpoint stores only the embedding.
            self.lm_head.weight = self.model.embed_tokens.weight

    def make_attention(self, hf_config) -> nn.Module:
        raise NotImplementedError

    def make_mlp(self, hf_config, layer_idx: int) -> nn.Module:
        return GatedMLP(hf_config.hidden_size, hf_config.intermediate_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states of every input token: [num_tokens, hidden_size]."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of the rows that are sampled: those the context names (a step that verifies
        drafts), else in a runner prefill the last token of each sequence; otherwise every row given."""
        context = get_context()
        if context is not None and context.logits_indices is not None:
            hidden = hidden[context.logits_indices]
        elif context is not None and context.is_prefill:
            hidden = hidden[context.cu_seqlens_q[1:].long() - 1]
        return self.lm_head(hidden)
