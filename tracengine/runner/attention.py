"""Paged attention over the KV cache, with two backends.

torch (any device, any block size): new K/V are stored into their cache
slots first; then queries attend through the block table, so a cached prefix
(a prefix-cache hit or an earlier chunk) and the new tokens are read alike.
Sequences are padded into one batch with a mask rather than looped over.
flash-attn (CUDA only, imported lazily): used when installed and the block
size is a multiple of 256, which its paged kernels require.

Each layer's cache is [num_blocks, block_size, num_kv_heads, head_dim]; slot
s lives at block s // block_size, offset s % block_size."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tracengine.runner.context import Context, get_context


def flash_attn_usable(device: torch.device, block_size: int) -> bool:
    if device.type != "cuda" or block_size % 256 != 0:
        return False
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def store_kvcache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor):
    """key, value: [num_tokens, num_kv_heads, head_dim]. Rows that must not
    land anywhere (CUDA-graph padding) point at the runner's scratch block,
    so the copy needs no mask and no host sync."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value)


@dataclass(slots=True)
class PrefillPadding:
    """How the packed tokens of a prefill map onto a [num_seqs, max_seqlen_q] grid."""
    q_index: torch.Tensor          # [B, Qmax] packed row of each grid query; pads repeat the last real one
    k_index: torch.Tensor | None   # [B, Kmax] packed row of each key, when keys come from the new tokens
    mask: torch.Tensor             # [B, 1, group * Qmax, Kmax] True where a query may see a key
    out_index: torch.Tensor        # [num_tokens] grid row of each packed token


def _prefill_padding(context: Context, num_tokens: int, block_size: int, group: int) -> PrefillPadding:
    cu_q, cu_k = context.cu_seqlens_q.long(), context.cu_seqlens_k.long()
    device = cu_q.device
    seqlen_q, seqlen_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    num_seqs, max_q = seqlen_q.numel(), context.max_seqlen_q
    qi = torch.minimum(torch.arange(max_q, device=device)[None, :], seqlen_q[:, None] - 1)
    q_index = cu_q[:-1, None] + qi
    # Queries are the last seqlen_q of seqlen_k tokens: a query at position p
    # sees keys 0..p (causal, aligned bottom-right over the cached prefix).
    q_pos = (seqlen_k - seqlen_q)[:, None] + qi
    if context.block_tables is None:
        max_k = context.max_seqlen_k
        kj = torch.minimum(torch.arange(max_k, device=device)[None, :], seqlen_k[:, None] - 1)
        k_index = cu_k[:-1, None] + kj
    else:
        max_k = context.block_tables.size(1) * block_size
        k_index = None
    mask = torch.arange(max_k, device=device)[None, None, :] <= q_pos[:, :, None]
    mask = mask[:, None, None].expand(num_seqs, 1, group, max_q, max_k).reshape(num_seqs, 1, group * max_q, max_k)
    out_index = torch.arange(num_tokens, device=device) + torch.repeat_interleave(
        torch.arange(num_seqs, device=device) * max_q - cu_q[:-1], seqlen_q, output_size=num_tokens)
    return PrefillPadding(q_index, k_index, mask, out_index)


