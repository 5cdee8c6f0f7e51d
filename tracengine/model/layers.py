"""Norm, rotary embedding (plain, and Llama 3's scaled) and activation.
Reductions and rotations run in float32 whatever the model dtype, as
Hugging Face's models do, so a bfloat16 model stays close to its reference."""
import math

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


ROPE_TYPES = ("default", "llama3")


def rope_parameters_of(hf_config) -> dict:
    """The rotary embedding's parameters from any config layout, with
    "rope_type" and "rope_theta" always set: transformers 5 nests them in
    `rope_parameters`, older releases keep `rope_theta` and maybe `rope_scaling`.
    Types other than ROPE_TYPES raise ModelError."""
    theta = getattr(hf_config, "rope_theta", None) or 1e6
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(hf_config, name, None)
        if isinstance(params, dict):
            rope_type = params.get("rope_type", params.get("type", "default"))
            if rope_type not in ROPE_TYPES:
                raise ModelError(f"rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
            return {**params, "rope_type": rope_type, "rope_theta": float(params.get("rope_theta") or theta)}
    return {"rope_type": "default", "rope_theta": float(theta)}


def rope_inv_freq(head_size: int, rope: dict) -> torch.Tensor:
    """Each rotated pair's angular frequency, float32 [head_size // 2]. Llama 3
    ("llama3") keeps the high frequencies, divides the low ones by `factor`
    and blends smoothly in between, as Meta's reference does."""
    base = rope["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
    if rope["rope_type"] != "llama3":
        return inv_freq
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context_len / low, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_context_len / high) & (wavelen <= old_context_len / low)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half (NeoX) rotary embedding over the whole head, with cos and
    sin precomputed in float32 for every position. One instance is shared by
    all layers: the table is the same and can be large (positions x head_dim)."""

    def __init__(self, head_size: int, max_position_embeddings: int, rope: dict):
        """`rope`: rope_parameters_of(hf_config)."""
        super().__init__()
        self.head_size = head_size
        inv_freq = rope_inv_freq(head_size, rope)
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
