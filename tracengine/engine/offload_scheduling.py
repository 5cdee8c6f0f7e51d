"""The mixed policy's admission from waiting with a CPU tier (engine/cpu_tier.py), as vLLM
0.33's scheduler admits with its OffloadingConnector (vllm/v1/core/sched/scheduler.py):

1. first the sequences set aside while they load (vLLM's kv_holding_waiting queue), in the
   order they were: one whose load has not ended is skipped; one whose load ended has its
   loaded blocks registered in the GPU prefix cache and gets the tokens it needs past them,
   as much as the budget leaves, slots allocated per chunk (too few free blocks: admission
   stops, `no_free_blocks`);
2. then waiting, FIFO: the prefix-cache hits, then the tier's lookup past them. A sequence the
   lookup tells to wait is skipped, the ones behind it go on (it keeps its place); one with a
   hit in the tier is admitted if its whole sequence fits in the free blocks less those the
   prefills in flight still need (vLLM's reserved blocks), given GPU blocks for its hits and
   for the blocks it loads, and set aside, computing nothing this step; any other is admitted
   as without the tier.

Every stop is the same as without the tier (max_num_seqs, not_admitted, no_free_blocks,
budget_exhausted, waiting_empty); a step may schedule nothing when every sequence waits for a
transfer."""
from collections import deque

from tracengine.engine.sequence import Sequence, SequenceStatus
from tracengine.trace.events import StopReason


def reserved_blocks(scheduler) -> int:
    """Free blocks the prefills in flight (set aside to load, or running mid-prompt) still need
    to hold their whole sequence (vLLM's _inflight_prefill_reserved_blocks)."""
    size, longest = scheduler.block_size, scheduler.max_model_len
    return sum(max(0, -(-min(seq.num_tokens, longest) // size) - len(seq.block_table))
               for seq in (*scheduler.loading, *(s for s in scheduler.running if s.is_prefill)))


def schedule_waiting(scheduler, token_budget: int, scheduled_seqs: list[Sequence],
                     prefill_flags: list[bool]) -> tuple[StopReason | None, int, int, int]:
    """Admission from the set-aside sequences, then waiting; returns (stop reason, the budget
    left, the blocked sequence, the blocks it needed)."""
    bm = scheduler.block_manager
    tier = scheduler.cpu_tier
    size = bm.block_size
    stop_reason: StopReason | None = None
    blocked_seq_id, num_blocks_needed = -1, 0

    def run(seq: Sequence, num_new_tokens: int):
        nonlocal token_budget
        seq.num_scheduled_tokens = num_new_tokens
        token_budget -= num_new_tokens
        seq.status = SequenceStatus.RUNNING
        scheduler.running.append(seq)
        scheduler._take(seq, scheduled_seqs, prefill_flags)

    loading, kept = scheduler.loading, deque()
    while loading and token_budget > 0:
        if len(scheduler.running) >= scheduler.max_num_seqs:
            stop_reason = "max_num_seqs"
            break
        seq = loading[0]
        if seq.seq_id in tier.loads:
            if not tier.is_loaded(seq.seq_id):
                kept.append(loading.popleft())
                continue
            first_block = tier.loads[seq.seq_id][0]
            seq.num_cached_tokens = tier.take_loaded(seq)
            bm.cache_blocks(seq, first_block, len(seq.block_table))
        num_new_tokens = min(seq.num_tokens - seq.num_cached_tokens, token_budget)
        if not bm.allocate_slots(seq, num_new_tokens):
            stop_reason, blocked_seq_id = "no_free_blocks", seq.seq_id
            break
        loading.popleft()
        run(seq, num_new_tokens)
    loading.extendleft(reversed(kept))
    if stop_reason is not None:
        return stop_reason, token_budget, blocked_seq_id, num_blocks_needed

    waiting, skipped = scheduler.waiting, []
    while waiting and token_budget > 0:
        if len(scheduler.running) >= scheduler.max_num_seqs:
            stop_reason = "max_num_seqs"
            break
        seq = waiting[0]
        if not scheduler.admit(seq):
            stop_reason = "not_admitted"   # a policy's refusal, no head-of-line block
            break
        hits = bm.cached_block_ids(seq)
        num_cpu_blocks = tier.lookup(seq, len(hits))
        if num_cpu_blocks is None:        # it waits for a transfer; the ones behind it go on
            skipped.append(waiting.popleft())
            continue
        num_new_blocks = bm.num_blocks_needed(seq, hits)
        reserved = reserved_blocks(scheduler) if num_cpu_blocks else 0
        if num_new_blocks > bm.num_free_blocks - reserved:
            # head-of-line block: shorter requests behind it wait too
            stop_reason, blocked_seq_id, num_blocks_needed = "no_free_blocks", seq.seq_id, num_new_blocks
            break
        waiting.popleft()
        if num_cpu_blocks:                # its blocks load; it computes nothing this step
            bm.allocate(seq, hits, num_cpu_blocks * size, delay_cache_blocks=True)
            tier.start_load(seq, len(hits), num_cpu_blocks)
            loading.append(seq)
            continue
        num_computed = bm.num_computed_tokens(seq, len(hits))
        num_new_tokens = min(seq.num_tokens - num_computed, token_budget)
        bm.allocate(seq, hits, num_new_tokens)
        run(seq, num_new_tokens)
    else:
        stop_reason = "budget_exhausted" if token_budget == 0 else "waiting_empty"
    waiting.extendleft(reversed(skipped))
    return stop_reason, token_budget, blocked_seq_id, num_blocks_needed
