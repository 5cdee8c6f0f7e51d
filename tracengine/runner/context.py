"""The per-forward attention metadata. The runner sets one Context around each
forward and resets it after, so the model's signatures stay (input_ids,
positions) and attention layers still find slot mappings and block tables.
A ContextVar, not a module global: each thread sees only its own forward."""
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Context:
    is_prefill: bool = False
    cu_seqlens_q: torch.Tensor | None = None   # int32 [num_seqs + 1], prefill
    cu_seqlens_k: torch.Tensor | None = None   # int32 [num_seqs + 1], cached prefix + new tokens
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0                      # decode: the longest context
    slot_mapping: torch.Tensor | None = None   # int64 [num_tokens]: cache slot of each new token
    context_lens: torch.Tensor | None = None   # int32 [num_seqs], decode
    block_tables: torch.Tensor | None = None   # int32 [num_seqs, max_blocks]; prefill: only with a cached prefix
    # Decode on the CPU: attention keeps dense copies of the batch's K/V, [rows, heads, kv_copy_len, dim]
    # per layer (runner's KVCopies). kv_copy_reuse: the rows hold every earlier key of the batch's
    # sequences, one token shorter each, and this step appends; otherwise they are refilled from the cache
    # through block_tables (one row per sequence, in row order; kv_copy_len = its width in slots).
    # 0: no copies, gather through block_tables each step.
    kv_copy_len: int = 0
    kv_copy_reuse: bool = False
    kv_copy_rows: torch.Tensor | None = None   # int64 [num_seqs]: each sequence's row
    kv_copy_lens: torch.Tensor | None = None   # int32 [rows]: keys of each row (1 for a row no sequence uses)
    kv_copy_buckets: torch.Tensor | None = None   # int64 [ranges, 3]: (first row, end row, keys) of each row
                                                 # range that attention takes in one call
    # Prefill on the CPU: sequences of similar length attend in the same padded grid, a grid per group
    # (runner's prefill_groups). prefill_order: int64 [num_seqs], sequence indices by length;
    # prefill_groups: int64 [groups, 5], (first, end) in prefill_order, the longest query and key
    # lengths, and the tokens of each group. None: one grid for the batch.
    prefill_order: torch.Tensor | None = None
    prefill_groups: torch.Tensor | None = None
    # Derived once per forward by the first attention layer and reused by the
    # others (padding indices, masks). A fresh Context starts empty, which is
    # what a CUDA graph capture needs: the derivation is then recorded too.
    attn_metadata: object = None


_CONTEXT: ContextVar[Context | None] = ContextVar("tracengine_forward_context", default=None)


def get_context() -> Context | None:
    """The current forward's context; None outside the runner (a plain
    forward over one sequence, as the model tests do)."""
    return _CONTEXT.get()


@contextmanager
def forward_context(context: Context):
    token = _CONTEXT.set(context)
    try:
        yield context
    finally:
        _CONTEXT.reset(token)
