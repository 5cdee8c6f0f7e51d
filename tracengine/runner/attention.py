"""Paged attention over the KV cache, with two backends: torch
(torch_backend.py: any device, any block size) and flash-attn
(flash_backend.py: CUDA, block sizes that are multiples of 256).

A slot s lives in block s // block_size at offset s % block_size; each
backend lays out its layer's cache as kv_cache_shape says."""
import torch
from torch import nn

from tracengine.runner.context import get_context
from tracengine.runner.flash_backend import flash_attention
from tracengine.runner.torch_backend import (flat_views, sdpa_gqa, torch_decode_attention, torch_metadata,
                                             torch_prefill_attention)


def kv_cache_shape(backend: str, num_blocks: int, block_size: int, num_kv_heads: int,
                   head_dim: int) -> tuple[int, int, int, int]:
    """The shape of one layer's K (or V) cache for `backend`: flash-attn's
    paged layout, or head-major blocks for the torch backend's gathers."""
    if backend == "flash":
        return (num_blocks, block_size, num_kv_heads, head_dim)
    return (num_blocks, num_kv_heads, block_size, head_dim)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence, no cache: the model called outside the runner."""
    return sdpa_gqa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], is_causal=True,
                    scale=scale)[0].transpose(0, 1)


class Attention(nn.Module):
    """q: [N, num_heads, head_dim], k/v: [N, num_kv_heads, head_dim] -> [N, num_heads, head_dim].
    The runner assigns `k_cache`, `v_cache` (this layer's slices of the paged
    cache, shaped by kv_cache_shape) and `backend` ("torch" or "flash")."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.k_cache = self.v_cache = torch.tensor([])   # also clears k_copy, v_copy: dense decode copies
        self.backend = "torch"

    # Beside each cache, the flat views the torch backend indexes: one row per
    # slot and head (stores) and one row per block and head (gathers).
    @property
    def k_cache(self) -> torch.Tensor:
        return self._k_cache

    @k_cache.setter
    def k_cache(self, cache: torch.Tensor):
        self._k_cache, self.k_rows, self.k_blocks = cache, *flat_views(cache)
        self.k_copy = self.v_copy = None   # copies of the old cache's keys

    @property
    def v_cache(self) -> torch.Tensor:
        return self._v_cache

    @v_cache.setter
    def v_cache(self, cache: torch.Tensor):
        self._v_cache, self.v_rows, self.v_blocks = cache, *flat_views(cache)
        self.k_copy = self.v_copy = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        context = get_context()
        if context is None:
            return causal_attention(q, k, v, self.scale)
        if self.backend == "flash":
            return flash_attention(self, q, k, v, context)
        meta = context.attn_metadata
        if meta is None:
            meta = context.attn_metadata = torch_metadata(context, self, q)
        if self.k_rows.numel():   # empty during the memory-profiling warmup
            self.k_rows.index_put_((meta.store_rows,), k)
            self.v_rows.index_put_((meta.store_rows,), v)
        if context.is_prefill:
            return torch_prefill_attention(q, k, v, self, meta, self.scale)
        return torch_decode_attention(q, k, v, self, meta, self.scale)
