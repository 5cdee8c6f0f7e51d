"""A trace folded into steps and request lifecycles, with a time axis: what `stats` and `export` read.
Events only; no engine objects, no torch.

Time axis, in ns from the start of the run: a step lasts its StepEnd duration, schedule_ns + model_ns +
postprocess_ns, and begins gap_ns after the previous one ended (step 0: after the start of the run; the gap
holds the engine's idle waits for arrivals and the loop's own work). So step s runs from start_ns(s), the
sum of the gaps and durations of steps 0..s-1 plus its own gap, to end_ns(s) = start_ns(s) + its duration.
A request arrives at its RequestAdded.arrival_ns when the trace knows it (format 2), else at the start of
the step it was added before (format 1, whose gaps read as 0); a token sampled in step s appears at
end_ns(s)."""
import os
from array import array
from dataclasses import dataclass, field
from itertools import repeat
from typing import Final, Iterable

from tracengine.analysis.spec_decoding import SpecCounts
from tracengine.analysis.cpu_tier import FOLD as CPU_TIER_FOLD, CpuTierRecord
from tracengine.analysis.vllm_inputs import FOLD as VLLM_INPUTS_FOLD, VllmInputs
from tracengine.errors import TraceError
from tracengine.analysis.step_figures import GapCounts, StepFigures
from tracengine.engine.native import extend, i64, vec
from tracengine.trace.events import (BlockAllocate, DraftVerified, Preempt, RequestAdded, ScheduledSeq,
                                     ScheduleDecision, SeqAbort, SeqFinish, SpecAccepted, SpecDecode, StepEnd,
                                     TokenSample, TraceHeader, prefill_flags)
from tracengine.trace.header import block_pool_config

@dataclass(slots=True)
class StepRecord:
    decision: ScheduleDecision
    end: StepEnd
    drafts: tuple[int, int] = (0, 0)     # draft tokens the step verified, and kept

    @property
    def step(self) -> int:
        return self.end.step

    @property
    def duration_ns(self) -> int:
        return self.end.schedule_ns + self.end.model_ns + self.end.postprocess_ns


@dataclass(slots=True)
class RequestRecord:
    seq_id: int
    added_step: int
    num_prompt_tokens: int
    num_tokens: int                                   # prompt + kept tokens so far
    arrival_ns: int = -1                              # RequestAdded.arrival_ns; -1: not known (format 1)
    scheduled: list[tuple[int, str, int]] = field(default_factory=list)   # (step, phase, num_tokens); not lean
    token_steps: array = field(default_factory=lambda: array("q"))        # steps of kept TokenSamples; not lean
    first_token_step: int = -1                        # of the first kept TokenSample; -1: none yet
    last_token_step: int = -1                         # of the latest; -1: none yet
    first_scheduled_step: int | None = None
    preempts: list[Preempt] = field(default_factory=list)
    finish_step: int | None = None
    finish_reason: str = ""
    abort: SeqAbort | None = None                     # taken out before it finished (a server's client left)


