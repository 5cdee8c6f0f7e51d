"""The fold of an SGLang trace: its token pool and radix cache as the events leave them. A block
is a token-pool slot (page_size 1); imports no SGLang, so stats, render and the TUI read an
SGLang trace anywhere.

Where SGLang differs from tracengine's block manager:
- slot 0 is SGLang's padding slot, never handed out: N slots are N+1 cells;
- a slot is held by the requests whose token table holds it (a radix-cache prefix match shares
  it), else by the radix tree (a finished or retracted request's slots stay there, evictable:
  a prefix hit waiting to happen, shown as a cached block: its "hash" is the slot itself), else
  free; the pool's frees (BlockFree, seq_id -1) are a finish's slots the tree already held
  and the tree's evictions;
- the slots are taken in the allocator's order, which the fold does not predict: a slot is
  taken wherever the events say;
- the frees made while a step's batch was chosen (evictions, retractions) are written after its
  decision: a slot evicted and handed out again in that step is freed in the events after the
  allocation that took it, and stays with the request that took it;
- a request that inserts its tokens into the tree gives back its copies of slots the tree held
  already (BlockFree of slots of no tree); the fold drops them from its table, and does not
  know which of the tree's slots it shares instead (the tokens are not folded)."""
from collections import deque

from tracengine.replay.projection import Projection
from tracengine.replay.state import FINISHED
from tracengine.trace.events import (BlockAllocate, BlockAppend, BlockFree, Preempt, ScheduleDecision, SeqAbort,
                                     SeqFinish)
from tracengine.trace.sglang_events import SGLANG_EVENTS

PADDING_SLOT = 0


class SglangProjection(Projection):

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        if num_blocks:
            self.free.remove(PADDING_SLOT)
        for event_type in SGLANG_EVENTS:       # how the step was chosen: the pool is not changed by it
            self.handlers[event_type] = _explains_only

    def _settle(self, slots) -> None:
        """Each slot in the free queue exactly when no request and not the tree holds it."""
        free, ref_counts, hashes = self.free, self.ref_counts, self.hashes
        for slot in slots:
            is_free = ref_counts[slot] == 0 and hashes[slot] is None and slot != PADDING_SLOT
            if is_free and slot not in free:
                free.append(slot)
            elif not is_free and slot in free:
                free.remove(slot)

    def _in_tree(self, slot: int) -> bool:
        return self.hashes[slot] == slot

    def _to_tree(self, slots) -> None:
        for slot in slots:
            self.hashes[slot] = slot
            self.hash_to_block_id[slot] = slot

    def _release(self, seq_id: int) -> None:
        """The request gives its slots up to the radix tree; the pool takes back those the tree
        does not keep (frees that come after a retraction, in the same step)."""
        s = self.seqs[seq_id]
        table = s.block_table
        for slot in table:
            self.ref_counts[slot] -= 1
        self._to_tree(table)
        s.block_table = []
        self._settle(table)

    def schedule_decision(self, e: ScheduleDecision):
        """An aborted request stays in SGLang's batch until its abort's result is processed: it
        is decoded with the others, and stays out of the fold's running queue."""
        super().schedule_decision(e)
        seqs = self.seqs
        if any(seqs[ss.seq_id].status == FINISHED for ss in e.seqs):
            self.running = deque(i for i in self.running if seqs[i].status != FINISHED)

    def block_allocate(self, e: BlockAllocate):
        s = self.seqs[e.seq_id]
        old = s.block_table
        for slot in old:         # a chunked prompt's next chunk: its table again, with the tree's slots
            self.ref_counts[slot] -= 1
        for slot in e.block_ids:
            self.ref_counts[slot] += 1
        s.block_table = list(e.block_ids)
        s.num_cached_tokens = e.num_cached_blocks * self.block_size
        self._settle(set(old) | set(e.block_ids))

    def block_append(self, e: BlockAppend):
        s = self.seqs[e.seq_id]
        if s.status == FINISHED:     # the overlap loop: it finished in the result in flight as this batch was chosen
            self._to_tree((e.block_id,))         # its slot is released with it, to the tree
        else:
            self.ref_counts[e.block_id] += 1
            s.block_table.append(e.block_id)
        self._settle((e.block_id,))

    def block_free(self, e: BlockFree):
        """A slot of the tree leaves it (an eviction, a retracted request's slot the tree does not
        keep: it may be handed out again in the step whose decision came first); a slot of no
        tree is a request's copy of what the tree holds already (it inserted its tokens), which
        it gives up."""
        dropped = set()
        for slot in e.block_ids:
            if self._in_tree(slot):
                self.hashes[slot] = None
                del self.hash_to_block_id[slot]
            elif self.ref_counts[slot]:
                dropped.add(slot)
        if dropped:
            for seq_id in (*self.running, *self.waiting):
                s = self.seqs[seq_id]
                if not dropped.isdisjoint(s.block_table):
                    kept = [slot for slot in s.block_table if slot not in dropped]
                    for slot in s.block_table:
                        if slot in dropped:
                            self.ref_counts[slot] -= 1
                    s.block_table = kept
        self._settle(e.block_ids)

    def preempt(self, e: Preempt):
        self._release(e.seq_id)
        super().preempt(e)

    def seq_finish(self, e: SeqFinish):
        self._release(e.seq_id)
        s = self.seqs[e.seq_id]
        if s.status == FINISHED:       # aborted: SGLang finishes it in a later step's output
            return
        (self.running if e.seq_id in self.running else self.waiting).remove(e.seq_id)
        s.status, s.finish_step, s.finish_reason = FINISHED, e.step, e.reason

    def seq_abort(self, e: SeqAbort):
        """A request mid-prefill (SGLang's chunked request) is in the fold's waiting queue. In the
        overlap loop, a running request aborted while a batch was in flight finishes in that
        batch's result, whose frame comes first."""
        self._release(e.seq_id)
        if self.seqs[e.seq_id].status == FINISHED:
            return
        (self.running if e.seq_id in self.running else self.waiting).remove(e.seq_id)
        s = self.seqs[e.seq_id]
        s.status, s.finish_step, s.finish_reason = FINISHED, e.step, "abort"
        s.draft_token_ids = []


def _explains_only(e) -> None:
    pass
