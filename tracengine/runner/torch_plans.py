"""What the torch attention backend does differently on the CPU, planned on
the host by rank 0's runner from each batch and carried to attention (and to
the workers) in `Context.cpu_plan`. Only on the CPU, eager, torch backend;
the flash and CUDA paths never see a plan.

Prefill: a causal grid costs the square of its longest sequence for every
row, so sequences sorted by length share grids in groups (PrefillGroups).
Decode: gathering every sequence's keys anew is a large share of a step, so
attention keeps dense copies of the batch's K/V per layer while the batch
stays the same or loses sequences (KVCopies, KVCopyPlan): each step appends
its token there, and attends row range by row range, each as wide as its
longest sequence. A step that verifies drafts is a decode too: each sequence appends its last
token and its drafts (several queries, causal over its own), and the copies stay valid for the
keys before the kept tokens, so a rejected draft's key is written over by the next step."""
from dataclasses import dataclass

import torch

from tracengine.engine.sequence import Sequence

# Dense decode K/V copies: blocks of room past the batch's widest block table, and the memory they
# may take however small the KV cache.
KV_COPY_SPARE_BLOCKS = 2
KV_COPY_MIN_BUDGET = 256 << 20
# Rows of the copies whose sequence left the batch are still computed (masked) until a refill;
# past this share of the rows, the next decode refills instead.
KV_COPY_MAX_DEAD = 0.25
# Decode attention over the copies runs on row ranges of similar length, each only as wide as
# its longest sequence: at most this many ranges, of at least KV_COPY_BUCKET_ROWS rows each.
KV_COPY_BUCKETS = 8
KV_COPY_BUCKET_ROWS = 8
# Prefill attention: at most this many grids of sequences of similar length, of at least
# PREFILL_GROUP_SEQS sequences each, once the longest sequence has PREFILL_GROUP_MIN_LEN tokens.
PREFILL_GROUPS = 8
PREFILL_GROUP_SEQS = 4
PREFILL_GROUP_MIN_LEN = 64


@dataclass(slots=True)
class PrefillGroups:
    """Prefill in grids of sequences of similar length, a grid per group."""
    order: torch.Tensor    # int64 [num_seqs]: sequence indices by length
    groups: torch.Tensor   # int64 [groups, 5]: (first, end) in order, the longest query and key lengths,
                           # and the tokens of each group


@dataclass(slots=True)
class KVCopyPlan:
    """Decode over the dense copies, [rows, heads, num_keys, dim] per layer.
    reuse: the rows hold every earlier key of the batch's sequences, one token
    shorter each, and this step appends; otherwise they are refilled from the
    cache through the context's block_tables (one row per sequence, in row order)."""
    num_keys: int
    reuse: bool
    rows: torch.Tensor     # int64 [num_seqs]: each sequence's row
    lens: torch.Tensor     # int32 [rows]: keys of each row (1 for a row no sequence uses)
    buckets: torch.Tensor  # int64 [ranges, 3]: (first row, end row, keys) of each row range attended in one call
    # A step that verifies drafts (each sequence's queries: its last token and its drafts), on a
    # [rows, max_q] grid of queries; None: one query a row, the rows' last keys.
    max_q: int = 1
    query_tokens: torch.Tensor | None = None   # int64 [rows * max_q]: the packed token of each grid query (pads: 0)
    token_queries: torch.Tensor | None = None  # int64 [num_tokens]: the grid query of each packed token
    token_keys: torch.Tensor | None = None     # int64 [num_tokens]: its key in its row (where its K/V lands)
    last_keys: torch.Tensor | None = None      # int64 [rows, max_q]: the last key each grid query sees


