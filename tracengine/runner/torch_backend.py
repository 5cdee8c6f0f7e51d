"""Paged attention in plain torch (any device, any block size).

New K/V are stored into their cache slots first; then queries attend
through the block table, so a cached prefix (a prefix-cache hit or an
earlier chunk) and the new tokens are read alike. Sequences are padded into
one batch rather than looped over, and the indices and the mask are derived
once per forward, by the first layer (its metadata, one class per mode); a
prefill with no cached prefix needs no mask (plain causal attention). On the
CPU, a plan from the runner (torch_plans.py) groups prefill sequences by
length and lets decode attend over dense K/V copies.

Each layer's cache keeps each block head-major, [num_blocks, num_kv_heads,
block_size, head_dim], so that gathering blocks by block table yields keys
already in SDPA's [seq, head, key, dim] order."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tracengine.model.attention import sdpa_gqa
from tracengine.model.context import Context
from tracengine.runner.torch_plans import KVCopyPlan, PrefillGroups


@dataclass(slots=True)
class Grid:
    """How the packed tokens of some sequences map onto a [num_seqs, max_q] grid of queries."""
    num_seqs: int
    q_index: torch.Tensor               # [num_seqs * max_q] packed row of each grid query (pads repeat the last)
    out_index: torch.Tensor             # [num_tokens] grid row of each packed token (of the grid's sequences)
    k_index: torch.Tensor | None        # no cached prefix: [num_seqs * max_q] packed row of each key
    block_rows: torch.Tensor | None     # with a cached prefix: see DecodeMetadata
    mask: torch.Tensor | None           # with a cached prefix: additive, [B, 1, max_q, keys]
    positions: torch.Tensor | None      # a length group's grid: packed row of each of its tokens, in its order


@dataclass(slots=True)
class PrefillMetadata:
    store_rows: torch.Tensor            # [num_tokens, Hkv] cache row ([-1, head_dim] view) of each new K/V head
    grids: list[Grid]                   # one for the batch, or one per length group (PrefillGroups)


@dataclass(slots=True)
class DecodeMetadata:
    """Decode gathering each sequence's blocks."""
    store_rows: torch.Tensor
    block_rows: torch.Tensor            # [B * Hkv * W] cache row ([-1, block_size * head_dim] view) of each
                                        # sequence's blocks, per KV head
    mask: torch.Tensor                  # additive, [B, 1, 1, keys]: 0 where a query may see a key, else -inf


@dataclass(slots=True)
class CopiesMetadata:
    """Decode over the dense K/V copies (KVCopyPlan): refilled through
    block_rows, or reused, appending each sequence's new K/V at copy_rows."""
    store_rows: torch.Tensor
    mask: torch.Tensor                  # [rows, 1, 1, keys], as wide as the widest range attends
    buckets: tuple                      # KVCopyPlan.buckets as ints
    plan: KVCopyPlan
    block_rows: torch.Tensor | None = None   # refill, in the copies' row order
    copy_rows: torch.Tensor | None = None    # reuse: [num_tokens, Hkv] row ([-1, head_dim] view) of the copies
    # a step that verifies drafts: the most queries of a row, the packed token of each (row, query)
    # (pads repeat token 0), and the (row, query) of each packed token; mask is [rows, 1, max_q * group, keys]
    max_q: int = 1
    q_index: torch.Tensor | None = None
    out_index: torch.Tensor | None = None


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


