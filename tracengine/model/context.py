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
    # The torch backend's plan on the CPU (torch_plans.py): PrefillGroups in a prefill, KVCopyPlan in a
    # decode; None on CUDA, with flash-attn, and when the plain path serves.
    cpu_plan: object = None
    # int64 [num_rows]: the rows whose logits are computed, where they are not each sequence's last
    # token (a step that verifies drafts: every token of a verifying sequence); None: the rule
    logits_indices: torch.Tensor | None = None
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