def even_ranges(n: int, num_ranges: int) -> list[tuple[int, int]]:
    """[0, n) cut into num_ranges (start, end) ranges of near-equal size."""
    bounds = [n * i // num_ranges for i in range(num_ranges + 1)]
    return list(zip(bounds, bounds[1:]))


def plan_prefill_groups(cu_seqlens_q: list[int], cu_seqlens_k: list[int]) -> tuple | None:
    """(order, groups) for PrefillGroups, or None for one grid: groups of
    PREFILL_GROUP_SEQS or more sequences, at most PREFILL_GROUPS of them."""
    num_seqs = len(cu_seqlens_q) - 1
    num_groups = min(PREFILL_GROUPS, num_seqs // PREFILL_GROUP_SEQS)
    seqlen_q = [b - a for a, b in zip(cu_seqlens_q, cu_seqlens_q[1:])]
    seqlen_k = [b - a for a, b in zip(cu_seqlens_k, cu_seqlens_k[1:])]
    if num_groups < 2 or max(seqlen_k) < PREFILL_GROUP_MIN_LEN:
        return None
    order = sorted(range(num_seqs), key=seqlen_k.__getitem__)
    groups = []
    for start, end in even_ranges(num_seqs, num_groups):
        members = order[start:end]
        groups.append((start, end, max(seqlen_q[i] for i in members), max(seqlen_k[i] for i in members),
                       sum(seqlen_q[i] for i in members)))
    return order, groups


def prefill_groups(cu_seqlens_q: list[int], cu_seqlens_k: list[int]) -> PrefillGroups | None:
    planned = plan_prefill_groups(cu_seqlens_q, cu_seqlens_k)
    if planned is None:
        return None
    return PrefillGroups(torch.tensor(planned[0], dtype=torch.int64), torch.tensor(planned[1], dtype=torch.int64))


@dataclass(slots=True)
class KVCopies:
    """Where each sequence of a decode batch sits in the dense K/V copies.
    Rows are in order of context length when refilled; every sequence grows
    one token a step, so the order holds while the copies are kept."""
    row_by_key: dict           # (id(seq), seq_id) -> row, fixed at the refill and shared by later steps
    lens: list[int]            # per row: context length this step; 0 for a dead row (its sequence left)
    num_keys: int              # the copies' width in tokens
    row_of_seq: list[int]      # per sequence of the batch: its row
    seq_of_row: list[int]      # per row: its index in the batch (read only at a refill)
    reuse: bool
    buckets: tuple = ()        # ((first row, end row, keys to attend), ...)
    num_queries: list[int] | None = None   # per sequence of the batch, in a step that verifies drafts

    @classmethod
    def refill(cls, keys: list, context_lens: list[int], num_keys: int) -> "KVCopies":
        order = sorted(range(len(keys)), key=context_lens.__getitem__)
        row_of_seq = [0] * len(keys)
        for row, i in enumerate(order):
            row_of_seq[i] = row
        return cls({keys[i]: row for row, i in enumerate(order)}, [context_lens[i] for i in order], num_keys,
                   row_of_seq, order, False)._with_buckets()

    def advance(self, keys: list, context_lens: list[int], num_queries: list[int] | None = None) -> "KVCopies | None":
        """The copies for the next step of (a subset of) the same batch, or None if they must be refilled.
        A sequence's new tokens start at most where its row's keys end: a key past its start is a
        rejected draft's, which this step writes over."""
        num_rows = len(self.lens)
        if max(context_lens) > self.num_keys or num_rows - len(keys) > KV_COPY_MAX_DEAD * num_rows:
            return None
        lens = [0] * num_rows
        row_of_seq = []
        for i, (key, n) in enumerate(zip(keys, context_lens)):
            row = self.row_by_key.get(key)
            start = n - (num_queries[i] if num_queries else 1)
            # A dead row has length 0: its sequence cannot come back.
            if row is None or not self.lens[row] or start > self.lens[row]:
                return None
            lens[row] = n
            row_of_seq.append(row)
        return KVCopies(self.row_by_key, lens, self.num_keys, row_of_seq, [], True, (), num_queries)._with_buckets()

    def _with_buckets(self) -> "KVCopies":
        num_rows = len(self.lens)
        ranges = even_ranges(num_rows, max(1, min(KV_COPY_BUCKETS, num_rows // KV_COPY_BUCKET_ROWS)))
        widths = [max(self.lens[start:end]) for start, end in ranges]
        self.buckets = tuple((start, end, width) for (start, end), width in zip(ranges, widths) if width)
        return self

    def plan(self) -> KVCopyPlan:
        plan = KVCopyPlan(self.num_keys, self.reuse, torch.tensor(self.row_of_seq, dtype=torch.int64),
                          torch.tensor([max(n, 1) for n in self.lens], dtype=torch.int32),
                          torch.tensor(self.buckets, dtype=torch.int64))
        if self.num_queries:
            self._plan_queries(plan)
        return plan

    def _plan_queries(self, plan: KVCopyPlan) -> None:
        """The grid of a step that verifies drafts: query j of a sequence whose new tokens start at
        key s of its row sees keys 0..s + j (a pad repeats its row's last query)."""
        max_q = plan.max_q = max(self.num_queries)
        num_rows = len(self.lens)
        query_tokens = [0] * (num_rows * max_q)
        last_keys = [0] * (num_rows * max_q)
        token_queries, token_keys = [], []
        token = 0
        for row, q in zip(self.row_of_seq, self.num_queries):
            start = self.lens[row] - q
            first = row * max_q
            for j in range(max_q):
                last_keys[first + j] = start + min(j, q - 1)
            query_tokens[first:first + q] = range(token, token + q)
            token_queries.extend(range(first, first + q))
            token_keys.extend(range(start, start + q))
            token += q
        plan.query_tokens = torch.tensor(query_tokens, dtype=torch.int64)
        plan.token_queries = torch.tensor(token_queries, dtype=torch.int64)
        plan.token_keys = torch.tensor(token_keys, dtype=torch.int64)
        plan.last_keys = torch.tensor(last_keys, dtype=torch.int64).view(num_rows, max_q)


class KVCopyPlanner:
    """How each decode batch uses the dense copies, with the copies of the
    last batch in mind. They are kept while the batch is the last one, one
    token longer, less sequences that left it (their rows stay, dead, until
    KV_COPY_MAX_DEAD of the rows are); otherwise refilled, but only while
    they take no more memory than the KV cache (or KV_COPY_MIN_BUDGET)."""

    def __init__(self, kv_cache: torch.Tensor, block_size: int, max_num_blocks_per_seq: int):
        self.block_size = block_size
        self.max_num_blocks_per_seq = max_num_blocks_per_seq
        # K and V of one token of one sequence in every layer: the cache, [2, layers, blocks, Hkv, bs, D], per slot.
        self.bytes_per_key = kv_cache.nbytes // (kv_cache.size(2) * block_size)
        self.budget = max(kv_cache.nbytes, KV_COPY_MIN_BUDGET)
        self.last: KVCopies | None = None    # None after a prefill or while copies are not used

    def plan(self, seqs: list[Sequence], context_lens: list[int],
             num_queries: list[int] | None = None) -> KVCopies | None:
        """`num_queries`: each sequence's new tokens, in a step that verifies drafts (None: one each)."""
        keys = [(id(seq), seq.seq_id) for seq in seqs]
        if self.last is not None:
            reused = self.last.advance(keys, context_lens, num_queries)
            if reused is not None:
                self.last = reused
                return reused
        # Refilled with room to grow, so a steady batch refills once every KV_COPY_SPARE_BLOCKS blocks.
        width = max(len(seq.block_table) for seq in seqs)
        num_keys = max(width, min(width + KV_COPY_SPARE_BLOCKS, self.max_num_blocks_per_seq)) * self.block_size
        if len(seqs) * num_keys * self.bytes_per_key > self.budget:
            self.last = None
        else:
            self.last = KVCopies.refill(keys, context_lens, num_keys)
            self.last.num_queries = num_queries
        return self.last
