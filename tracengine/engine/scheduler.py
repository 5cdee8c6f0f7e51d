"""Which sequences run this step, and how many tokens each computes.

Prefill first, FIFO, never mixed with decode (the `prefill_first` policy, the
seeds' algorithm). Each exit of the prefill and decode loops is named by the
`stop_reason` it records. A policy of one's own subclasses Scheduler and
overrides the hooks at the end (docs/policies.md); engine/policies.py holds
`mixed` and the lookup of a policy by name."""
from collections import deque
from typing import Any, Final, Literal

from tracengine.engine.block_manager import BlockManager
from tracengine.engine.config import Config
from tracengine.errors import ConfigError, RequestError
from tracengine.trace.events import (AbortReason, DraftProposed, DraftVerified, FinishReason, Phase, Preempt,
                                     ScheduledSeq, ScheduleDecision, SeqAbort, SeqFinish, StopReason, TokenSample)
from tracengine.trace.sinks import NULL_SINK, EventSink, decode_seqs_kept
from tracengine.engine.sequence import Sequence, SequenceStatus
from tracengine.engine.spec_decode import PADDING_DRAFT
from tracengine.engine.native import mypyc_attr

# The events made per step, as module constants: Final, compiled, a C static each, not a lookup in the
# module's dict per use
SCHEDULE_DECISION: Final = ScheduleDecision
SCHEDULED_SEQ: Final = ScheduledSeq
TOKEN_SAMPLE: Final = TokenSample


