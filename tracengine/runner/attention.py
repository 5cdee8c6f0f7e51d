"""Paged attention over the KV cache, with two backends: torch
(torch_backend.py: any device, any block size) and flash-attn
(flash_backend.py: CUDA, block sizes that are multiples of 256). The
runner plugs one into every model Attention layer (model/attention.py).

A slot s lives in block s // block_size at offset s % block_size; each
backend lays out its layer's cache as kv_cache_shape says."""
import torch

from tracengine.model.context import Context
from tracengine.runner.flash_backend import flash_attention
from tracengine.runner.torch_backend import torch_decode_attention, torch_metadata, torch_prefill_attention


def kv_cache_shape(backend: str, num_blocks: int, block_size: int, num_kv_heads: int,
                   head_dim: int) -> tuple[int, int, int, int]:
    """The shape of one layer's K (or V) cache for `backend`: flash-attn's
    paged layout, or head-major blocks for the torch backend's gathers."""
    if backend == "flash":
        return (num_blocks, block_size, num_kv_heads, head_dim)
    return (num_blocks, num_kv_heads, block_size, head_dim)


def torch_attention(layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: Context) -> torch.Tensor:
    """Store the new K/V, then attend through the block tables, in plain torch."""
    meta = context.attn_metadata
    if meta is None:
        meta = context.attn_metadata = torch_metadata(context, layer, q)
    if layer.k_rows.numel():   # empty during the memory-profiling warmup
        layer.k_rows.index_put_((meta.store_rows,), k)
        layer.v_rows.index_put_((meta.store_rows,), v)
    if context.is_prefill:
        return torch_prefill_attention(q, k, v, layer, meta, layer.scale)
    return torch_decode_attention(q, k, v, layer, meta, layer.scale)


BACKENDS = {"torch": torch_attention, "flash": flash_attention}