def _group_queries(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[B, L, H, D] -> [B, Hkv, group * L, D]: the query heads that share a KV
    head become extra query rows of it, so SDPA reads K/V unrepeated (GQA)."""
    b, length, h, d = q.shape
    group = h // num_kv_heads
    return q.view(b, length, num_kv_heads, group, d).permute(0, 2, 3, 1, 4).reshape(b, num_kv_heads, group * length, d)


def _ungroup_output(o: torch.Tensor, num_heads: int, length: int) -> torch.Tensor:
    """Inverse of _group_queries: [B, Hkv, group * L, D] -> [B, L, H, D]."""
    b, num_kv_heads, _, d = o.shape
    return o.view(b, num_kv_heads, num_heads // num_kv_heads, length, d).permute(0, 3, 1, 2, 4).reshape(
        b, length, num_heads, d)


def _gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[num_blocks, bs, Hkv, D] by [B, W] -> [B, Hkv, W * bs, D], each sequence's keys in order."""
    return cache[block_tables].flatten(1, 2).transpose(1, 2)


def torch_prefill_attention(q, k, v, k_cache, v_cache, context: Context, scale: float) -> torch.Tensor:
    num_tokens, num_heads, _ = q.shape
    num_kv_heads = k.size(1)
    if context.attn_metadata is None:
        block_size = k_cache.size(1) if context.block_tables is not None else 0
        context.attn_metadata = _prefill_padding(context, num_tokens, block_size, num_heads // num_kv_heads)
    pad: PrefillPadding = context.attn_metadata
    num_seqs, max_q = pad.q_index.shape
    query = _group_queries(q[pad.q_index], num_kv_heads)
    if context.block_tables is None:   # no cached prefix anywhere: keys are the new tokens
        key, value = k[pad.k_index].transpose(1, 2), v[pad.k_index].transpose(1, 2)
    else:
        key, value = _gather_blocks(k_cache, context.block_tables), _gather_blocks(v_cache, context.block_tables)
    o = F.scaled_dot_product_attention(query, key, value, attn_mask=pad.mask, scale=scale)
    return _ungroup_output(o, num_heads, max_q).flatten(0, 1)[pad.out_index]


def torch_decode_attention(q, k_cache, v_cache, context: Context, scale: float) -> torch.Tensor:
    num_seqs, num_heads, _ = q.shape
    num_kv_heads = k_cache.size(2)
    key, value = _gather_blocks(k_cache, context.block_tables), _gather_blocks(v_cache, context.block_tables)
    if context.attn_metadata is None:
        # Padding rows of a CUDA graph have length 0; letting them see one key
        # keeps softmax finite (their output is discarded).
        lens = context.context_lens.clamp_min(1)
        context.attn_metadata = (torch.arange(key.size(2), device=q.device)[None, :] < lens[:, None])[:, None, None]
    o = F.scaled_dot_product_attention(_group_queries(q.unsqueeze(1), num_kv_heads), key, value,
                                       attn_mask=context.attn_metadata, scale=scale)
    return _ungroup_output(o, num_heads, 1).squeeze(1)


def flash_prefill_attention(q, k, v, k_cache, v_cache, context: Context, scale: float) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func
    if context.block_tables is not None:
        k, v = k_cache, v_cache
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q=context.cu_seqlens_q, cu_seqlens_k=context.cu_seqlens_k,
                                  max_seqlen_q=context.max_seqlen_q, max_seqlen_k=context.max_seqlen_k,
                                  softmax_scale=scale, causal=True, block_table=context.block_tables)


def flash_decode_attention(q, k_cache, v_cache, context: Context, scale: float) -> torch.Tensor:
    from flash_attn import flash_attn_with_kvcache
    return flash_attn_with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=context.context_lens,
                                   block_table=context.block_tables, softmax_scale=scale, causal=True).squeeze(1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence, no cache: the model called outside the runner."""
    group = q.size(1) // k.size(1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1).repeat_interleave(group, 0),
                                       v.transpose(0, 1).repeat_interleave(group, 0), is_causal=True, scale=scale)
    return o.transpose(0, 1)


class Attention(nn.Module):
    """q: [N, num_heads, head_dim], k/v: [N, num_kv_heads, head_dim] -> [N, num_heads, head_dim].
    The runner assigns `k_cache`, `v_cache` (this layer's slices of the paged
    cache) and `backend` ("torch" or "flash")."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.k_cache = self.v_cache = torch.tensor([])
        self.backend = "torch"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        context = get_context()
        if context is None:
            return causal_attention(q, k, v, self.scale)
        k_cache, v_cache = self.k_cache, self.v_cache
        if k_cache.numel():   # empty during the memory-profiling warmup
            store_kvcache(k, v, k_cache, v_cache, context.slot_mapping)
        if self.backend == "flash":
            if context.is_prefill:
                return flash_prefill_attention(q, k, v, k_cache, v_cache, context, self.scale)
            return flash_decode_attention(q, k_cache, v_cache, context, self.scale)
        if context.is_prefill:
            return torch_prefill_attention(q, k, v, k_cache, v_cache, context, self.scale)
        return torch_decode_attention(q, k_cache, v_cache, context, self.scale)
