"""Paged attention over the KV cache, with two backends.

torch (any device, any block size): new K/V are stored into their cache
slots first; then queries attend through the block table, so a cached prefix
(a prefix-cache hit or an earlier chunk) and the new tokens are read alike.
Sequences are padded into one batch rather than looped over, and the
indices and the mask are derived once per forward, by the first layer; a
prefill with no cached prefix needs no mask (plain causal attention).
On the CPU, decode also keeps dense copies of the batch's K/V per layer while
the batch stays the same or loses sequences (Context.kv_copy_len): each step
appends its token there instead of gathering every sequence's blocks again,
and attends row range by row range, each as wide as its longest sequence.
flash-attn (CUDA only, imported lazily): used when installed and the block
size is a multiple of 256, which its paged kernels require.

A slot s lives in block s // block_size at offset s % block_size. Each
layer's cache is [num_blocks, block_size, num_kv_heads, head_dim] for
flash-attn (its paged layout); the torch backend keeps each block head-major,
[num_blocks, num_kv_heads, block_size, head_dim], so that gathering blocks
by block table yields keys already in SDPA's [seq, head, key, dim] order."""
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


def kv_cache_shape(backend: str, num_blocks: int, block_size: int, num_kv_heads: int,
                   head_dim: int) -> tuple[int, int, int, int]:
    """The shape of one layer's K (or V) cache for `backend`."""
    if backend == "flash":
        return (num_blocks, block_size, num_kv_heads, head_dim)
    return (num_blocks, num_kv_heads, block_size, head_dim)


