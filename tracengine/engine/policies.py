"""Scheduling policies: `mixed` (vLLM V1's FCFS scheduler with chunked prefill)
and the lookup of a policy by name.

`prefill_first` is `Scheduler` itself (nano-vllm, vLLM V0): a step is all
prefill or all decode. `mixed` drops the phase split as vLLM V1 does
(vllm/v1/core/sched/scheduler.py): each step gives every request the tokens it
needs to catch up, under one token budget, so decode tokens and prefill
chunks share a batch:

1. running first, in order: a decoding sequence gets its one token, a
   sequence still in prefill the rest of its prompt or as much as the budget
   leaves (its next chunk). A sequence whose tokens need blocks and find too
   few free (a decode; under V1's block rules, below, a chunk too) preempts
   the tail of running by recomputation (V1's `self.running.pop()`), itself
   when nobody is left behind it;
2. then, unless a preemption happened this step (V1 admits nothing then),
   waiting in FIFO order into the budget left: each admitted sequence moves
   to running at once, even when only a chunk of it fits, which makes the
   chunked one the last admitted;
3. it stops on the token budget (`budget_exhausted`: used up, the last
   sequence perhaps cut to a chunk), `max_num_seqs` counted
   over running as V1 does, an empty waiting queue, a waiting head whose
   blocks do not fit (`no_free_blocks`: head-of-line, no skipping ahead), or
   a preemption (`preempted`).

Followed from V1: the running-then-waiting order, budget-limited chunks for
running and admitted requests alike, tail preemption, no admission in a step
that preempted, `max_num_seqs` as a cap on running, strict FCFS on a blocked
head. Left out: `long_prefill_token_threshold` (0 in V1 by default: no
cap on one request's chunk), `max_num_partial_prefills` (V1's scheduler has
no such limit; here at most one prefill is partial at a step's end, because
a partial chunk ends the budget), priorities, encoder inputs, KV connectors
and async scheduling.

Speculative decoding is V1's (engine/spec_decode.py): a decoding sequence's
drafts are tokens of its step (`num_tokens_with_spec - num_computed_tokens`),
cut to the budget left and below max_model_len, their slots allocated with
the step's (and `num_lookahead_tokens` past them: none for ngram); the
rejected ones' computed tokens are rolled back after the step and their
slots stay the sequence's. An admitted sequence with one token left to
compute is padded to 1 + K tokens with placeholder drafts, never kept, as V1
pads it (under V1's block rules).

The block rules are V1's too (`block_rules` "vllm", engine/vllm_block_manager.py):
admission checks that the whole sequence fits but allocates only the slots of
the tokens scheduled this step, as V1's `allocate_slots`; so a prefill chunk
in running needs blocks as a decode does, and preempts the tail when there
are none. With `block_rules` "nano-vllm" (the `mixed` traces recorded before
the field) a prompt's blocks are all allocated when it is admitted, and only
decodes preempt.

A step's ScheduleDecision has phase "prefill" or "decode" when its batch is
all one kind, "mixed" when it holds both, listing its decodes first
(`num_decode_seqs` of them: running keeps decoding sequences ahead of the one
still in prefill, so this is the order they were scheduled in); the engine
runs a mixed batch on the runner's general (prefill) path."""

from typing import cast

from tracengine.engine.config import BUILTIN_POLICY_NAMES, Config
from tracengine.engine.cpu_tier import CpuTier
from tracengine.engine.block_manager import BlockManager
from tracengine.engine.offload_scheduling import schedule_waiting
from tracengine.engine.scheduler import Scheduler
from tracengine.engine.sequence import Sequence, SequenceStatus
from tracengine.engine.spec_decode import PADDING_DRAFT
from tracengine.engine.vllm_block_manager import VllmBlockManager
from tracengine.engine.native import mypyc_attr
from tracengine.errors import ConfigError
from tracengine.trace.events import Phase, StopReason
from tracengine.trace.sinks import NULL_SINK, EventSink
from tracengine.engine.user_classes import class_name, load_class


