"""The fold's projection: what the scheduler and the block manager did (queues, block tables,
and the engine's own block pool and prefix cache, engine/block_pool.py and prefix_cache.py),
one handler per event, and the keyframe it is saved to and restored from. A handler applies
the recorded decision through the pool's and the cache's operations, so each block rule
(which block is handed out next, where a freed block goes, what registering a hash
supersedes) is the engine's, checked against the record. nano-vllm's block rules; the other
rules a trace may have run under subclass it (block_rules_fold.py)."""
from collections import deque
from itertools import islice

import msgspec

from tracengine.engine.block_manager import BlockManager
from tracengine.engine.block_pool import BlockPool
from tracengine.engine.hash_id_prompt import hashed_blocks
from tracengine.engine.prefix_cache import PrefixCache
from tracengine.engine.spec_decode import SYNTHETIC_DRAFT
from tracengine.trace.events import (BlockAllocate, BlockAppend, BlockFree, BlockHash, CpuHit, CpuLoad, CpuStore,
                                     DraftProposed, DraftVerified, Preempt, PromptBlocksHashed, RequestAdded,
                                     ScheduleDecision, SeqAbort, SeqFinish, SpecAccepted, SpecDecode, SpecDraft, StepEnd,
                                     TokenSample, prefill_flags)
from tracengine.replay.state import FINISHED, RUNNING, WAITING, CpuTierState, FoldState, SeqState


class Keyframe(msgspec.Struct, frozen=True, gc=False):
    step: int                  # the state after this step
    seqs: dict                 # seq_id -> SeqState, never mutated again
    waiting: tuple
    running: tuple
    pool: BlockPool            # copies, never mutated again
    prefix_cache: PrefixCache
    decision: object
    cpu_num_blocks: int        # the CPU tier's blocks (its hashes: the history, shared, by step)
    cpu_loading: dict          # seq_id -> (first block, blocks) of the sequences set aside to load
    cpu_history: object