class RequestTimeline:
    """The fold. `steps[i].step == i`; `requests` in arrival order; `step_figures` the steps' sums.
    `lean`: only what `stats` reads (a run folded live): no steps (`steps` stays empty; their times
    and sums are kept) and no per-request schedule or token steps (`RequestRecord.scheduled` and
    `token_steps`, which `export` draws), so that its memory follows the requests, not the steps or the tokens.

    Inter-token latencies are counted as they come, lean or not: `_gaps` (step_figures.GapCounts) maps a gap
    between two kept tokens of a request (in steps; in ns, between the ends of their steps) to how many. A
    gap closes when the later token's step ends; until then it is open, for the tokens of `_open_step`. A step's
    tokens mostly follow tokens of one earlier step (the step before), so its open gaps come in runs of one
    earlier step: the latest run is counted in ints (`_run_step`, `_run_count`: a token's gap costs no dict
    update), the runs before it in `_open_gaps` (the earlier token's step -> count)."""

    def __init__(self, header: TraceHeader | None = None, lean: bool = False) -> None:
        self._start(header, lean)

    def _start(self, header: TraceHeader | None, lean: bool) -> None:
        self.header = header
        self.lean = lean
        _, num_blocks, block_size = block_pool_config(header) if header is not None else (-1, -1, None)
        self.block_size: int | None = block_size or None
        self.num_kvcache_blocks: int | None = num_blocks if num_blocks and num_blocks > 0 else None
        self.steps: list[StepRecord] = []
        self.requests: dict[int, RequestRecord] = {}
        # The same records in slots, a kept token's request found by index (compiled, a dict lookup boxes the id
        # anew): a request's slot is its seq_id's low bits (`& _slot_mask`), held by one of the requests whose ids
        # share it; one whose slot another holds is found in `requests`. At least twice as many slots as requests.
        self._slots: list[RequestRecord | None] = [None] * MIN_SLOTS
        self._slot_mask = MIN_SLOTS - 1
        self.session_turns: dict[int, tuple[str, int]] = {}   # seq_id -> (session, turn) of a session's turn
        self.lora_names: dict[int, str] = {}    # seq_id -> its LoRA adapter's name, where it has one
        self.num_allocated_blocks = 0   # over all BlockAllocates (first allocations and after preemptions)
        self.num_hit_blocks = 0         # their leading blocks found in the prefix cache
        self.num_lookup_tokens = 0      # tokens of the sequences at their (re)allocations
        self.cpu: CpuTierRecord | None = None   # the CPU tier's record, from its first event (analysis/cpu_tier.py)
        self.torn_tail: str | None = None   # what the reader reported about an incomplete last frame
        self.step_figures = StepFigures()
        self._decision: ScheduleDecision | None = None
        # Each step's start and end on the time axis, the first `_num_steps` of them, in arrays of machine
        # ints (engine/native.py: compiled, indexed natively) grown a chunk of zeros at a time
        self._starts: vec[i64] = vec[i64]([])
        self._ends: vec[i64] = vec[i64]([])
        # The steps so far, and the last one's end (0 before any step), as typed ints. (Pure Python: an instance of more
        # than 30 attributes loses its dict's shared keys, and every attribute read its fast path.)
        self._num_steps = 0
        self._total_ns = 0
        self._gaps = GapCounts()
        self._open_step = -1
        self._open_gaps: dict[int, int] = {}
        self._run_step = -1
        self._run_count = 0
        self.spec_decoding: SpecCounts | None = None   # drafts verified and accepted (analysis/spec_decoding.py)
        self.vllm_inputs: VllmInputs | None = None     # a vLLM trace's connector and grammar inputs
        self._step_drafts = (0, 0)     # of the step being folded: drafts verified, and kept

    def add(self, event) -> None:
        # By exact type: a run folded live (generate, simulate) pays this per event. A TokenSample (most of
        # a run's events), a step's decision and its end first, by direct calls: compiled, a call through
        # the table is a Python call (its arguments boxed and parsed), these C calls.
        t = type(event)
        if t is TOKEN_SAMPLE:
            self._token_sampled(event)
        elif t is STEP_END:
            self._step_ended(event)
        elif t is SCHEDULE_DECISION:
            self._decision_made(event)
        else:
            fold = FOLD.get(t)
            if fold is not None:
                fold(self, event)

    def _header_read(self, header: TraceHeader) -> None:
        """A trace's header starts the fold anew, lean or not as it was made."""
        self._start(header, self.lean)

    def _request_added(self, event: RequestAdded) -> None:
        seq_id: int = event.seq_id
        num_prompt_tokens = event.num_prompt_tokens
        req = self.requests[seq_id] = RequestRecord(seq_id, event.step, num_prompt_tokens, num_prompt_tokens,
                                                    event.arrival_ns)
        if 2 * len(self.requests) <= len(self._slots):
            self._slots[seq_id & self._slot_mask] = req
        else:       # twice the slots, each request put in its own again (the later in a shared one)
            self._slots = [None] * (2 * len(self._slots))
            self._slot_mask = len(self._slots) - 1
            for r in self.requests.values():
                self._slots[r.seq_id & self._slot_mask] = r
        if event.session_id:
            self.session_turns[event.seq_id] = (event.session_id, event.turn)
        if event.lora_id:       # a vLLM request's LoRA adapter (analysis/adapters.py)
            self.lora_names[event.seq_id] = event.lora_name

    def _decision_made(self, event: ScheduleDecision) -> None:
        self._decision = event
        phase: str = event.phase
        if self.lean and phase == "decode":
            return        # a request is first scheduled in a step with prefill
        step, requests = event.step, self.requests
        seqs: list[ScheduledSeq] = event.seqs
        if self.lean:     # lean, a mixed step's decodes (its leading num_decode_seqs) have been scheduled before
            if phase == "mixed":
                seqs = seqs[event.num_decode_seqs:]
            phases: Iterable[str] = repeat(phase)
        else:             # a mixed step holds both; the others one phase for all
            phases = (["prefill" if f else "decode" for f in prefill_flags(event)] if phase == "mixed"
                      else repeat(phase))
        for s, phase in zip(seqs, phases):
            req = requests.get(s.seq_id)     # this loop runs per scheduled token of a decode: no call
            if req is None:
                raise self._unknown(s.seq_id, event)
            if req.first_scheduled_step is None:
                req.first_scheduled_step = step
            if not self.lean:
                req.scheduled.append((step, phase, s.num_tokens))

    def _allocated(self, event: BlockAllocate) -> None:
        self.num_allocated_blocks += len(event.block_ids)
        self.num_hit_blocks += event.num_cached_blocks
        self.num_lookup_tokens += self._request(event.seq_id, event).num_tokens

    def _preempted(self, event: Preempt) -> None:
        self._request(event.seq_id, event).preempts.append(event)

    def _token_sampled(self, event: TokenSample) -> None:
        # Runs per token: each field of the event is read once (compiled, each read is a generic attribute
        # lookup); a dropped token (a middle chunk's) counts in no figure.
        if event.kept:
            self.token_kept(event.step, event.seq_id, event)

    def token_kept(self, step: int, seq_id: int, event: TokenSample | None = None) -> None:
        """A kept TokenSample of `seq_id` at `step` folded: from its event, or called by a live run's
        scheduler where the fold is all that reads its tokens (trace/sinks.py: `token_kept`)."""
        req = self._slots[seq_id & self._slot_mask]
        if req is None or req.seq_id != seq_id:      # its slot empty, or another request's
            req = self.requests.get(seq_id)
            if req is None:
                raise self._unknown(seq_id, event if event is not None else TokenSample(step, seq_id, 0, True))
        previous = req.last_token_step
        if previous < 0:
            req.first_token_step = step
        elif step != previous:      # a gap, open until this step ends (a verify step's tokens come together)
            if step != self._open_step:
                if self._run_count or self._open_gaps:
                    self._close_gaps()     # of a step that never ended (a torn frame's)
                self._open_step = step
            if previous != self._run_step:
                if self._run_count:
                    self._end_run()
                self._run_step = previous
            self._run_count += 1
        req.last_token_step = step
        req.num_tokens += 1
        if not self.lean:
            req.token_steps.append(step)

    def _end_run(self) -> None:
        """Put the run of open gaps from `_run_step` into `_open_gaps`."""
        self._open_gaps[self._run_step] = self._open_gaps.get(self._run_step, 0) + self._run_count
        self._run_count = 0

    def _close_gaps(self) -> None:
        """Count the open gaps, and forget them."""
        self._count_gaps(self._gaps)
        if self._open_gaps:      # mostly empty: a step's gaps mostly come in one run
            self._open_gaps.clear()
        self._run_count = 0

    def _count_gaps(self, gaps: GapCounts) -> None:
        """Count the open gaps, those in `_open_gaps` then the run's, into `gaps`: each to a token of `_open_step`,
        each step ending when `end_ns` says (one that has not ended: when the trace does)."""
        step = self._open_step
        end = self.end_ns(step)
        if self._open_gaps:
            for previous, count in self._open_gaps.items():
                gaps.add(step - previous, end - self.end_ns(previous), count)
        if self._run_count:
            gaps.add(step - self._run_step, end - self.end_ns(self._run_step), self._run_count)

    def itl(self) -> tuple[dict[int, int], dict[int, int]]:
        """The inter-token gaps so far, in steps and in ns, each -> how many, with the gaps still
        open (a step not ended) counted as ending with the trace."""
        if not (self._open_gaps or self._run_count):
            return self._gaps.counted()
        gaps = self._gaps.copy()
        self._count_gaps(gaps)
        return gaps.counted()

    def _spec_counts(self) -> SpecCounts:
        self.spec_decoding = self.spec_decoding or SpecCounts()
        return self.spec_decoding

    def _drafts_scheduled(self, event: SpecDecode) -> None:       # vLLM's: a step's drafts are those it scheduled
        self._spec_counts().scheduled(event)
        self._step_drafts = (self._step_drafts[0] + sum(event.num_spec_tokens), self._step_drafts[1])

    def _drafts_accepted(self, event: SpecAccepted) -> None:      # and those its output accepted
        self._spec_counts().accepted(event)
        self._step_drafts = (self._step_drafts[0], self._step_drafts[1] + sum(event.num_accepted))

    def _drafts_verified(self, event: DraftVerified) -> None:
        if not event.padded:        # padded: placeholders, not drafts
            num_drafted, num_kept = self._step_drafts
            self._step_drafts = (num_drafted + event.num_draft_tokens, num_kept + event.num_accepted_tokens)
            self._spec_counts().verified_drafts(event.num_draft_tokens, event.num_accepted_tokens)

    def _finished(self, event: SeqFinish) -> None:
        req = self._request(event.seq_id, event)
        req.finish_step, req.finish_reason = event.step, event.reason

    def _aborted(self, event: SeqAbort) -> None:
        self._request(event.seq_id, event).abort = event

    def _step_ended(self, event: StepEnd) -> None:
        decision, self._decision = self._decision, None
        step: int = event.step
        decision_step: int = decision.step if decision is not None else -1     # compared as ints (compiled)
        if decision is None or decision_step != step or step != self._num_steps:
            raise TraceError(f"step {step} ends without its ScheduleDecision (expected step {self._num_steps})")
        # each field into a typed local, then summed as machine ints (compiled; not added as objects)
        schedule_ns: int = event.schedule_ns
        model_ns: int = event.model_ns
        postprocess_ns: int = event.postprocess_ns
        duration_ns = schedule_ns + model_ns + postprocess_ns
        self.step_figures.add(decision, event, duration_ns, self.num_kvcache_blocks)
        if not self.lean:
            self.steps.append(StepRecord(decision, event, self._step_drafts))
        self._step_drafts = (0, 0)
        gap_ns: int = event.gap_ns
        start = self._total_ns + gap_ns
        self._total_ns = end = start + duration_ns
        if step == len(self._ends):
            self._starts = extend(self._starts, STEP_CHUNK)
            self._ends = extend(self._ends, STEP_CHUNK)
        self._starts[step] = start
        self._ends[step] = end
        self._num_steps = step + 1
        if self._open_step == step:
            self._close_gaps()

    def _request(self, seq_id: int, event) -> RequestRecord:
        req = self.requests.get(seq_id)
        if req is None:
            raise self._unknown(seq_id, event)
        return req

    @staticmethod
    def _unknown(seq_id: int, event) -> TraceError:
        return TraceError(f"{type(event).__name__} at step {event.step} names seq_id {seq_id}, "
                          f"which no RequestAdded introduced")

    @property
    def num_steps(self) -> int:
        return self._num_steps

    @property
    def total_ns(self) -> int:
        """The run's duration: from its start to the end of the last step."""
        return self._total_ns

    @property
    def gap_ns(self) -> int:
        """Time between steps (idle waits and the loop's own work) over the run."""
        return self.total_ns - self.step_figures.busy_ns

    def start_ns(self, step: int) -> int:
        """When step `step` begins; a step past the end begins when the trace ends."""
        return self._starts[step] if step < self._num_steps else self._total_ns

    def end_ns(self, step: int) -> int:
        # the last step's end, mostly asked for (as a step's gaps close), without reading the array
        return self._ends[step] if step < self._num_steps - 1 else self._total_ns

    def idle_gaps(self) -> list[tuple[int, int, int]]:
        """(step, from_ns, to_ns) for each gap the engine spent idle: no request was in flight when it
        began (every request added before the step had finished or been aborted), from the end of the
        step before until the first arrival among the requests the step took in (it sleeps until then)."""
        delta = [0] * (self.num_steps + 2)
        first_arrival: dict[int, int] = {}
        for req in self.requests.values():
            # in flight in the gap before step s when added_step < s <= its last step
            last = req.finish_step if req.finish_step is not None else (
                req.abort.step - 1 if req.abort is not None else self.num_steps)
            if req.added_step < last:
                delta[req.added_step + 1] += 1
                delta[min(last, self.num_steps) + 1] -= 1
            arrival = self.arrival_ns(req)
            if arrival < first_arrival.get(req.added_step, arrival + 1):
                first_arrival[req.added_step] = arrival
        gaps, in_flight = [], 0
        for step in range(self.num_steps):
            in_flight += delta[step]
            if in_flight == 0:
                idle_from = self._ends[step - 1] if step else 0
                idle_to = min(self._starts[step], first_arrival.get(step, self._starts[step]))
                if idle_to > idle_from:
                    gaps.append((step, idle_from, idle_to))
        return gaps

    def arrival_ns(self, req: RequestRecord) -> int:
        """When a request arrived: its recorded time, else the start of the step it was added before."""
        return req.arrival_ns if req.arrival_ns >= 0 else self.start_ns(req.added_step)


