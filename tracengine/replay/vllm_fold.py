"""The fold of a vLLM trace: the events applied as vLLM's scheduler and block
pool did them. Imports no vLLM: stats, render, check and the TUI read a vLLM
trace anywhere.

Where vLLM differs from tracengine's block manager and scheduler:
- block 0 is vLLM's null block (`BlockPool.null_block`), never free: N
  configured blocks are N-1 usable;
- its free queue puts a freed block without a hash at the head and a hashed
  one at the tail (`BlockPool.free_blocks`), so a block is taken from
  wherever the events say, not only from the head;
- scheduling does not reorder `running`;
- a step's verified drafts (SpecDecode, before its decision) are computed
  beside its token; the accepted ones (SpecAccepted) are kept;
- with async scheduling step k+1 is scheduled before step k's output comes
  back, so a request that finished in step k's output can be in step k+1's
  batch: it is left as it is (vLLM drops that output); a block step k+1
  gave it is freed with it, in step k's frame, before the frame that gives it;
- a KV connector's asynchronous load (ConnectorMatched with load_async) gives a waiting
  request its blocks and leaves it waiting until its transfer is done; admitted then, it is given
  the rest (a second BlockAllocate, after the blocks it holds); a finished request whose blocks
  the connector keeps for a send frees them in a later step. The connector's answers and
  grammars change no block or queue themselves.
- a hybrid model's KV cache groups share the block pool: a block event of group g > 0 changes
  the pool and the request's table in that group (`group_tables`), never its tokens; BlockSkip
  gives back blocks a request keeps the place of (out of a sliding window, an older Mamba state)."""
import msgspec

from tracengine.replay.projection import Keyframe, Projection
from tracengine.replay.state import FINISHED, WAITING
from tracengine.trace.events import (BlockAllocate, BlockAppend, BlockFree, ScheduledSeq, ScheduleDecision, SeqFinish,
                                     SpecAccepted, SpecDecode, prefill_flags)
from tracengine.trace.vllm_events import VLLM_INPUT_EVENTS, BlockSkip

NULL_BLOCK_ID = 0


class VllmKeyframe(Keyframe, frozen=True, gc=False):
    group_tables: dict         # group -> seq_id -> its blocks in that group (groups past the first)