def store_kvcache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor):
    """flash-attn layout. key, value: [num_tokens, num_kv_heads, head_dim].
    Rows that must not land anywhere (CUDA-graph padding) point at the
    runner's scratch block, so the copy needs no mask and no host sync."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value)


@dataclass(slots=True)
class TorchMetadata:
    """What the torch backend derives from a Context once per forward."""
    store_rows: torch.Tensor | None       # [num_tokens, Hkv] cache row ([-1, head_dim] view) of each new K/V head
                                          # (None in a prefill group's own metadata)
    block_rows: torch.Tensor | None       # [B * Hkv * W] cache row ([-1, block_size * head_dim] view) of each
                                          # sequence's blocks, per KV head; None when keys are the new tokens
    mask: torch.Tensor | None             # additive, [B, 1, rows, keys]: 0 where a query may see a key, else -inf;
                                          # None in a prefill without cached prefix, which is plain causal
    q_index: torch.Tensor | None = None   # prefill: [B * Qmax] packed row of each grid query (pads repeat the last)
    k_index: torch.Tensor | None = None   # prefill without block tables: [B * Kmax] packed row of each key
    out_index: torch.Tensor | None = None  # prefill: [num_tokens] grid row of each packed token (of the group)
    num_seqs: int = 0                      # prefill: rows of the grid
    positions: torch.Tensor | None = None  # prefill group: packed row of each of its tokens, in its order
    groups: list | None = None             # prefill in groups (Context.prefill_groups): a TorchMetadata each
    buckets: tuple = ()                    # decode with copies: Context.kv_copy_buckets as ints
    copy_rows: torch.Tensor | None = None  # decode, kv_copy_reuse: [B, Hkv] row ([-1, head_dim] view) of the
                                           # dense copies that takes each sequence's new K/V head


def _store_rows(slot_mapping: torch.Tensor, block_size: int, num_kv_heads: int) -> torch.Tensor:
    block = torch.div(slot_mapping, block_size, rounding_mode="floor")
    offset = slot_mapping - block * block_size
    heads = torch.arange(num_kv_heads, device=slot_mapping.device)
    return (block[:, None] * num_kv_heads + heads) * block_size + offset[:, None]


def _block_rows(block_tables: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    heads = torch.arange(num_kv_heads, device=block_tables.device)
    return (block_tables.long()[:, None, :] * num_kv_heads + heads[None, :, None]).flatten()


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def _decode_metadata(context: Context, block_size: int, num_kv_heads: int, dtype: torch.dtype) -> TorchMetadata:
    store_rows = _store_rows(context.slot_mapping, block_size, num_kv_heads)
    if not context.kv_copy_len:
        num_keys = context.block_tables.size(1) * block_size
        # Padding rows of a CUDA graph have length 0; letting them see one key
        # keeps softmax finite (their output is discarded).
        lens = context.context_lens.long().clamp_min(1)
        allowed = torch.arange(num_keys, device=lens.device)[None, :] < lens[:, None]
        return TorchMetadata(store_rows, _block_rows(context.block_tables, num_kv_heads),
                             _additive(allowed, dtype)[:, None, None])
    # Dense copies: one mask row per copy row, as wide as the widest range attends.
    row_lens = context.kv_copy_lens.long()
    buckets = tuple(tuple(bucket) for bucket in context.kv_copy_buckets.tolist())
    num_keys = max(keys for _, _, keys in buckets)
    allowed = torch.arange(num_keys, device=row_lens.device)[None, :] < row_lens[:, None]
    meta = TorchMetadata(store_rows, None, _additive(allowed, dtype)[:, None, None], buckets=buckets)
    if context.kv_copy_reuse:
        heads = torch.arange(num_kv_heads, device=row_lens.device)
        rows, lens = context.kv_copy_rows, context.context_lens.long()
        meta.copy_rows = (rows[:, None] * num_kv_heads + heads) * context.kv_copy_len + (lens[:, None] - 1)
    else:
        meta.block_rows = _block_rows(context.block_tables, num_kv_heads)
    return meta


def _prefill_metadata(context: Context, num_tokens: int, block_size: int, num_kv_heads: int,
                      dtype: torch.dtype) -> TorchMetadata:
    cu_q, cu_k = context.cu_seqlens_q.long(), context.cu_seqlens_k.long()
    seqlen_q, seqlen_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    store_rows = _store_rows(context.slot_mapping, block_size, num_kv_heads)
    if context.prefill_groups is None:
        meta = _grid_metadata(cu_q[:-1], seqlen_q, seqlen_k, context.max_seqlen_q, num_tokens,
                              context.block_tables, block_size, num_kv_heads, dtype)
        meta.store_rows = store_rows
        return meta
    groups = []
    for start, end, max_q, max_k, group_tokens in context.prefill_groups.tolist():
        members = context.prefill_order[start:end]
        block_tables = None
        if context.block_tables is not None:
            block_tables = context.block_tables.index_select(0, members)[:, :-(-max_k // block_size)]
        groups.append(_grid_metadata(cu_q[:-1][members], seqlen_q[members], seqlen_k[members], max_q, group_tokens,
                                     block_tables, block_size, num_kv_heads, dtype, grouped=True))
    return TorchMetadata(store_rows, None, None, groups=groups)


def _grid_metadata(q_start: torch.Tensor, seqlen_q: torch.Tensor, seqlen_k: torch.Tensor, max_q: int,
                   num_tokens: int, block_tables: torch.Tensor | None, block_size: int, num_kv_heads: int,
                   dtype: torch.dtype, grouped: bool = False) -> TorchMetadata:
    """How the packed tokens of some sequences (the i-th starting at packed row
    q_start[i], num_tokens in all) map onto a [num_seqs, max_q] grid. `grouped`:
    they are some of the batch's, so their packed rows (positions) are kept too."""
    device = q_start.device
    num_seqs = seqlen_q.numel()
    qi = torch.minimum(torch.arange(max_q, device=device)[None, :], seqlen_q[:, None] - 1)
    q_index = (q_start[:, None] + qi).flatten()
    tokens = torch.arange(num_tokens, device=device)
    token_start = torch.cumsum(seqlen_q, 0) - seqlen_q   # of each sequence, among these tokens
    out_index = tokens + torch.repeat_interleave(torch.arange(num_seqs, device=device) * max_q - token_start,
                                                 seqlen_q, output_size=num_tokens)
    positions = None
    if grouped:
        positions = tokens + torch.repeat_interleave(q_start - token_start, seqlen_q, output_size=num_tokens)
    if block_tables is None:
        # No cached prefix anywhere: keys are the queries' own tokens, both from
        # column 0, so plain causal attention is exact. A padding key (column
        # >= the sequence's length) lies after every real query of its row.
        return TorchMetadata(None, None, None, q_index, q_index, out_index, num_seqs, positions)
    # Queries are the last seqlen_q of seqlen_k tokens: a query at position p
    # sees keys 0..p (causal, aligned bottom-right over the cached prefix).
    q_pos = (seqlen_k - seqlen_q)[:, None] + qi
    max_k = block_tables.size(1) * block_size
    allowed = torch.arange(max_k, device=device)[None, None, :] <= q_pos[:, :, None]
    return TorchMetadata(None, _block_rows(block_tables, num_kv_heads), _additive(allowed, dtype)[:, None],
                         q_index, None, out_index, num_seqs, positions)