def torch_metadata(context: Context, layer, q: torch.Tensor):
    """What every layer of this forward reads, derived by the first."""
    # The warmup's empty cache has no block size; its forwards have no block tables to read.
    block_size = layer.k_cache.size(2) if layer.k_cache.dim() == 4 else 1
    if context.is_prefill:
        return _prefill_metadata(context, q.size(0), block_size, layer.num_kv_heads, q.dtype)
    if context.cpu_plan is not None and context.cpu_plan.last_keys is not None:
        return _verify_metadata(context, block_size, layer.num_kv_heads, q.size(1) // layer.num_kv_heads, q.dtype)
    return _decode_metadata(context, block_size, layer.num_kv_heads, q.dtype)


def _decode_metadata(context: Context, block_size: int, num_kv_heads: int,
                     dtype: torch.dtype) -> DecodeMetadata | CopiesMetadata:
    store_rows = _store_rows(context.slot_mapping, block_size, num_kv_heads)
    plan = context.cpu_plan
    if plan is None:
        num_keys = context.block_tables.size(1) * block_size
        # Padding rows of a CUDA graph have length 0; letting them see one key
        # keeps softmax finite (their output is discarded).
        lens = context.context_lens.long().clamp_min(1)
        allowed = torch.arange(num_keys, device=lens.device)[None, :] < lens[:, None]
        return DecodeMetadata(store_rows, _block_rows(context.block_tables, num_kv_heads),
                              _additive(allowed, dtype)[:, None, None])
    # Dense copies: one mask row per copy row, as wide as the widest range attends.
    row_lens = plan.lens.long()
    buckets = tuple(tuple(bucket) for bucket in plan.buckets.tolist())
    num_keys = max(keys for _, _, keys in buckets)
    allowed = torch.arange(num_keys, device=row_lens.device)[None, :] < row_lens[:, None]
    meta = CopiesMetadata(store_rows, _additive(allowed, dtype)[:, None, None], buckets, plan)
    if plan.reuse:
        heads = torch.arange(num_kv_heads, device=row_lens.device)
        lens = context.context_lens.long()
        meta.copy_rows = (plan.rows[:, None] * num_kv_heads + heads) * plan.num_keys + (lens[:, None] - 1)
    else:
        meta.block_rows = _block_rows(context.block_tables, num_kv_heads)
    return meta


def _verify_metadata(context: Context, block_size: int, num_kv_heads: int, group: int,
                     dtype: torch.dtype) -> CopiesMetadata:
    """A decode over the dense copies whose sequences carry several queries (their last token and
    drafts), on the plan's grid of queries: each KV head's max_q * group query rows, query by query."""
    plan = context.cpu_plan
    num_rows, max_q = plan.last_keys.shape
    buckets = tuple(tuple(bucket) for bucket in plan.buckets.tolist())
    num_keys = max(keys for _, _, keys in buckets)
    allowed = torch.arange(num_keys, device=plan.last_keys.device) <= plan.last_keys[:, :, None]
    mask = _additive(allowed, dtype)[:, :, None].expand(num_rows, max_q, group, num_keys)
    meta = CopiesMetadata(_store_rows(context.slot_mapping, block_size, num_kv_heads),
                          mask.reshape(num_rows, 1, max_q * group, num_keys), buckets, plan,
                          max_q=max_q, q_index=plan.query_tokens, out_index=plan.token_queries)
    if plan.reuse:
        heads = torch.arange(num_kv_heads, device=plan.last_keys.device) * plan.num_keys
        rows = torch.div(plan.token_queries, max_q, rounding_mode="floor")
        meta.copy_rows = (rows * (num_kv_heads * plan.num_keys) + plan.token_keys)[:, None] + heads
    else:
        meta.block_rows = _block_rows(context.block_tables, num_kv_heads)
    return meta


def _prefill_metadata(context: Context, num_tokens: int, block_size: int, num_kv_heads: int,
                      dtype: torch.dtype) -> PrefillMetadata:
    cu_q, cu_k = context.cu_seqlens_q.long(), context.cu_seqlens_k.long()
    seqlen_q, seqlen_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    store_rows = _store_rows(context.slot_mapping, block_size, num_kv_heads)
    plan: PrefillGroups | None = context.cpu_plan
    if plan is None:
        return PrefillMetadata(store_rows, [_grid(cu_q[:-1], seqlen_q, seqlen_k, context.max_seqlen_q, num_tokens,
                                                  context.block_tables, block_size, num_kv_heads, dtype)])
    grids = []
    for start, end, max_q, max_k, group_tokens in plan.groups.tolist():
        members = plan.order[start:end]
        block_tables = None
        if context.block_tables is not None:
            block_tables = context.block_tables.index_select(0, members)[:, :-(-max_k // block_size)]
        grids.append(_grid(cu_q[:-1][members], seqlen_q[members], seqlen_k[members], max_q, group_tokens,
                           block_tables, block_size, num_kv_heads, dtype, grouped=True))
    return PrefillMetadata(store_rows, grids)


def _grid(q_start: torch.Tensor, seqlen_q: torch.Tensor, seqlen_k: torch.Tensor, max_q: int, num_tokens: int,
          block_tables: torch.Tensor | None, block_size: int, num_kv_heads: int, dtype: torch.dtype,
          grouped: bool = False) -> Grid:
    """The grid of some sequences, the i-th starting at packed row q_start[i],
    num_tokens in all. `grouped`: they are some of the batch's, so their
    packed rows (positions) are kept too."""
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
        return Grid(num_seqs, q_index, out_index, q_index, None, None, positions)
    # Queries are the last seqlen_q of seqlen_k tokens: a query at position p
    # sees keys 0..p (causal, aligned bottom-right over the cached prefix).
    q_pos = (seqlen_k - seqlen_q)[:, None] + qi
    max_k = block_tables.size(1) * block_size
    allowed = torch.arange(max_k, device=device)[None, None, :] <= q_pos[:, :, None]
    return Grid(num_seqs, q_index, out_index, None, _block_rows(block_tables, num_kv_heads),
                _additive(allowed, dtype)[:, None], positions)


def _gather_blocks(blocks: torch.Tensor, block_rows: torch.Tensor, num_seqs: int, num_kv_heads: int,
                   head_dim: int) -> torch.Tensor:
    """Head-major cache as [num_blocks * Hkv, bs * D] rows -> [B, Hkv, W * bs, D], each sequence's keys in order."""
    return blocks.index_select(0, block_rows).view(num_seqs, num_kv_heads, -1, head_dim)


def _on_grid(x: torch.Tensor, index: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Packed [num_tokens, heads, D] -> [num_seqs, heads, width, D], rows picked by `index`.
    Contiguous: the CPU attention kernel is 2x slower on strided inputs."""
    return x.index_select(0, index).view(num_seqs, -1, *x.shape[1:]).transpose(1, 2).contiguous()


def torch_prefill_attention(q, k, v, layer, meta: PrefillMetadata, scale: float) -> torch.Tensor:
    grids = meta.grids
    if grids[0].positions is None:   # one grid for the batch
        return _grid_attention(q, k, v, layer, grids[0], scale)
    out = torch.empty_like(q)
    for grid in grids:
        out.index_copy_(0, grid.positions, _grid_attention(q, k, v, layer, grid, scale))
    return out


def _grid_attention(q, k, v, layer, grid: Grid, scale: float) -> torch.Tensor:
    """Attention of one grid's sequences: their tokens' outputs, in packed order."""
    _, num_heads, head_dim = q.shape
    num_kv_heads = k.size(1)
    num_seqs = grid.num_seqs
    query = _on_grid(q, grid.q_index, num_seqs)
    if grid.block_rows is None:   # no cached prefix anywhere: keys are the new tokens
        o = sdpa_gqa(query, _on_grid(k, grid.k_index, num_seqs), _on_grid(v, grid.k_index, num_seqs),
                     is_causal=True, scale=scale)
    else:
        key = _gather_blocks(layer.k_blocks, grid.block_rows, num_seqs, num_kv_heads, head_dim)
        value = _gather_blocks(layer.v_blocks, grid.block_rows, num_seqs, num_kv_heads, head_dim)
        o = sdpa_gqa(query, key, value, attn_mask=grid.mask, scale=scale)
    return o.transpose(1, 2).reshape(-1, num_heads, head_dim).index_select(0, grid.out_index)


def torch_decode_attention(q, k, v, layer, meta: DecodeMetadata | CopiesMetadata, scale: float) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = layer.num_kv_heads
    group = num_heads // num_kv_heads
    if type(meta) is DecodeMetadata:
        key = _gather_blocks(layer.k_blocks, meta.block_rows, num_seqs, num_kv_heads, head_dim)
        value = _gather_blocks(layer.v_blocks, meta.block_rows, num_seqs, num_kv_heads, head_dim)
        # One query per sequence: the heads sharing a KV head are its query rows (GQA), a view of q.
        query = q.view(num_seqs, num_kv_heads, group, head_dim)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=meta.mask, scale=scale).view(q.shape)
    plan = meta.plan
    num_rows = meta.mask.size(0)
    k_copy, v_copy = _kv_copies(layer, num_rows, plan.num_keys, plan.reuse)
    if meta.copy_rows is not None:   # the previous step's copies, plus this step's token
        k_copy.view(-1, head_dim).index_put_((meta.copy_rows,), k)
        v_copy.view(-1, head_dim).index_put_((meta.copy_rows,), v)
    else:   # refill from the cache: the gather lands in the copies
        torch.index_select(layer.k_blocks, 0, meta.block_rows, out=k_copy.view(-1, layer.k_blocks.size(1)))
        torch.index_select(layer.v_blocks, 0, meta.block_rows, out=v_copy.view(-1, layer.v_blocks.size(1)))
    max_q = meta.max_q
    if max_q == 1:
        # Queries in row order; a row no sequence uses gets a zero query (its output is dropped).
        query = q.new_zeros(num_rows, num_kv_heads, group, head_dim)
        query.view(num_rows, num_heads, head_dim).index_copy_(0, plan.rows, q)
    else:   # [rows, Hkv, max_q * group, D]: each KV head's queries, query by query
        query = q.index_select(0, meta.q_index).view(num_rows, max_q, num_kv_heads, group, head_dim) \
            .transpose(1, 2).reshape(num_rows, num_kv_heads, max_q * group, head_dim)
    out = torch.empty_like(query)
    for start, end, num_keys in meta.buckets:
        out[start:end] = F.scaled_dot_product_attention(
            query[start:end], k_copy[start:end, :, :num_keys], v_copy[start:end, :, :num_keys],
            attn_mask=meta.mask[start:end, ..., :num_keys], scale=scale)
    if max_q == 1:
        return out.view(num_rows, num_heads, head_dim).index_select(0, plan.rows)
    return out.view(num_rows, num_kv_heads, max_q, group, head_dim).transpose(1, 2) \
        .reshape(num_rows * max_q, num_heads, head_dim).index_select(0, meta.out_index)


def _kv_copies(layer, num_rows: int, num_keys: int, reuse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's dense decode copies, [num_rows, Hkv, num_keys, D] each;
    when not reused, reallocated if the batch or its width changed."""
    shape = (num_rows, layer.num_kv_heads, num_keys, layer.head_dim)
    if reuse:
        assert layer.k_copy is not None and layer.k_copy.shape == shape, "no K/V copies of this batch to reuse"
    elif layer.k_copy is None or layer.k_copy.shape != shape:
        layer.k_copy = layer.v_copy = None   # free the old pair first
        layer.k_copy = torch.empty(shape, dtype=layer.k_cache.dtype, device=layer.k_cache.device)
        layer.v_copy = torch.empty_like(layer.k_copy)
    return layer.k_copy, layer.v_copy