@mypyc_attr(allow_interpreted_subclasses=True)     # a policy of one's own subclasses it
class MixedScheduler(Scheduler):
    """vLLM V1's FCFS scheduling with chunked prefill (the module docstring says what is followed).
    `seq.is_prefill` is True while a sequence still has prompt (or recompute) tokens to schedule."""

    @classmethod
    def make_block_manager(cls, config: Config, sink: EventSink = NULL_SINK) -> BlockManager:
        """vLLM V1's block rules (VllmBlockManager: slots for a step's tokens), or nano-vllm's for a
        trace recorded before the field (block_rules, below); with the CPU tier of KV offloading."""
        block_manager: BlockManager
        if block_rules(cls, config) == "vllm":
            block_manager = VllmBlockManager(config.num_kvcache_blocks, config.kvcache_block_size, sink,
                                             config.enable_prefix_caching)
        else:
            block_manager = super().make_block_manager(config, sink)
        if config.kv_offloading_size:
            block_manager.cpu_tier = make_cpu_tier(config, sink)
        return block_manager

    def schedule(self) -> tuple[list[Sequence], bool]:
        self.order_waiting()
        scheduled_seqs: list[Sequence] = []
        prefill_flags: list[bool] = []
        token_budget = self.max_num_batched_tokens
        stop_reason: StopReason | None = None
        blocked_seq_id, num_blocks_needed = -1, 0
        num_preemptions = self.num_preemptions
        per_chunk = self.block_manager.allocates_per_chunk

        # Running first: each gets the tokens it needs to catch up. Its popleft looked up once a step
        # (compiled, a method called by name is looked up per call); a policy's hooks change
        # `self.running` in place, never rebind it.
        popleft = self.running.popleft
        while self.running and token_budget > 0:
            seq = popleft()
            # the rest of its prompt or the chunk the budget leaves; a decoding one, its one token
            # and the drafts the budget leaves room for
            num_new_tokens = min(seq.num_tokens - seq.num_cached_tokens, token_budget) if seq.is_prefill else 1
            if seq.spec_token_ids:
                num_new_tokens += self.num_drafts(seq, token_budget - 1)
            if per_chunk:
                has_slots = self._allocate_slots(seq, num_new_tokens)
            else:            # the whole prompt was allocated at admission: only a decode needs a block
                has_slots = seq.is_prefill or self._append_slot(seq, num_new_tokens - 1)
            if not has_slots:
                break                           # it preempted itself
            seq.num_scheduled_tokens = num_new_tokens
            self._take(seq, scheduled_seqs, prefill_flags)
            token_budget -= seq.num_scheduled_tokens
        else:
            if self.running:           # the budget ran out before every running sequence had its tokens
                stop_reason = "budget_exhausted"
        num_scheduled_running = len(scheduled_seqs)     # so far, only running sequences are scheduled
        if self.running:
            self.running.extendleft(scheduled_seqs[::-1])
        else:           # every running sequence was scheduled (most steps): they go back in order
            self.running.extend(scheduled_seqs)

        if self.num_preemptions != num_preemptions:   # V1 admits nothing in a step that preempted
            stop_reason = "preempted"
        elif stop_reason is None and self.cpu_tier is not None:
            stop_reason, token_budget, blocked_seq_id, num_blocks_needed = schedule_waiting(
                self, token_budget, scheduled_seqs, prefill_flags)
        elif stop_reason is None:
            # a running sequence still in prefill (V1's is_prefill_chunk): not every one scheduled decodes
            prefill_scheduled = prefill_flags.count(False) < len(prefill_flags)
            # Then waiting, in FIFO order, into the budget left.
            while self.waiting and token_budget > 0:
                if len(self.running) >= self.max_num_seqs:
                    stop_reason = "max_num_seqs"
                    break
                seq = self.waiting[0]
                if not self.admit(seq):
                    stop_reason = "not_admitted"   # a policy's refusal, no head-of-line block
                    break
                hits = self.block_manager.cached_block_ids(seq)
                num_new_blocks = self.block_manager.num_blocks_needed(seq, hits)
                if num_new_blocks > self.block_manager.num_free_blocks:
                    # head-of-line block: shorter requests behind it wait too
                    stop_reason, blocked_seq_id, num_blocks_needed = "no_free_blocks", seq.seq_id, num_new_blocks
                    break
                if per_chunk:   # the hits and the first chunk's slots
                    num_computed = self.block_manager.num_computed_tokens(seq, len(hits))
                    num_new_tokens = seq.num_tokens - num_computed
                    if num_new_tokens == 1 and self.num_speculative_tokens and not prefill_scheduled and (
                            num_scheduled_running or num_computed) and self._pads(seq, num_computed):
                        num_padded = 1 + self.num_speculative_tokens
                        if num_padded > token_budget:      # V1 would rather not schedule it than unpadded
                            stop_reason = "budget_exhausted"
                            break
                        num_padded_blocks = num_new_blocks - seq.num_blocks + -(-(num_computed + num_padded)
                                                                                // self.block_size)
                        if num_padded_blocks > self.block_manager.num_free_blocks:
                            stop_reason, blocked_seq_id, num_blocks_needed = ("no_free_blocks", seq.seq_id,
                                                                              num_padded_blocks)
                            break
                        num_new_tokens = num_padded
                        seq.spec_token_ids = [PADDING_DRAFT] * self.num_speculative_tokens
                    seq.num_scheduled_tokens = min(num_new_tokens, token_budget)
                    cast(VllmBlockManager, self.block_manager).allocate(seq, hits, seq.num_scheduled_tokens)
                else:
                    self.block_manager.allocate(seq, hits)
                    seq.num_scheduled_tokens = min(seq.num_tokens - seq.num_cached_tokens, token_budget)
                token_budget -= seq.num_scheduled_tokens
                seq.status = SequenceStatus.RUNNING
                self.waiting.popleft()
                self.running.append(seq)
                self._take(seq, scheduled_seqs, prefill_flags)
            else:
                stop_reason = "budget_exhausted" if token_budget == 0 else "waiting_empty"

        tier = self.cpu_tier
        # with a CPU tier a step may schedule nothing while every sequence waits for a transfer
        assert scheduled_seqs or tier is not None, "nothing schedulable: check_request should have refused a request"
        scheduled_order = scheduled_seqs
        num_decode_seqs = prefill_flags.count(False)
        if 0 < num_decode_seqs < len(prefill_flags) and True in prefill_flags[:num_decode_seqs]:
            # the record lists decodes first (a subclass may have reordered running); the queues keep their order
            order = sorted(range(len(scheduled_seqs)), key=prefill_flags.__getitem__)
            scheduled_seqs = [scheduled_seqs[i] for i in order]
        phase: Phase = ("decode" if num_decode_seqs == len(scheduled_seqs) else "prefill" if num_decode_seqs == 0
                        else "mixed")
        self._emit_decision(phase, scheduled_seqs, self.max_num_batched_tokens - token_budget, stop_reason,
                            blocked_seq_id, num_blocks_needed, self.block_manager.num_free_blocks,
                            num_decode_seqs if phase == "mixed" else 0)
        if tier is not None:       # vLLM's build_connector_meta: the stores of the step, in scheduling order
            tier.offer_stores(scheduled_order)
        return scheduled_seqs, phase != "decode"

    def _pads(self, seq: Sequence, num_computed: int) -> bool:
        """V1's padding of an admitted sequence with one token left to compute (a full prefix-cache
        hit, a resumed one) to the 1 + K tokens of a verify step, its drafts placeholders that are
        never kept (uniform decode batches for CUDA graphs: a scheduling rule all the same), when
        no running sequence is in prefill and the padded tokens and the sampled one fit max_model_len."""
        return num_computed + 1 + self.num_speculative_tokens + 1 <= self.max_model_len

    def _allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """V1's running loop: slots for `seq`'s tokens of this step, preempting the running tail
        (`self.running` holds the sequences not scheduled yet) while there are too few free
        blocks, or `seq` itself when nobody is left behind it (False then)."""
        # vLLM's allocate_slots(num_lookahead_tokens=...): slots past the step's tokens, never cached
        while not cast(VllmBlockManager, self.block_manager).allocate_slots(seq, num_new_tokens
                                                                            + self.num_lookahead_tokens):
            if self.running:
                self.preempt(self.preempt_victim(seq), by=seq)
            else:
                self.preempt(seq, by=seq)
                return False
        return True

    @staticmethod
    def _take(seq: Sequence, scheduled_seqs: list[Sequence], prefill_flags: list[bool]) -> None:
        prefill_flags.append(seq.is_prefill)
        if seq.num_cached_tokens + seq.num_scheduled_tokens >= seq.num_tokens:
            seq.is_prefill = False     # from the next step it decodes
        scheduled_seqs.append(seq)


def make_cpu_tier(config: Config, sink: EventSink) -> CpuTier:
    """The CPU tier `config` asks for: under vLLM's rules only (block_rules checks it), and the
    bytes of a token known."""
    if not config.kv_bytes_per_token:
        raise ConfigError("kv_offloading_size needs kv_bytes_per_token (or a --roofline model, which gives it)")
    return CpuTier(config.num_cpu_blocks, config.kvcache_block_size,
                   config.kv_bytes_per_token * config.kvcache_block_size, config.kv_offloading_bandwidth_gbps, sink)


BUILTIN_POLICIES: dict[str, type[Scheduler]] = {"prefill_first": Scheduler, "mixed": MixedScheduler}
assert tuple(BUILTIN_POLICIES) == BUILTIN_POLICY_NAMES


def block_rules(policy: type[Scheduler], config: Config) -> str:
    """The block rules `policy` runs under `config`: `config.block_rules`, "auto" being the
    policy's own (vLLM's for `mixed` and its subclasses, nano-vllm's for the rest). vLLM's
    allocate per chunk, which only a MixedScheduler schedules."""
    is_mixed = issubclass(policy, MixedScheduler)
    rules = ("vllm" if is_mixed else "nano-vllm") if config.block_rules == "auto" else config.block_rules
    if rules == "vllm" and not is_mixed:
        raise ConfigError(f"block_rules=vllm needs the mixed policy (a MixedScheduler), not {policy_path(policy)}")
    if config.kv_offloading_size and rules != "vllm":
        raise ConfigError("kv_offloading_size needs vLLM's block rules (the mixed policy, block_rules vllm)")
    return rules


def policy_path(policy: type) -> str:
    """The name a config and a trace header record for `policy`: a built-in's name, else module:Class."""
    if not (isinstance(policy, type) and issubclass(policy, Scheduler)):
        raise ConfigError(f"a scheduling policy is a Scheduler subclass, got {policy!r}")
    return class_name(policy, BUILTIN_POLICIES)


def load_policy(spec: str) -> type[Scheduler]:
    """The policy named `spec`: a built-in, or module:Class imported. Only for a name the user
    gave (a flag, an argument); a trace's recorded name goes through `scheduler_class`."""
    return load_class(spec, BUILTIN_POLICIES, Scheduler, "scheduling policy", "Scheduler")


def scheduler_class(config: Config, policy: type | str | None = None) -> type[Scheduler]:
    """The scheduler for `config`. `policy` (a class, or a name the user gave) wins; without it
    only a built-in is used: a recorded user policy is never imported on its own."""
    if isinstance(policy, str):
        return load_policy(policy)
    if policy is not None:
        policy_path(policy)   # checks it is a Scheduler subclass
        return policy
    name = config.scheduling_policy
    if name not in BUILTIN_POLICIES:
        raise ConfigError(f"this run uses the scheduling policy {name!r}, which is not built in; "
                          f"pass it to use it (replay --policy {name}, or policy= in the API)")
    return BUILTIN_POLICIES[name]