MIN_SLOTS: Final = 1024       # a timeline's slots by seq_id at first (a power of two)
STEP_CHUNK: Final = vec[i64]([0] * 4096)    # the steps' arrays grow by this many zeros
TOKEN_SAMPLE: Final = TokenSample     # Final: compiled, a C static, not a lookup in the module's dict per event
SCHEDULE_DECISION: Final = ScheduleDecision
STEP_END: Final = StepEnd
# What each event type adds to a timeline, by exact type; the block-level events (hashes, appends,
# frees) add nothing: no figure needs them (the free counts come from StepEnd). Functions, not a
# timeline's bound methods: a table of those on the timeline would hold it in a reference cycle,
# alive after the run until the collector's next full pass. Final: compiled, `add` reads it as a C
# static, not from the module's dict, per event.
FOLD: Final = {TraceHeader: RequestTimeline._header_read, RequestAdded: RequestTimeline._request_added,
        ScheduleDecision: RequestTimeline._decision_made, BlockAllocate: RequestTimeline._allocated,
        Preempt: RequestTimeline._preempted, TokenSample: RequestTimeline._token_sampled,
        SeqFinish: RequestTimeline._finished, SeqAbort: RequestTimeline._aborted, StepEnd: RequestTimeline._step_ended,
        SpecDecode: RequestTimeline._drafts_scheduled, SpecAccepted: RequestTimeline._drafts_accepted,
        DraftVerified: RequestTimeline._drafts_verified, **CPU_TIER_FOLD, **VLLM_INPUTS_FOLD}


def fold(events) -> RequestTimeline:
    timeline = RequestTimeline()
    for event in events:
        timeline.add(event)
    return timeline


def load(path_or_events) -> RequestTimeline:
    """A RequestTimeline from a trace path or from an iterable of events. A path is read up to its last
    complete frame: a torn tail (a trace still being written, or cut short) is noted in `torn_tail`,
    damage raises TraceCorruptError naming the offset."""
    if not isinstance(path_or_events, (str, os.PathLike)):
        return fold(path_or_events)
    from tracengine.trace.tracelog import TraceReader
    with TraceReader(path_or_events) as reader:
        timeline = fold(reader.events())
        if reader.torn_tail is not None:
            timeline.torn_tail = f"{reader.describe_torn_tail()}; figures cover steps 0..{timeline.num_steps - 1}"
    return timeline