class VllmProjection(Projection):

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.spec_tokens: dict[int, int] = {}    # seq_id -> drafts verified in the step whose decision comes next
        # a hybrid model's groups past the first: group -> seq_id -> the blocks it holds there
        self.group_tables: dict[int, dict[int, list[int]]] = {}
        for event_type in VLLM_INPUT_EVENTS:
            self.handlers[event_type] = _no_change
        self.handlers.update({SpecDecode: self.spec_decode, SpecAccepted: self.spec_accepted,
                              BlockAllocate: self.block_allocate, BlockSkip: self.block_skip})

    def keyframe(self, step: int) -> Keyframe:
        kf = super().keyframe(step)
        if not self.group_tables:
            return kf
        return VllmKeyframe(*msgspec.structs.astuple(kf), {
            g: {s: list(t) for s, t in tables.items()} for g, tables in self.group_tables.items()})

    @classmethod
    def from_keyframe(cls, kf: Keyframe, block_size: int) -> "VllmProjection":
        p = super().from_keyframe(kf, block_size)
        p.group_tables = {g: {s: list(t) for s, t in tables.items()}
                          for g, tables in getattr(kf, "group_tables", {}).items()}
        return p

    def state(self, step: int, decision):
        state = super().state(step, decision)
        state.group_tables = self.group_tables
        return state

    def block_skip(self, e: BlockSkip):
        """Given back whatever the request's state: with async scheduling the step that skips them may be
        scheduled before the output that finishes it, whose BlockFree (written first) holds them no more."""
        table = self.seqs[e.seq_id].block_table if e.group == 0 else \
            self.group_tables.setdefault(e.group, {}).get(e.seq_id, [])
        skipped = set(e.block_ids)
        table[:] = [b for b in table if b not in skipped]
        self.pool.free_blocks(e.block_ids)

    def _take_new_blocks(self, block_ids: list[int]):
        """Each block wherever it is in the free queue (vLLM's order is not the fold's)."""
        take = self.pool.take_block
        for block_id in block_ids:
            take(block_id)
        self.prefix_cache.evict(block_ids)

    def scheduled_when_finished(self, seq_id: int) -> bool:
        seq = self.seqs.get(seq_id)
        return seq is not None and seq.status == FINISHED

    def block_free(self, e: BlockFree):
        held = self.seqs[e.seq_id].block_table if e.group == 0 else \
            self.group_tables.get(e.group, {}).pop(e.seq_id, [])
        if len(e.block_ids) > len(held):    # blocks the next step gave it, whose frame comes after this one
            kept = set(held)
            e = msgspec.structs.replace(e, block_ids=[b for b in e.block_ids if b in kept])
        if e.group:
            self.pool.free_blocks(e.block_ids)
        else:
            super().block_free(e)

    def block_allocate(self, e: BlockAllocate):
        if self.seqs[e.seq_id].status == FINISHED:    # taken and freed already (block_free), as block_append
            return
        if e.group:
            self.pool.touch(e.block_ids[:e.num_cached_blocks])
            self._take_new_blocks(e.block_ids[e.num_cached_blocks:])
            self.group_tables.setdefault(e.group, {})[e.seq_id] = list(e.block_ids)
            return
        held = self.seqs[e.seq_id].block_table
        super().block_allocate(e)
        if held:          # admitted after its connector's load: the blocks it held, then these
            s = self.seqs[e.seq_id]
            s.block_table = held + s.block_table

    def seq_finish(self, e: SeqFinish):
        if self.seqs[e.seq_id].status == WAITING:    # ended with an error before it ran (its grammar failed)
            self.waiting.remove(e.seq_id)
            self.running.append(e.seq_id)
        super().seq_finish(e)

    def block_append(self, e: BlockAppend):
        if self.seqs[e.seq_id].status == FINISHED:     # taken and freed already (block_free)
            return
        if e.group:
            self._take_new_blocks([e.block_id])
            self.group_tables.setdefault(e.group, {}).setdefault(e.seq_id, []).append(e.block_id)
        else:
            super().block_append(e)

    def spec_decode(self, e: SpecDecode):
        self.spec_tokens = dict(zip(e.seq_ids, e.num_spec_tokens))

    def spec_accepted(self, e: SpecAccepted):
        """The accepted drafts are computed tokens the request keeps (the rejected ones vLLM rolls back)."""
        for seq_id, a in zip(e.seq_ids, e.num_accepted):
            s = self.seqs[seq_id]
            if s.status != FINISHED:
                s.num_tokens += a
                s.num_cached_tokens += a

    def schedule_decision(self, e: ScheduleDecision):
        if not self.spec_tokens:
            return self._schedule_decision(e)
        # a verification computes its drafts beside its one token: the drafts apart
        spec, self.spec_tokens = self.spec_tokens, {}
        self._schedule_decision(msgspec.structs.replace(e, seqs=[
            ScheduledSeq(ss.seq_id, ss.num_tokens - spec.get(ss.seq_id, 0), ss.num_cached_tokens) for ss in e.seqs]))
        self.decision = e

    def _schedule_decision(self, e: ScheduleDecision):
        seqs = self.seqs
        live = [(ss, p) for ss, p in zip(e.seqs, prefill_flags(e)) if seqs[ss.seq_id].status != FINISHED]
        if len(live) != len(e.seqs):
            num_decode_seqs = sum(1 for _, p in live if not p)
            phase = "decode" if num_decode_seqs == len(live) else "prefill" if not num_decode_seqs else "mixed"
            e = msgspec.structs.replace(e, phase=phase, seqs=[ss for ss, _ in live],
                                        num_decode_seqs=num_decode_seqs if phase == "mixed" else 0)
        running = list(self.running)
        super().schedule_decision(e)
        if e.phase == "decode":
            self.running.clear()
            self.running.extend(running)    # vLLM schedules running in place
        else:
            self.decision = e


def _no_change(e) -> None:
    pass


def vllm_projection(num_blocks: int, block_size: int) -> VllmProjection:
    projection = VllmProjection(num_blocks, block_size)
    projection.pool.free_block_queue.remove(NULL_BLOCK_ID)
    return projection
