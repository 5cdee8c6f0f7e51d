"""What the TUI reads, with no Textual in it: the trace reader (frames by
offset), the fold (state at any step, from keyframes) and per-step summaries
for the timeline and for jumps (tokens, phase, which event types a step has,
where each step's events start in the list of all events).

`index_more()` reads the next slice of frames; the app calls it from a thread
worker, so a large trace opens at once and fills in. The worker only appends,
and publishes `num_steps` after a slice is complete; the UI thread reads steps
below `num_steps` only."""
import bisect
import os
from array import array
from dataclasses import dataclass, field

from tracengine.analysis.stats import stats
from tracengine.errors import TraceError
from tracengine.trace.vllm_events import BACKEND_EVENTS
from tracengine.trace.events import (AnyEvent, BlockAllocate, CpuHit, CpuLoad, CpuStore, DraftProposed,
                                     DraftVerified, Preempt, RequestAdded, ScheduleDecision, SeqFinish,
                                     SpecAccepted, SpecDecode, SpecDraft, StepEnd, TokenSample, prefill_flags)
from tracengine.replay.fold import Fold, FoldState
from tracengine.trace.tracelog import TraceReader
from tracengine.tui.explain import explain_step

EVENT_TYPE_NAMES = [cls.__name__ for cls in (*AnyEvent.__args__, *BACKEND_EVENTS) if cls.__name__ != "TraceHeader"]
# speculative decoding's events: tracengine's engine's, then vLLM's scheduler's
DRAFT_EVENT_NAMES = frozenset(("DraftProposed", "DraftVerified", "SpecDraft", "SpecDecode", "SpecAccepted"))


@dataclass(frozen=True, slots=True)
class StepView:
    """Everything the panels show for one step; replaced, never mutated."""
    step: int
    state: FoldState       # after the step
    explanation: str
    start_ns: int = 0      # the step's start and end on the trace's time axis (analysis/timeline.py)
    end_ns: int = 0
    age_ns: dict | None = None   # seq_id -> time from its arrival to the end of the step, for the queues
    seq_label_width: int = 2     # digits of the largest seq id read so far: the KV map labels each whole
    cpu_step: tuple = (0, 0, 0, 0, 0)   # what the step did to a CPU tier (step_tier_figures)

    @property
    def phase(self) -> str:
        return self.state.decision.phase if self.state.decision is not None else ""


def step_tier_figures(events) -> tuple[int, int, int, int, int]:
    """What a step's events did to the tier: (blocks stored, blocks evicted, blocks hit, loads
    started, loads ended)."""
    stored = evicted = hit = started = ended = 0
    for e in events:
        if type(e) is CpuStore:
            stored, evicted = stored + len(e.hashes), evicted + len(e.evicted)
        elif type(e) is CpuHit:
            hit, started = hit + len(e.hashes), started + 1
        elif type(e) is CpuLoad:
            ended += 1
    return stored, evicted, hit, started, ended



@dataclass(slots=True)
class Milestone:
    """A moment of one sequence's life, for the sequence view."""
    step: int
    kind: str          # arrive, prefill, preempt, finish, verify (drafts)
    num_tokens: int = 0
    num_cached_tokens: int = 0
    other_seq_id: int = -1   # the seq that needed the block, for "preempt"
    max_tokens: int = 0      # for "arrive"
    is_first_chunk: bool = True
    is_last_chunk: bool = True
    reason: str = ""
    # "verify": num_tokens drafts were verified, num_accepted kept; the drafts' tokens where the
    # trace has them, and the tokens the step appended (the kept drafts, then the model's token)
    num_accepted: int = 0
    draft_token_ids: tuple = ()
    kept_token_ids: tuple = ()


PHASES = ("decode", "prefill", "mixed")      # in the order a column of several steps shows them
PHASE_CODES = {phase: code for code, phase in enumerate(PHASES)}


@dataclass(slots=True)
class _StepIndex:
    """Per-step values the strip and the jumps read, copied from the events as
    they are indexed (no figure is computed here: the run's figures are
    `tracengine stats`', see TraceIndex.run_figures)."""
    num_tokens: array = field(default_factory=lambda: array("i"))        # tokens scheduled per step
    phase: bytearray = field(default_factory=bytearray)                  # PHASE_CODES of each step
    num_free_blocks: array = field(default_factory=lambda: array("i"))   # after each step
    event_starts: array = field(default_factory=lambda: array("q", [0]))  # first event line of each step
    start_ns: array = field(default_factory=lambda: array("q"))          # the time axis: each step's start
    end_ns: array = field(default_factory=lambda: array("q"))            # and end
    arrival_ns: dict = field(default_factory=dict)                        # seq_id -> arrival on the axis
    steps_with: dict = field(default_factory=lambda: {name: array("i") for name in EVENT_TYPE_NAMES})
    max_tokens: int = 0
    max_seq_id: int = 0