# Grouped-query attention inside SDPA (torch >= 2.5) reads each KV head once
# for the query heads that share it; older releases get repeated K/V.
_SDPA_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def _sdpa_gqa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs) -> torch.Tensor:
    """SDPA over [B, H, L, D] queries and [B, Hkv, K, D] keys and values."""
    if _SDPA_GQA:
        return F.scaled_dot_product_attention(query, key, value, enable_gqa=True, **kwargs)
    group = query.size(1) // key.size(1)
    return F.scaled_dot_product_attention(query, key.repeat_interleave(group, 1), value.repeat_interleave(group, 1),
                                          **kwargs)


def _flat_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_blocks, Hkv, bs, D] as [-1, D] (a row per slot and head) and as
    [num_blocks * Hkv, bs * D] (a row per block and head); an empty cache as is."""
    if cache.dim() != 4:
        return cache, cache
    return cache.view(-1, cache.size(-1)), cache.view(cache.size(0) * cache.size(1), -1)


def _gather_blocks(blocks: torch.Tensor, block_rows: torch.Tensor, num_seqs: int, num_kv_heads: int,
                   head_dim: int) -> torch.Tensor:
    """Head-major cache as [num_blocks * Hkv, bs * D] rows -> [B, Hkv, W * bs, D], each sequence's keys in order."""
    return blocks.index_select(0, block_rows).view(num_seqs, num_kv_heads, -1, head_dim)