@mypyc_attr(allow_interpreted_subclasses=True)     # a policy of one's own subclasses it
class Scheduler:
    _sink: EventSink
    token_kept: Any           # the sink's `token_kept`, or None (the sink's setter)
    emits_decode_seqs: bool   # (the sink's setter)

    def __init__(self, config: Config, sink: EventSink = NULL_SINK, block_manager: BlockManager | None = None) -> None:
        """`block_manager`: the KV blocks it schedules, under their block rules; None: the ones
        `make_block_manager` makes for the config."""
        if config.num_kvcache_blocks <= 0:
            raise ConfigError(f"num_kvcache_blocks must be resolved to a positive count, got {config.num_kvcache_blocks}")
        # typed here: a Config is dynamic to the compiled core, and these are read per sequence a step
        self.max_num_seqs: int = config.max_num_seqs
        self.max_num_batched_tokens: int = config.max_num_batched_tokens
        self.max_model_len: int = config.max_model_len
        self.eos: int = config.eos
        self.block_size: int = config.kvcache_block_size
        self.block_manager = block_manager if block_manager is not None else self.make_block_manager(config, sink)
        self.waiting: deque[Sequence] = deque()   # not fully prefilled: new, mid-chunk, preempted
        self.running: deque[Sequence] = deque()   # prefilled, decoding
        self.loading: deque[Sequence] = deque()   # set aside while the CPU tier loads their blocks (policies.py)
        self.cpu_tier: Any = self.block_manager.cpu_tier   # KV offloading's CPU tier (engine/cpu_tier.py), or None
        self.sink = sink     # (the property below)
        self.step = 0   # the engine's step, stamped on events: set by `begin_step`
        self.num_preemptions = 0   # over the scheduler's life (a server's metrics read it)
        # Speculative decoding (engine/spec_decode.py): drafts are scheduled as tokens of a decode;
        # KV slots past them for a drafter that writes ahead: none for ngram (vLLM's num_lookahead_tokens)
        self.num_speculative_tokens: int = config.num_speculative_tokens
        self.num_lookahead_tokens = 0

    @property
    def sink(self) -> EventSink:
        return self._sink

    @sink.setter
    def sink(self, sink: EventSink) -> None:
        """Where the events go, and what of them the sink reads, known when it is set, not asked
        each step (trace/sinks.py): its `token_kept`, taken for each kept token instead of its
        TokenSample, and whether it reads a decode step's sequences."""
        self._sink = sink
        self.token_kept = getattr(sink, "token_kept", None) if sink.enabled else None
        self.emits_decode_seqs = decode_seqs_kept(sink)

    @classmethod
    def make_block_manager(cls, config: Config, sink: EventSink = NULL_SINK) -> BlockManager:
        """The block manager of a policy's own under `config`: the seeds' (nano-vllm's) block rules."""
        return BlockManager(config.num_kvcache_blocks, config.kvcache_block_size, sink, config.enable_prefix_caching)

    def begin_step(self, step: int) -> None:
        self.step = self.block_manager.step = step

    def is_finished(self) -> bool:
        return not self.waiting and not self.running and not self.loading

    def check_request(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Refuse a request that could never be served, instead of stalling on it."""
        if num_prompt_tokens == 0:
            raise RequestError("empty prompt")
        if num_prompt_tokens > self.max_model_len:
            raise RequestError(f"prompt of {num_prompt_tokens} tokens is longer than max_model_len={self.max_model_len}")
        longest = min(num_prompt_tokens + max_tokens, self.max_model_len)
        num_blocks = (longest + self.block_size - 1) // self.block_size
        num_total = self.block_manager.num_blocks
        if num_blocks > num_total:
            raise RequestError(
                f"request of {num_prompt_tokens} prompt + {max_tokens} max tokens needs {num_blocks} KV blocks "
                f"of {self.block_size} tokens; the cache has {num_total}")

    def add(self, seq: Sequence) -> None:
        self.check_request(seq.num_prompt_tokens, seq.max_tokens)
        self.waiting.append(seq)

    def schedule(self) -> tuple[list[Sequence], bool]:
        self.order_waiting()
        scheduled_seqs: list[Sequence] = []
        num_batched_tokens = 0
        stop_reason: StopReason
        blocked_seq_id, num_blocks_needed = -1, 0

        while self.waiting and len(scheduled_seqs) < self.max_num_seqs:
            seq = self.waiting[0]
            remaining = self.max_num_batched_tokens - num_batched_tokens
            if remaining == 0:
                stop_reason = "budget_exhausted"
                break
            if not seq.block_table:    # first schedule, or after preemption
                if not self.admit(seq):
                    stop_reason = "not_admitted"   # a policy's refusal, no head-of-line block
                    break
                # can_allocate, keeping the count of blocks needed for the record
                hits = self.block_manager.cached_block_ids(seq)
                num_new_blocks = self.block_manager.num_blocks_needed(seq, hits)
                if num_new_blocks > self.block_manager.num_free_blocks:
                    # head-of-line block: shorter requests behind it wait too
                    stop_reason, blocked_seq_id, num_blocks_needed = "no_free_blocks", seq.seq_id, num_new_blocks
                    break
                num_tokens = seq.num_tokens - len(hits) * self.block_size
            else:                      # the rest of a chunked prefill; its blocks are allocated
                num_tokens = seq.num_tokens - seq.num_cached_tokens
            if remaining < num_tokens and scheduled_seqs:  # only allow chunked prefill for the first seq
                stop_reason, blocked_seq_id = "chunk_gate", seq.seq_id
                break
            if not seq.block_table:
                self.block_manager.allocate(seq, hits)
                num_tokens = seq.num_tokens - seq.num_cached_tokens   # a transfer's tokens are computed
            seq.num_scheduled_tokens = min(num_tokens, remaining)
            num_batched_tokens += seq.num_scheduled_tokens
            if seq.num_cached_tokens + seq.num_scheduled_tokens == seq.num_tokens:
                seq.status = SequenceStatus.RUNNING   # the whole prompt is computed this step
                self.waiting.popleft()
                self.running.append(seq)
            scheduled_seqs.append(seq)
        else:
            stop_reason = "max_num_seqs" if self.waiting else "waiting_empty"

        num_free_blocks = self.block_manager.num_free_blocks   # when the prefill loop stopped
        if scheduled_seqs:
            self._emit_decision("prefill", scheduled_seqs, num_batched_tokens, stop_reason,
                                blocked_seq_id, num_blocks_needed, num_free_blocks)
            return scheduled_seqs, True

        # Decode: the running sequences in order, one token each, up to max_num_seqs; they go
        # back to the head of running in the same order. A sequence's drafts are tokens too, as
        # many as the token budget leaves after its one (the seeds' decode ignores the budget).
        scheduled_seqs = []
        num_batched_tokens = 0
        popleft = self.running.popleft     # looked up once a step: policies.py says why
        while self.running and len(scheduled_seqs) < self.max_num_seqs:
            seq = popleft()
            num_drafts = 0
            if seq.spec_token_ids:
                num_drafts = self.num_drafts(seq, self.max_num_batched_tokens - num_batched_tokens - 1)
            if self._append_slot(seq, num_drafts):
                seq.num_scheduled_tokens = 1 + num_drafts
                seq.is_prefill = False
                num_batched_tokens += seq.num_scheduled_tokens
                scheduled_seqs.append(seq)
        stop_reason = "max_num_seqs" if self.running else "running_empty"
        self.running.extendleft(reversed(scheduled_seqs))
        assert scheduled_seqs, "nothing schedulable: check_request should have refused a request"
        self._emit_decision("decode", scheduled_seqs, num_batched_tokens, stop_reason,
                            blocked_seq_id, num_blocks_needed, num_free_blocks)
        return scheduled_seqs, False

    def num_drafts(self, seq: Sequence, room: int) -> int:
        """The drafts of `seq` this step verifies, given `room` tokens of budget for them, and its
        drafts cut to those (vLLM's scheduled_spec_decode_tokens): no more than fit the budget, and
        none whose position reaches max_model_len (vLLM caps the tokens at max_model_len - 1)."""
        num_drafts = max(0, min(len(seq.spec_token_ids), room, self.max_model_len - seq.num_tokens - 1))
        del seq.spec_token_ids[num_drafts:]
        return num_drafts

    def _emit_decision(self, phase: Phase, seqs: list[Sequence], num_batched_tokens: int,
                       stop_reason: StopReason | None, blocked_seq_id: int, num_blocks_needed: int,
                       num_free_blocks: int, num_decode_seqs: int = 0) -> None:
        """`num_decode_seqs`: a "mixed" decision's leading decode sequences."""
        if not self.sink.enabled:
            return
        scheduled_seq = SCHEDULED_SEQ
        # a decode step's sequences, for a sink that reads them (trace/sinks.py: a lean live fold does not)
        scheduled = ([scheduled_seq(s.seq_id, s.num_scheduled_tokens, s.num_cached_tokens) for s in seqs]
                     if phase != "decode" or self.emits_decode_seqs else [])
        self.sink.emit(SCHEDULE_DECISION(
            self.step, phase, scheduled,
            num_batched_tokens, stop_reason, blocked_seq_id, num_blocks_needed,  # type: ignore[arg-type]  # mixed's: set
            num_free_blocks, len(self.waiting) + len(self.loading), len(self.running), num_decode_seqs))

    def _append_slot(self, seq: Sequence, num_drafts: int = 0) -> bool:
        """Room for the token `seq` decodes (the seeds' loop) and its `num_drafts` drafts: a token
        past its blocks needs a free block, and while there are too few the running tail is
        preempted for them (`self.running` holds the sequences not scheduled yet), or `seq` itself
        when nobody is left behind it (False then). A verify step's rejected drafts leave their
        blocks to the sequence (vLLM's rollback keeps the slots), so a later token may have one."""
        if self.num_speculative_tokens:
            num_new_blocks = -(-(seq.num_tokens + num_drafts) // self.block_size) - len(seq.block_table)
        else:       # one token, which needs a block when it is the first of one
            num_new_blocks = 0 if (seq.num_tokens - 1) % self.block_size else 1
        if num_new_blocks <= 0:
            return True     # the tokens land in the sequence's blocks, which have room
        while self.block_manager.num_free_blocks < num_new_blocks:
            if self.running:
                self.preempt(self.preempt_victim(seq), by=seq)   # the running tail gives way
            else:
                self.preempt(seq, by=seq)                        # nobody else left: itself
                return False
        if self.num_speculative_tokens:
            self.block_manager.append_blocks(seq, num_new_blocks)
        else:
            self.block_manager.may_append(seq)
        return True

    def preempt(self, seq: Sequence, by: Sequence) -> None:
        """Recomputation: free the KV and go back to the head of waiting."""
        if self.sink.enabled:
            self.sink.emit(Preempt(self.step, seq.seq_id, by.seq_id, seq.block_table[::-1],
                                   seq.num_cached_tokens))
        if self.cpu_tier is not None:
            self.cpu_tier.preempted(seq.seq_id)
        seq.status = SequenceStatus.WAITING
        seq.is_prefill = True
        seq.spec_token_ids = []     # vLLM's _preempt_request drops them: a resumed sequence prefills first
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.block_manager.deallocate(seq)
        self.waiting.appendleft(seq)

    def postprocess(self, seqs: list[Sequence], token_ids: list[Any], is_prefill: bool) -> list[Sequence]:
        """Write the sampled tokens back; returns the sequences that finished. (`is_prefill`, the
        step's phase, is for a policy that overrides this; the rules here need only the counts.)
        A token is an int, or a verify step's list of them (a sequence with drafts)."""
        finished: list[Sequence] = []
        block_size = self.block_size
        emit = self.sink.emit if self.sink.enabled else None     # looked up once a step, not once a token
        # a sink that only folds the figures takes a kept token without its event (trace/sinks.py)
        token_kept = self.token_kept
        # Once a step too, not once a token (compiled): the event's class and its step as an object (an
        # int field is boxed for each event); the token goes into its event as the runner gave it, the
        # object, not unboxed and boxed again.
        token_sample = TOKEN_SAMPLE
        step: object = self.step
        for seq, sampled in zip(seqs, token_ids):
            if seq.spec_token_ids:
                self._append_verified(seq, sampled, finished)
                continue
            token_id: int = sampled
            num_computed = seq.num_cached_tokens + seq.num_scheduled_tokens
            if seq.num_cached_tokens // block_size != num_computed // block_size:
                self.block_manager.hash_blocks(seq)     # this step filled a block: register it
            seq.num_cached_tokens = num_computed
            seq.num_scheduled_tokens = 0
            if num_computed < seq.num_tokens:
                # a middle chunk: its sample is not at the end of the prompt, and is dropped
                if emit is not None and token_kept is None:
                    emit(token_sample(step, seq.seq_id, sampled, False))
                continue
            seq.append_token(token_id)
            if token_kept is not None:
                token_kept(step, seq.seq_id)
            elif emit is not None:
                emit(token_sample(step, seq.seq_id, sampled, True))
            if token_id == self.eos and not seq.ignore_eos:
                self._finish(seq, "eos", finished)
            elif seq.num_completion_tokens == seq.max_tokens or seq.num_tokens >= self.max_model_len:
                self._finish(seq, "length", finished)
        return finished

    def _append_verified(self, seq: Sequence, token_ids: list[int], finished: list[Sequence]) -> None:
        """A verify step's tokens (its kept drafts and the model's next token), as vLLM's
        update_from_output takes them: the rejected drafts' computed tokens rolled back (their
        slots stay the sequence's), the tokens appended up to a stop (the rest dropped), then the
        blocks the kept tokens filled registered, before a finished sequence frees them."""
        num_drafts, num_accepted = len(seq.spec_token_ids), len(token_ids) - 1
        emit = self.sink.emit if self.sink.enabled else None     # looked up once a sequence, not once a token
        if emit is not None:
            emit(DraftVerified(self.step, seq.seq_id, num_drafts, num_accepted, seq.spec_token_ids[0] == PADDING_DRAFT))
        seq.spec_token_ids = []
        num_computed_before = seq.num_cached_tokens
        num_computed = num_computed_before + seq.num_scheduled_tokens - (num_drafts - num_accepted)
        seq.num_scheduled_tokens = 0
        reason: FinishReason | None = None
        for i, token_id in enumerate(token_ids):
            seq.append_token(token_id)
            if emit is not None:
                emit(TokenSample(self.step, seq.seq_id, token_id, True))
            if token_id == self.eos and not seq.ignore_eos:
                reason = "eos"
            elif seq.num_completion_tokens == seq.max_tokens or seq.num_tokens >= self.max_model_len:
                reason = "length"
            if reason is not None:
                num_computed -= len(token_ids) - 1 - i      # the tokens after the stop are dropped
                break
        self.block_manager.hash_verified_blocks(seq, num_computed_before, num_computed)
        seq.num_cached_tokens = num_computed
        if reason is not None:
            self._finish(seq, reason, finished)

    def update_draft_token_ids(self, seqs: list[Sequence], proposer: Any) -> None:
        """After a step: the drafts `proposer` gives each of `seqs`, the scheduled sequences that
        sampled a token (vLLM drops those of a sequence still in prefill), that goes on, for its next step."""
        emit = self.sink.emit if self.sink.enabled else None
        for seq in seqs:
            if seq.status != SequenceStatus.RUNNING:
                continue
            seq.spec_token_ids = drafts = proposer.propose(seq)
            if drafts and emit is not None:
                emit(DraftProposed(self.step, seq.seq_id, len(drafts), [] if drafts[0] < 0 else list(drafts)))

    def _finish(self, seq: Sequence, reason: FinishReason, finished: list[Sequence]) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if self.sink.enabled:
            self.sink.emit(SeqFinish(self.step, seq.seq_id, reason, seq.num_prompt_tokens,
                                     seq.num_completion_tokens))
        self.block_manager.deallocate(seq)
        self.running.remove(seq)
        finished.append(seq)
        if self.cpu_tier is not None:
            self.cpu_tier.request_finished(seq.seq_id)

    def abort(self, seq_id: int, reason: AbortReason) -> Sequence | None:
        """Take a sequence out of whichever queue holds it and free its blocks, as vLLM's
        abort_request does; the seeds define no abort, so this is an extension of them.
        Called between steps only. Returns the sequence, or None when no queue holds it
        (it has finished, or it was never added)."""
        queues: tuple[tuple[deque[Sequence], Literal["waiting", "running"]], ...] = (
            (self.waiting, "waiting"), (self.running, "running"), (self.loading, "waiting"))
        for queue, status in queues:
            seq = next((s for s in queue if s.seq_id == seq_id), None)
            if seq is not None:
                break
        else:
            return None
        queue.remove(seq)
        if self.sink.enabled:
            self.sink.emit(SeqAbort(self.step, seq_id, reason, status, seq.num_prompt_tokens,
                                    seq.num_completion_tokens))
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "abort"
        seq.spec_token_ids = []
        if seq.block_table:      # a preempted or never-scheduled sequence holds none
            self.block_manager.deallocate(seq)
        if self.cpu_tier is not None:
            self.cpu_tier.drop(seq_id)
            self.cpu_tier.request_finished(seq_id)
        return seq

    # -- policy hooks: a subclass overrides these to serve in another order (docs/policies.md) --

    def order_waiting(self) -> None:
        """Called first in every `schedule`: may reorder `self.waiting` in place. Under
        prefill_first a sequence in the middle of a chunked prefill holds its blocks and
        must stay at the head. Default: FIFO (preempted sequences at the head)."""

    def admit(self, seq: Sequence) -> bool:
        """Whether the waiting head `seq` (holding no blocks) may start this step; False
        stops admission for the step (stop reason "not_admitted"). Default: always."""
        return True

    def preempt_victim(self, seq: Sequence) -> Sequence:
        """Remove and return the sequence of `self.running` that frees its blocks because
        `seq` needs one. `self.running` holds, at that moment, the sequences not yet
        scheduled this step, and is not empty. Default: the tail, the newest admitted."""
        return self.running.pop()
