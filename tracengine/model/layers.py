"""Norm, rotary embedding and activation. Reductions and rotations run in
float32 whatever the model dtype, as Hugging Face's Qwen3 does, so a bfloat16
model stays close to its reference."""
import torch
import torch.nn.functional as F
from torch import nn

from tracengine.errors import ModelError


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """weight * x / rms(x) over the last dimension, the rms in float32 and
    the result rounded to x's dtype before the weight, as the reference does."""
    if x.dtype == torch.float32:   # one call: the same float32 operations, bit for bit
        return F.rms_norm(x, (x.size(-1),), weight, eps)
    y = F.rms_norm(x.float(), (x.size(-1),), None, eps).to(x.dtype)
    return y if weight is None else y.mul_(weight)


class RMSNorm(nn.Module):

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without `residual`, the norm of x. With it, the residual add comes
        first and (norm, new residual) is returned: the decoder layers carry
        the residual stream through this call."""
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        # Add in the model dtype, like the reference, so both round the stream alike.
        residual = x + residual
        return rms_norm(residual, self.weight, self.eps), residual


def rope_theta_of(hf_config) -> float:
    """rope_theta from any Qwen3 config layout: transformers 5 nests it in
    `rope_parameters`, older releases keep `rope_theta` (and maybe `rope_scaling`)."""
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(hf_config, name, None)
        if isinstance(params, dict):
            rope_type = params.get("rope_type", params.get("type", "default"))
            if rope_type != "default":
                raise ModelError(f"rope type {rope_type!r} is not supported; only default rotary embeddings")
            if "rope_theta" in params:
                return float(params["rope_theta"])
    return float(getattr(hf_config, "rope_theta", 1e6))


class RotaryEmbedding(nn.Module):
    """Rotate-half (NeoX) rotary embedding over the whole head, with cos and
    sin precomputed in float32 for every position. One instance is shared by
    all layers: the table is the same and can be large (positions x head_dim)."""

    def __init__(self, head_size: int, max_position_embeddings: int, base: float):
        super().__init__()
        self.head_size = head_size
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
        t = torch.arange(max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        # Non-persistent: derived from the config, never in a checkpoint.
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token factors for apply_rotary, [num_tokens, 1, head_size] each:
        cos over both halves, and sin negated over the first half. Computed
        once per forward and shared by every layer."""
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q, k: [num_tokens, num_heads, head_size]; positions: [num_tokens]."""
        cos, sin = self.cos_sin(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin], in float32.
    x: [num_tokens, num_heads, head_size]; cos, sin from RotaryEmbedding.cos_sin."""
    if x.dtype != torch.float32:
        return apply_rotary(x.float(), cos, sin).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos).add_(torch.cat((x2, x1), dim=-1).mul_(sin))


class SiluAndMul(nn.Module):
    """SwiGLU's gate: the input is [gate | up] along the last dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)