class Projection:
    """The mutable state that events are applied to."""
    # the block manager whose rules the trace was recorded under: its pool and prefix cache are the fold's
    block_rules: type[BlockManager] = BlockManager

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.seqs: dict[int, SeqState] = {}
        self.waiting: deque[int] = deque()
        self.running: deque[int] = deque()
        # every block has its slots from the start: a state shows every block
        self.prefix_cache = self.block_rules.new_prefix_cache(num_blocks, block_size)
        self.prefix_cache.hold_every_block()
        self.pool = self.block_rules.new_pool(num_blocks, self.prefix_cache)
        self.pool.hold_every_block()
        self.decision = None
        # The CPU tier (engine/cpu_tier.py): its block count, the sequences set aside while they
        # load, and its history: hash -> the steps it was stored and evicted at, alternately
        # (append-only and shared by every keyframe, so a keyframe does not copy the tier; a
        # projection restored from one reads it and leaves it alone)
        self.cpu_num_blocks = 0
        self.cpu_loading: dict[int, tuple[int, int]] = {}
        self.cpu_history: dict[int, list[int]] = {}
        self.cpu_live = True
        self.handlers = {
            RequestAdded: self.request_added, ScheduleDecision: self.schedule_decision,
            BlockAllocate: self.block_allocate, BlockAppend: self.block_append, BlockHash: self.block_hash,
            PromptBlocksHashed: self.prompt_blocks_hashed,
            BlockFree: self.block_free, Preempt: self.preempt, TokenSample: self.token_sample,
            SeqFinish: self.seq_finish, StepEnd: self.step_end, SeqAbort: self.seq_abort,
            # drafts change no block or queue (vLLM's scheduler counts verified drafts in num_tokens)
            SpecDraft: _no_change, SpecDecode: _no_change, SpecAccepted: _no_change,
            DraftProposed: self.draft_proposed, DraftVerified: self.draft_verified,
            CpuStore: self.cpu_store, CpuHit: self.cpu_hit, CpuLoad: self.cpu_load,
        }

    @property
    def ref_counts(self) -> list[int]:
        return self.pool.ref_counts

    @property
    def free(self):
        return self.pool.free_block_queue

    @property
    def hashes(self) -> list[int | None]:
        """Every block's hash, None where it holds none (the prefix cache's own list)."""
        return self.prefix_cache.hashes

    @property
    def hash_to_block_id(self) -> dict[int, int]:
        return self.prefix_cache.hash_to_block_id

    # -- keyframes --------------------------------------------------------------------------

    def keyframe(self, step: int) -> Keyframe:
        prefix_cache = self.prefix_cache.copy()
        kf = Keyframe(step, dict(self.seqs), tuple(self.waiting), tuple(self.running), self.pool.copy(prefix_cache),
                       prefix_cache, self.decision, self.cpu_num_blocks, dict(self.cpu_loading), self.cpu_history)
        self._own_live_seqs(kf)
        return kf

    @classmethod
    def from_keyframe(cls, kf: Keyframe, block_size: int) -> "Projection":
        p = cls(0, block_size)
        p.seqs = dict(kf.seqs)
        p.waiting, p.running = deque(kf.waiting), deque(kf.running)
        p.prefix_cache = kf.prefix_cache.copy()
        p.pool = kf.pool.copy(p.prefix_cache)
        p.decision = kf.decision
        p.cpu_num_blocks, p.cpu_loading = kf.cpu_num_blocks, dict(kf.cpu_loading)
        p.cpu_history, p.cpu_live = kf.cpu_history, False
        p._own_live_seqs(kf)
        return p

    def _own_live_seqs(self, kf: Keyframe):
        """Copy the sequences later events can change, so the keyframe's stay as they are.
        A finished sequence changes no more."""
        seqs = self.seqs
        for seq_id in (*kf.waiting, *kf.running):
            seqs[seq_id] = seqs[seq_id]._copy()

    def state(self, step: int, decision: ScheduleDecision | None) -> FoldState:
        """A value: the projection must not be used after this."""
        seqs = self.seqs
        for ss in decision.seqs if decision is not None else ():
            seqs[ss.seq_id] = msgspec.structs.replace(seqs[ss.seq_id], num_scheduled_tokens=ss.num_tokens)
        return FoldState(step, list(self.waiting), list(self.running), seqs, list(self.ref_counts),
                         self.prefix_cache.every_hash(),
                         list(self.free), self.hash_to_block_id, decision, self.block_size,
                         cpu=CpuTierState(step, self.cpu_num_blocks, dict(self.cpu_loading), self.cpu_history))

    # -- events, as the scheduler and block manager produced them ------------------------------

    def request_added(self, e: RequestAdded):
        n = e.num_prompt_tokens
        self.seqs[e.seq_id] = SeqState(e.seq_id, WAITING, n, n, arrival_step=e.step, block_table=[])
        self.waiting.append(e.seq_id)

    def schedule_decision(self, e: ScheduleDecision):
        """The decision and, since they follow from it, its TokenSamples: each scheduled
        sequence computes its tokens, and keeps a sample where it reaches its end.
        (`num_scheduled_tokens` is filled in by `state`, from the decision.)"""
        seqs = self.seqs
        self.decision = e
        if e.phase != "decode":
            waiting, running, step = self.waiting, self.running, e.step
            incomplete = []    # scheduled from waiting, prompt not done: prefill_first keeps them there
            for ss, is_prefill in zip(e.seqs, prefill_flags(e)):
                s = seqs[ss.seq_id]
                if not is_prefill:                  # a decode token in a mixed batch
                    s.num_cached_tokens = ss.num_cached_tokens + 1
                    s.num_tokens += 1
                    if s.draft_token_ids:           # the drafts it verifies: the tokens past its one
                        del s.draft_token_ids[ss.num_tokens - 1:]
                    continue
                # the whole prompt is computed (with a padded verify's placeholders: past it); else a middle chunk
                complete = ss.num_cached_tokens + ss.num_tokens >= s.num_tokens
                s.num_cached_tokens = min(ss.num_cached_tokens + ss.num_tokens, s.num_tokens)
                if complete:
                    s.num_tokens += 1
                    if s.first_token_step == -1:
                        s.first_token_step = step
                if s.status != WAITING:
                    continue                        # the mixed policy's prefill in running
                if complete:
                    self._admit(s)
                else:
                    incomplete.append(s)
            # The mixed policy moves an admitted sequence to running before its prompt is done:
            # the queue lengths the decision records say so (both 0: not recorded, version 1).
            if incomplete and (e.num_waiting or e.num_running):
                for s in incomplete[:len(waiting) - e.num_waiting]:
                    self._admit(s)
        else:
            for ss in e.seqs:
                s = seqs[ss.seq_id]
                s.num_cached_tokens = ss.num_cached_tokens + 1
                s.num_tokens += 1
                if s.draft_token_ids:
                    del s.draft_token_ids[ss.num_tokens - 1:]
            # decode takes running from the head; what it scheduled goes back to the head, in order
            ids = [ss.seq_id for ss in e.seqs]
            if list(islice(self.running, len(ids))) != ids:
                chosen = set(ids)
                self.running = deque(ids + [i for i in self.running if i not in chosen])

    def _admit(self, s: SeqState):
        waiting = self.waiting
        if waiting[0] == s.seq_id:
            waiting.popleft()
        else:
            waiting.remove(s.seq_id)
        self.running.append(s.seq_id)
        s.status = RUNNING

    def scheduled_when_finished(self, seq_id: int) -> bool:   # vLLM's async scheduling: replay/vllm_fold.py
        return False

    def _take_new_blocks(self, block_ids: list[int]):
        """The blocks the pool hands out next, as the record says, their cached content
        overwritten."""
        take = self.pool.take_next_block
        for block_id in block_ids:
            take(block_id)
        self.prefix_cache.evict(block_ids)

    def block_allocate(self, e: BlockAllocate):
        self.pool.touch(e.block_ids[:e.num_cached_blocks])    # the prefix-cache hits
        self._take_new_blocks(e.block_ids[e.num_cached_blocks:])
        s = self.seqs[e.seq_id]
        s.block_table = list(e.block_ids)
        s.num_cached_tokens = e.num_cached_blocks * self.block_size

    def block_append(self, e: BlockAppend):
        self._take_new_blocks([e.block_id])
        self.seqs[e.seq_id].block_table.append(e.block_id)

    def block_hash(self, e: BlockHash):
        self.prefix_cache.insert([e.block_id], [e.hash])

    def prompt_blocks_hashed(self, e: PromptBlocksHashed):
        if e.block_size != self.block_size:
            raise ValueError(f"blocks of {e.block_size} tokens in a pool of blocks of {self.block_size}")
        events = hashed_blocks(e)
        self.prefix_cache.insert([b.block_id for b in events], [b.hash for b in events])

    def block_free(self, e: BlockFree):
        self.pool.free_blocks(e.block_ids)
        s = self.seqs[e.seq_id]
        s.block_table = []
        s.num_cached_tokens = 0

    def preempt(self, e: Preempt):
        running = self.running
        if running and running[-1] == e.seq_id:    # the running tail, or itself when it is the last
            running.pop()
        else:
            running.remove(e.seq_id)
        self.waiting.appendleft(e.seq_id)
        s = self.seqs[e.seq_id]
        s.status = WAITING
        s.num_preemptions += 1
        s.draft_token_ids = []

    def draft_proposed(self, e: DraftProposed):
        self.seqs[e.seq_id].draft_token_ids = list(e.draft_token_ids) or [SYNTHETIC_DRAFT] * e.num_draft_tokens

    def draft_verified(self, e: DraftVerified):
        """The drafts its decision scheduled (one token each, past the decoded one) are done
        with; the kept ones are tokens, computed (the rejected ones' computed tokens roll back)."""
        s = self.seqs[e.seq_id]
        s.draft_token_ids = []
        s.num_tokens += e.num_accepted_tokens
        s.num_cached_tokens += e.num_accepted_tokens

    def token_sample(self, e: TokenSample):
        pass    # applied with its ScheduleDecision

    def seq_finish(self, e: SeqFinish):
        s = self.seqs[e.seq_id]
        s.status = FINISHED
        s.finish_step = e.step
        s.finish_reason = e.reason
        self.running.remove(e.seq_id)

    def seq_abort(self, e: SeqAbort):
        (self.waiting if e.status == WAITING else self.running).remove(e.seq_id)
        s = self.seqs[e.seq_id]
        s.status = FINISHED
        s.finish_step = e.step
        s.finish_reason = "abort"
        s.draft_token_ids = []

    # -- the CPU tier -----------------------------------------------------------------------------

    def _in_cpu(self, h: int) -> bool:
        return len(self.cpu_history.get(h, ())) % 2 == 1

    def cpu_store(self, e: CpuStore):
        if self.cpu_live:
            history = self.cpu_history
            for h in e.evicted:
                if not self._in_cpu(h):
                    raise ValueError(f"block {h:#x} is evicted from the CPU tier, which does not hold it")
                history[h].append(e.step)
            for h in e.hashes:
                if self._in_cpu(h):
                    raise ValueError(f"block {h:#x} is stored in the CPU tier, which holds it")
                history.setdefault(h, []).append(e.step)
        self.cpu_num_blocks += len(e.hashes) - len(e.evicted)
        if e.seq_id not in self.seqs:
            raise KeyError(e.seq_id)

    def cpu_hit(self, e: CpuHit):
        if self.cpu_live:
            missing = [h for h in e.hashes if not self._in_cpu(h)]
            if missing:
                raise ValueError(f"block {missing[0]:#x} is loaded from the CPU tier, which does not hold it")
        if self.seqs[e.seq_id].status != WAITING:
            raise ValueError(f"seq {e.seq_id} loads from the CPU tier but is not waiting")
        self.cpu_loading[e.seq_id] = (e.first_block, len(e.hashes))

    def cpu_load(self, e: CpuLoad):
        if e.seq_id not in self.cpu_loading:
            raise ValueError(f"seq {e.seq_id} ends a load from the CPU tier it did not start")
        del self.cpu_loading[e.seq_id]
        self.seqs[e.seq_id].num_cached_tokens = e.num_cached_tokens

    def step_end(self, e: StepEnd):
        num_free_blocks = self.pool.num_free_blocks
        if e.num_free_blocks != num_free_blocks:
            raise ValueError(f"StepEnd says {e.num_free_blocks} free blocks, the events leave {num_free_blocks}")


def _no_change(e) -> None:
    pass
