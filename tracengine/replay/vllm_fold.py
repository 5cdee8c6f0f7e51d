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
  grammars change no block or queue themselves."""
import msgspec

from tracengine.replay.projection import Projection
from tracengine.replay.state import FINISHED, WAITING
from tracengine.trace.events import (BlockAllocate, BlockAppend, BlockFree, ScheduledSeq, ScheduleDecision, SeqFinish,
                                     SpecAccepted, SpecDecode, prefill_flags)
from tracengine.trace.vllm_events import VLLM_INPUT_EVENTS

NULL_BLOCK_ID = 0


class VllmProjection(Projection):

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.spec_tokens: dict[int, int] = {}    # seq_id -> drafts verified in the step whose decision comes next
        self.handlers[SpecDecode] = self.spec_decode
        self.handlers[SpecAccepted] = self.spec_accepted
        self.handlers[BlockAllocate] = self.block_allocate
        for event_type in VLLM_INPUT_EVENTS:
            self.handlers[event_type] = _no_change

    def _take_free_block(self, block_id: int):
        self.free.remove(block_id)       # a ValueError if it is not free
        h = self.hashes[block_id]
        if h != -1 and self.hash_to_block_id.get(h) == block_id:
            del self.hash_to_block_id[h]
        self.hashes[block_id] = -1
        self.ref_counts[block_id] = 1

    def scheduled_when_finished(self, seq_id: int) -> bool:
        seq = self.seqs.get(seq_id)
        return seq is not None and seq.status == FINISHED

    def block_free(self, e: BlockFree):
        held = self.seqs[e.seq_id].block_table
        if len(e.block_ids) > len(held):    # blocks the next step gave it, whose frame comes after this one
            kept = set(held)
            e = msgspec.structs.replace(e, block_ids=[b for b in e.block_ids if b in kept])
        super().block_free(e)

    def block_allocate(self, e: BlockAllocate):
        if self.seqs[e.seq_id].status == FINISHED:    # taken and freed already (block_free), as block_append
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
        if self.seqs[e.seq_id].status != FINISHED:     # else taken and freed already (block_free)
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
    projection.free.remove(NULL_BLOCK_ID)
    return projection
