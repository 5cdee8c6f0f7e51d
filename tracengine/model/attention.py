"""The attention layer of every architecture: q, k, v in, attention out.
Where the keys live is the runner's business: inside a runner forward (a
Context is set) the layer hands q, k, v to the paged-attention backend the
runner plugged into it (runner/attention.py), which stores the new K/V in
this layer's slices of the paged cache and attends through block tables.
Outside the runner (one plain sequence, as the model tests run it) the
layer is ordinary causal attention. So the model imports nothing of the
runner, and the runner chooses its backends without the model knowing."""
import torch
import torch.nn.functional as F
from torch import nn

from tracengine.model.context import get_context

# Grouped-query attention inside SDPA (torch >= 2.5) reads each KV head once
# for the query heads that share it; older releases get repeated K/V.
_SDPA_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def sdpa_gqa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs) -> torch.Tensor:
    """SDPA over [B, H, L, D] queries and [B, Hkv, K, D] keys and values."""
    if _SDPA_GQA:
        return F.scaled_dot_product_attention(query, key, value, enable_gqa=True, **kwargs)
    group = query.size(1) // key.size(1)
    return F.scaled_dot_product_attention(query, key.repeat_interleave(group, 1), value.repeat_interleave(group, 1),
                                          **kwargs)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence, no cache: the model called outside the runner."""
    return sdpa_gqa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], is_causal=True,
                    scale=scale)[0].transpose(0, 1)


def flat_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A head-major cache [num_blocks, Hkv, bs, D] as [-1, D] (a row per slot
    and head) and as [num_blocks * Hkv, bs * D] (a row per block and head);
    any other layout (flash-attn's, an empty cache) as is."""
    if cache.dim() != 4:
        return cache, cache
    return cache.view(-1, cache.size(-1)), cache.view(cache.size(0) * cache.size(1), -1)


class Attention(nn.Module):
    """q: [N, num_heads, head_dim], k/v: [N, num_kv_heads, head_dim] -> [N, num_heads, head_dim].
    The runner assigns `k_cache`, `v_cache` (this layer's slices of the paged
    cache) and `backend`, its paged attention: backend(layer, q, k, v, context)."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.k_cache = self.v_cache = torch.tensor([])   # also clears k_copy, v_copy: dense decode copies
        self.backend = None

    # Beside each cache, the flat views the torch backend indexes: one row per
    # slot and head (stores) and one row per block and head (gathers).
    @property
    def k_cache(self) -> torch.Tensor:
        return self._k_cache

    @k_cache.setter
    def k_cache(self, cache: torch.Tensor):
        self._k_cache, (self.k_rows, self.k_blocks) = cache, flat_views(cache)
        self.k_copy = self.v_copy = None   # copies of the old cache's keys

    @property
    def v_cache(self) -> torch.Tensor:
        return self._v_cache

    @v_cache.setter
    def v_cache(self, cache: torch.Tensor):
        self._v_cache, (self.v_rows, self.v_blocks) = cache, flat_views(cache)
        self.k_copy = self.v_copy = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        context = get_context()
        if context is None:
            return causal_attention(q, k, v, self.scale)
        assert self.backend is not None, "a runner forward on a layer no runner set up"
        return self.backend(self, q, k, v, context)