def _grid(x: torch.Tensor, index: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Packed [num_tokens, heads, D] -> [num_seqs, heads, width, D], rows picked by `index`.
    Contiguous: the CPU attention kernel is 2x slower on strided inputs."""
    return x.index_select(0, index).view(num_seqs, -1, *x.shape[1:]).transpose(1, 2).contiguous()


def torch_prefill_attention(q, k, v, layer: "Attention", meta: TorchMetadata, scale: float) -> torch.Tensor:
    if meta.groups is None:
        return _grid_attention(q, k, v, layer, meta, scale)
    out = torch.empty_like(q)
    for group in meta.groups:
        out.index_copy_(0, group.positions, _grid_attention(q, k, v, layer, group, scale))
    return out


def _grid_attention(q, k, v, layer: "Attention", meta: TorchMetadata, scale: float) -> torch.Tensor:
    """Attention of one grid's sequences: their tokens' outputs, in packed order."""
    _, num_heads, head_dim = q.shape
    num_kv_heads = k.size(1)
    num_seqs = meta.num_seqs
    query = _grid(q, meta.q_index, num_seqs)
    if meta.block_rows is None:   # no cached prefix anywhere: keys are the new tokens
        o = _sdpa_gqa(query, _grid(k, meta.k_index, num_seqs), _grid(v, meta.k_index, num_seqs),
                      is_causal=True, scale=scale)
    else:
        key = _gather_blocks(layer.k_blocks, meta.block_rows, num_seqs, num_kv_heads, head_dim)
        value = _gather_blocks(layer.v_blocks, meta.block_rows, num_seqs, num_kv_heads, head_dim)
        o = _sdpa_gqa(query, key, value, attn_mask=meta.mask, scale=scale)
    return o.transpose(1, 2).reshape(-1, num_heads, head_dim).index_select(0, meta.out_index)


def torch_decode_attention(q, k, v, layer: "Attention", context: Context, meta: TorchMetadata,
                           scale: float) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = layer.num_kv_heads
    group = num_heads // num_kv_heads
    if not context.kv_copy_len:
        key = _gather_blocks(layer.k_blocks, meta.block_rows, num_seqs, num_kv_heads, head_dim)
        value = _gather_blocks(layer.v_blocks, meta.block_rows, num_seqs, num_kv_heads, head_dim)
        # One query per sequence: the heads sharing a KV head are its query rows (GQA), a view of q.
        query = q.view(num_seqs, num_kv_heads, group, head_dim)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=meta.mask, scale=scale).view(q.shape)
    num_rows = meta.mask.size(0)
    k_copy, v_copy = layer.kv_copies(num_rows, context.kv_copy_len, context.kv_copy_reuse)
    if meta.copy_rows is not None:   # the previous step's copies, plus this step's token
        k_copy.view(-1, head_dim).index_put_((meta.copy_rows,), k)
        v_copy.view(-1, head_dim).index_put_((meta.copy_rows,), v)
    else:   # refill from the cache: the gather lands in the copies
        torch.index_select(layer.k_blocks, 0, meta.block_rows, out=k_copy.view(-1, layer.k_blocks.size(1)))
        torch.index_select(layer.v_blocks, 0, meta.block_rows, out=v_copy.view(-1, layer.v_blocks.size(1)))
    # Queries in row order; a row no sequence uses gets a zero query (its output is dropped).
    query = q.new_zeros(num_rows, num_kv_heads, group, head_dim)
    query.view(num_rows, num_heads, head_dim).index_copy_(0, context.kv_copy_rows, q)
    out = torch.empty_like(query)
    for start, end, num_keys in meta.buckets:
        out[start:end] = F.scaled_dot_product_attention(
            query[start:end], k_copy[start:end, :, :num_keys], v_copy[start:end, :, :num_keys],
            attn_mask=meta.mask[start:end, ..., :num_keys], scale=scale)
    return out.view(num_rows, num_heads, head_dim).index_select(0, context.kv_copy_rows)


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
    return _sdpa_gqa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], is_causal=True,
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
        self._k_cache, self.k_rows, self.k_blocks = cache, *_flat_views(cache)
        self.k_copy = self.v_copy = None   # copies of the old cache's keys

    @property
    def v_cache(self) -> torch.Tensor:
        return self._v_cache

    @v_cache.setter
    def v_cache(self, cache: torch.Tensor):
        self._v_cache, self.v_rows, self.v_blocks = cache, *_flat_views(cache)
        self.k_copy = self.v_copy = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        context = get_context()
        if context is None:
            return causal_attention(q, k, v, self.scale)
        if self.backend == "flash":
            return self._flash(q, k, v, context)
        meta = context.attn_metadata
        if meta is None:
            meta = context.attn_metadata = self._metadata(context, q)
        if self.k_rows.numel():   # empty during the memory-profiling warmup
            self.k_rows.index_put_((meta.store_rows,), k)
            self.v_rows.index_put_((meta.store_rows,), v)
        if context.is_prefill:
            return torch_prefill_attention(q, k, v, self, meta, self.scale)
        return torch_decode_attention(q, k, v, self, context, meta, self.scale)

    def kv_copies(self, num_seqs: int, num_keys: int, reuse: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's dense decode copies, [num_seqs, Hkv, num_keys, D] each;
        when not reused, reallocated if the batch or its width changed."""
        shape = (num_seqs, self.num_kv_heads, num_keys, self.head_dim)
        if reuse:
            assert self.k_copy is not None and self.k_copy.shape == shape, "no K/V copies of this batch to reuse"
        elif self.k_copy is None or self.k_copy.shape != shape:
            self.k_copy = self.v_copy = None   # free the old pair first
            self.k_copy = torch.empty(shape, dtype=self.k_cache.dtype, device=self.k_cache.device)
            self.v_copy = torch.empty_like(self.k_copy)
        return self.k_copy, self.v_copy

    def _metadata(self, context: Context, q: torch.Tensor) -> TorchMetadata:
        # The warmup's empty cache has no block size; its forwards have no block tables to read.
        block_size = self.k_cache.size(2) if self.k_cache.dim() == 4 else 1
        if context.is_prefill:
            return _prefill_metadata(context, q.size(0), block_size, self.num_kv_heads, q.dtype)
        return _decode_metadata(context, block_size, self.num_kv_heads, q.dtype)

    def _flash(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: Context) -> torch.Tensor:
        k_cache, v_cache = self.k_cache, self.v_cache
        if k_cache.numel():   # empty during the memory-profiling warmup
            store_kvcache(k, v, k_cache, v_cache, context.slot_mapping)
        if context.is_prefill:
            return flash_prefill_attention(q, k, v, k_cache, v_cache, context, self.scale)
        return flash_decode_attention(q, k_cache, v_cache, context, self.scale)