class TraceIndex:

    def __init__(self, path, first_slice: int = 64):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise TraceError(f"no such trace: {self.path}")
        if os.path.isdir(self.path):
            raise TraceError(f"{self.path} is a directory, not a trace")
        # the header frame and the first steps only: the rest is read by index_more()
        self.reader = TraceReader(self.path, max_frames=1 + first_slice)
        try:
            self.header = self.reader.header
            self.name = os.path.basename(self.path)
            self.fold = Fold([self.header])
            self.num_blocks = self.fold.num_blocks
            self.num_free_blocks_at_start = self.fold.state_at(-1).num_free_blocks   # vLLM's: all but its null block
            self.num_steps = 0           # published: complete, folded and summarized
            self._next_frame = 1
            self._open_step: list = []   # events read of the step not yet ended
            self._summary = _StepIndex()
            self._milestones: dict[int, list[Milestone]] = {}
            self._drafts: dict[int, list[int]] = {}       # seq_id -> its drafts last proposed
            self._num_spec: dict[int, int] = {}           # seq_id -> its drafts vLLM last scheduled
            self._index_frames()         # what the first slice read, so step 0 shows at once
        except BaseException:
            self.reader.close()
            raise

    # -- indexing (worker thread) -------------------------------------------------------------

    def index_more(self, max_frames: int = 2000) -> int:
        """Reads up to `max_frames` more frames; returns how many steps were added."""
        self.reader.refresh(max_frames)
        return self._index_frames()

    def _index_frames(self) -> int:
        reader = self.reader
        end = reader.num_frames
        if end <= self._next_frame:
            return 0
        frames = [reader.read_frame(i) for i in range(self._next_frame, end)]
        self._next_frame = end
        self.fold.append(e for events in frames for e in events)
        for events in frames:
            # a between-steps frame (format 8: frames.py) is summarized with the step it precedes
            self._open_step += events
            if self._open_step and type(self._open_step[-1]) is StepEnd:
                self._summarize(self._open_step)
                self._open_step = []
        before, self.num_steps = self.num_steps, self.fold.num_steps
        return self.num_steps - before

    def _summarize(self, events: list) -> None:
        s = self._summary
        step = len(s.num_tokens)
        names = set()
        decision = None
        for e in events:
            names.add(type(e).__name__)
            if type(e) is ScheduleDecision:
                decision = e
        for name in names:
            s.steps_with[name].append(step)
        num_tokens = decision.num_batched_tokens if decision is not None else 0
        s.num_tokens.append(num_tokens)
        s.max_tokens = max(s.max_tokens, num_tokens)
        s.phase.append(PHASE_CODES[decision.phase] if decision is not None else 0)
        s.num_free_blocks.append(events[-1].num_free_blocks)
        s.event_starts.append(s.event_starts[-1] + len(events))
        end = events[-1]
        start = (s.end_ns[-1] if s.end_ns else 0) + end.gap_ns
        s.start_ns.append(start)
        s.end_ns.append(start + end.schedule_ns + end.model_ns + end.postprocess_ns)
        for e in events:
            if type(e) is RequestAdded:     # a format-1 trace: it arrived as its step began
                s.arrival_ns[e.seq_id] = e.arrival_ns if e.arrival_ns >= 0 else start
                s.max_seq_id = max(s.max_seq_id, e.seq_id)
        if not names.isdisjoint(DRAFT_EVENT_NAMES):
            self._note_drafts(step, events)
        if decision is not None and (decision.phase != "decode" or "Preempt" in names
                                     or "RequestAdded" in names or "SeqFinish" in names):
            self._note_milestones(step, events, decision)

    def _note_drafts(self, step, events) -> None:
        """A "verify" milestone for each sequence whose drafts the step verified, in the order of
        the step's events: drafts proposed after a step are verified by a later one."""
        kept: dict[int, list[int]] = {}
        for e in events:
            if type(e) is TokenSample and e.kept:
                kept.setdefault(e.seq_id, []).append(e.token_id)
        verified = []   # (seq_id, drafts verified, kept)
        for e in events:
            t = type(e)
            if t is DraftVerified and not e.padded:
                verified.append((e.seq_id, e.num_draft_tokens, e.num_accepted_tokens))
            elif t is DraftProposed:
                self._drafts[e.seq_id] = e.draft_token_ids
            elif t is SpecDraft:
                self._drafts[e.seq_id] = e.token_ids
            elif t is SpecDecode:
                self._num_spec.update(zip(e.seq_ids, e.num_spec_tokens))
            elif t is SpecAccepted:
                verified += [(s, self._num_spec.get(s, a), a) for s, a in zip(e.seq_ids, e.num_accepted)]
            for seq_id, num_drafts, num_accepted in verified:
                self._milestones.setdefault(seq_id, []).append(Milestone(
                    step, "verify", num_drafts, num_accepted=num_accepted,
                    draft_token_ids=tuple(self._drafts.get(seq_id, ())[:num_drafts]),
                    kept_token_ids=tuple(kept.get(seq_id, ()))))
            verified.clear()

    def _note_milestones(self, step, events, decision) -> None:
        allocated = {e.seq_id for e in events if type(e) is BlockAllocate}
        middle = {e.seq_id for e in events if type(e) is TokenSample and not e.kept}
        for e in events:
            if type(e) is RequestAdded:
                self._milestones.setdefault(e.seq_id, []).append(
                    Milestone(step, "arrive", e.num_prompt_tokens, max_tokens=e.max_tokens))
            elif type(e) is Preempt:
                self._milestones.setdefault(e.seq_id, []).append(
                    Milestone(step, "preempt", e.num_computed_tokens, other_seq_id=e.by_seq_id))
        if decision.phase != "decode":      # prefill, or the prefill sequences of a mixed step
            for ss in (ss for ss, is_prefill in zip(decision.seqs, prefill_flags(decision)) if is_prefill):
                self._milestones.setdefault(ss.seq_id, []).append(Milestone(
                    step, "prefill", ss.num_tokens, ss.num_cached_tokens,
                    is_first_chunk=ss.seq_id in allocated, is_last_chunk=ss.seq_id not in middle))
        for e in events:
            if type(e) is SeqFinish:
                self._milestones.setdefault(e.seq_id, []).append(
                    Milestone(step, "finish", e.num_completion_tokens, reason=e.reason))

    @property
    def problem(self) -> str:
        """What stopped the index short of the file's end, if anything."""
        if self.reader.corruption is not None:
            return str(self.reader.corruption)
        return ""

    @property
    def torn_tail(self) -> str | None:
        """The reader's message for a torn last frame, or None."""
        return self.reader.describe_torn_tail()

    @property
    def ended(self) -> bool:
        """The writer closed the trace: nothing more will be appended."""
        return self.reader.ended

    # -- reading (UI thread) --------------------------------------------------------------------

    def events_at(self, step: int) -> list:
        """A step's events, read by offset from the file."""
        return self.reader.read_step(step)

    def state_at(self, step: int) -> FoldState:
        return self.fold.state_at(step)

    def view_at(self, step: int) -> StepView:
        state = self.fold.state_at(step)
        free_before = self._summary.num_free_blocks[step - 1] if step > 0 else self.num_free_blocks_at_start
        config = self.header.config
        events = self.events_at(step)
        explanation = explain_step(events, state.seqs, free_before,
                                   config.get("max_num_batched_tokens", config.get("chunked_prefill_size", 0)),
                                   config.get("max_num_seqs", config.get("max_running_requests", 0)))   # or SGLang's
        s = self._summary
        end = s.end_ns[step]
        ages = {seq_id: end - s.arrival_ns[seq_id] for seq_id in (*state.waiting, *state.running)
                if seq_id in s.arrival_ns}
        return StepView(step, state, explanation, s.start_ns[step], end, ages, max(2, len(str(s.max_seq_id))),
                        step_tier_figures(events) if config.get("kv_offloading_size") else (0, 0, 0, 0, 0))

    def event_start(self, step: int) -> int:
        """The line of a step's first event in the list of all events."""
        return self._summary.event_starts[step]

    def step_of_line(self, line: int) -> int:
        return bisect.bisect_right(self._summary.event_starts, line, 0, self.num_steps + 1) - 1

    def find_step(self, event_type: str, step: int, direction: int) -> int | None:
        """The next (direction 1) or previous (-1) step after/before `step` with such an event."""
        steps = self._summary.steps_with[event_type]
        n = bisect.bisect_left(steps, self.num_steps)      # published steps only
        if direction > 0:
            i = bisect.bisect_right(steps, step, 0, n)
            return steps[i] if i < n else None
        i = bisect.bisect_left(steps, step, 0, n)
        return steps[i - 1] if i > 0 else None

    def run_figures(self) -> dict:
        """`tracengine stats` of the steps indexed so far: the same code, so the
        numbers are the command's. Reads those frames again, by offset."""
        reader, end = self.reader, self.reader.step_frame(self.num_steps)
        return stats(e for i in range(end) for e in reader.read_frame(i))

    def column_summary(self, start: int, stop: int) -> tuple[int, str, bool]:
        """(most tokens, phase, any preemption) over steps [start, stop); the phase is
        mixed if a step is, else prefill if a step is, else decode."""
        s = self._summary
        tokens = max(s.num_tokens[start:stop], default=0)
        phase = PHASES[max(s.phase[start:stop], default=0)]
        preempts = s.steps_with["Preempt"]
        i = bisect.bisect_left(preempts, start)
        return tokens, phase, i < len(preempts) and preempts[i] < stop

    @property
    def max_tokens(self) -> int:
        return self._summary.max_tokens

    def milestones(self, seq_id: int) -> list[Milestone]:
        return [m for m in self._milestones.get(seq_id, []) if m.step < self.num_steps]

    def close(self) -> None:
        self.reader.close()
