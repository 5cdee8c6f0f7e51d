"""Re-execution: run the engine's own step loop (the real Scheduler and
BlockManager) over a trace's requests and sampled tokens, and check every
event it emits against the recorded one, stopping at the first difference."""
import operator
import time
from dataclasses import dataclass

from tracengine.engine.config import Config
from tracengine.errors import RequestError
from tracengine.engine.hash_id_prompt import hashed_blocks, request_prompt
from tracengine.trace.vllm_events import BACKEND_EVENTS
from tracengine.trace.events import (WALL_CLOCK_FIELDS, AnyEvent, BlockHash, DraftProposed, DraftVerified, Event,
                                     PromptBlocksHashed, RequestAdded, SeqAbort, StepEnd, TokenSample)
from tracengine.engine.llm_engine import LLMEngine
from tracengine.analysis.render import format_event, render_state, render_step
from tracengine.replay.fold import Fold
from tracengine.trace.views import iter_steps
from tracengine.trace.tracelog import split_header
from tracengine.replay.state import FoldState, live_state
from tracengine.engine.sampling_params import SamplingParams
from tracengine.engine.spec_decode import SYNTHETIC_DRAFT


class RecordedRunner:
    """Re-execution: the tokens a trace recorded for the current step, by seq_id.
    `tokens` is replaced before each step; a sequence the trace did not sample
    this step (the replay has already diverged) gets `filler`. Speculative decoding's are fed
    back too: `verified` (seq_id -> the drafts the step kept and its tokens) and the drafts the
    step proposed (`proposer`, which the engine takes instead of proposing its own)."""

    def __init__(self, filler: int = 0):
        self.tokens: dict[int, int] = {}
        self.verified: dict[int, tuple[int, list[int]]] = {}
        self.filler = filler
        self.proposer = RecordedDrafts()

    def run(self, seqs, is_prefill: bool) -> list[int]:
        tokens, filler = self.tokens, self.filler
        if self.verified or self.proposer.drafts:
            return [self.targets(seq) if seq.spec_token_ids else tokens.get(seq.seq_id, filler) for seq in seqs]
        return [tokens.get(seq.seq_id, filler) for seq in seqs]

    def targets(self, seq) -> list[int]:
        """The model's tokens at a verify step's positions, as far as the trace tells them: its
        tokens, then its kept drafts past a stop, then -2 (never a draft), which no rule keeps."""
        num_accepted, kept = self.verified.get(seq.seq_id, (0, [self.tokens.get(seq.seq_id, self.filler)]))
        drafts = seq.spec_token_ids
        return [kept[j] if j < len(kept) else drafts[j] if j < num_accepted else -2 for j in range(len(drafts) + 1)]

    def exit(self):
        pass


class RecordedDrafts:
    """The drafts a trace recorded for the current step, by seq_id (a synthetic draft's tokens
    are the target's: SYNTHETIC_DRAFT each)."""

    def __init__(self):
        self.drafts: dict[int, list[int]] = {}

    def add(self, event: DraftProposed):
        self.drafts[event.seq_id] = list(event.draft_token_ids) or [SYNTHETIC_DRAFT] * event.num_draft_tokens

    def propose(self, seq) -> list[int]:
        return self.drafts.get(seq.seq_id, [])


@dataclass
class Divergence:
    step: int
    index: int                 # of the event within the step
    expected: Event | None     # None: the trace has no more events in this step
    actual: Event | None       # None: the replay emitted nothing where the trace has `expected`
    reason: str
    state: FoldState           # the replaying scheduler at the moment it diverged


@dataclass
class ReplayResult:
    num_steps: int             # steps reproduced in full
    num_events: int            # events that matched the trace
    seconds: float
    divergence: Divergence | None = None
    num_unfinished: int = 0    # sequences still in the queues when the trace ended

    @property
    def ok(self) -> bool:
        return self.divergence is None

    @property
    def events_per_second(self) -> float:
        return self.num_events / self.seconds if self.seconds > 0 else float("inf")


def _compared(cls):
    """The fields of `cls` a replay compares, as one getter: `without_wall_clock` without its per-call work."""
    return operator.attrgetter(*[name for name in cls.__struct_fields__ if name not in WALL_CLOCK_FIELDS])


_COMPARED = {cls: _compared(cls) for cls in (*AnyEvent.__args__, *BACKEND_EVENTS)}


class _Diverged(Exception):
    def __init__(self, expected, actual, reason):
        super().__init__(reason)
        self.expected, self.actual, self.reason = expected, actual, reason


class ComparingSink:
    """An event sink that checks each event against the next one of the
    recorded step as it is emitted, and raises at the first difference."""
    enabled = True

    def __init__(self):
        self.expected: list[Event] = []
        self.index = 0

    def emit(self, event: Event) -> None:
        if type(event) is PromptBlocksHashed and self.index < len(self.expected) \
                and type(self.expected[self.index]) is BlockHash:
            # a trace older than format 7 recorded a hash-id prompt's blocks as a BlockHash each
            for block_hash in hashed_blocks(event):
                self._compare(block_hash)
        else:
            self._compare(event)

    def _compare(self, event: Event) -> None:
        i = self.index
        try:
            recorded = self.expected[i]
        except IndexError:
            raise _Diverged(None, event, "the replay emitted an event the trace does not have") from None
        # Equal structs are equal; otherwise only the wall-clock fields may differ.
        if recorded != event and (type(recorded) is not type(event)
                                  or _COMPARED[type(event)](recorded) != _COMPARED[type(event)](event)):
            raise _Diverged(recorded, event, "the replay emitted a different event")
        self.index = i + 1


class RecordedClockEngine(LLMEngine):
    """The engine of a re-execution: a CPU tier's transfers count the recorded time (each step
    starts where its StepEnd says), so they end at the steps they ended at."""
    recorded_start_ns = 0

    def transfer_clock_ns(self, t0: int) -> int:
        return self.recorded_start_ns


def reexecute(events, policy: type | str | None = None) -> ReplayResult:
    """Re-execute `events` (TraceHeader first); stops at the first divergence. `policy`: the
    scheduler to replay with; without it the recorded built-in policy (a recorded policy of
    one's own is never imported on its own: pass it)."""
    header, it = split_header(events)
    config = Config.from_dict(header.config)
    runner, sink = RecordedRunner(), ComparingSink()
    engine = RecordedClockEngine(config, runner, sink, policy=policy)
    step_end_ns = 0      # the recorded end of the last step, ns from the start of the run
    seqs = []            # every sequence added, to show those caught mid-step
    num_events = 0
    start = time.perf_counter()
    for step_events in iter_steps(it):
        step = engine.num_steps
        sink.expected, sink.index = step_events, 0
        runner.tokens = tokens = {}
        runner.verified = verified = {}
        runner.proposer.drafts = {}
        try:
            for e in step_events:
                t = type(e)
                if t is TokenSample:
                    tokens[e.seq_id] = e.token_id
                    if e.seq_id in verified:
                        verified[e.seq_id][1].append(e.token_id)
                elif t is DraftVerified:
                    verified[e.seq_id] = (e.num_accepted_tokens, [])
                elif t is DraftProposed:
                    runner.proposer.add(e)
                elif t is RequestAdded:
                    try:
                        seqs.append(engine.add_request(request_prompt(e), SamplingParams(
                            e.temperature, e.max_tokens, e.ignore_eos, e.top_k, e.top_p,
                            None if e.seed == -1 else e.seed), seq_id=e.seq_id,
                            session=(e.session_id, e.turn, e.depends_on, e.think_ns) if e.session_id else None))
                    except RequestError as exc:
                        raise _Diverged(e, None, f"the replay refused the request: {exc}") from None
                elif t is SeqAbort:
                    # applied where it was recorded: between the requests added before this step
                    if engine.abort_request(e.seq_id, e.reason) is None:
                        raise _Diverged(e, None, f"the replay has no sequence {e.seq_id} to abort")
            if type(step_events[-1]) is StepEnd:
                if engine.is_finished():
                    raise _Diverged(step_events[sink.index], None, "the replay has nothing left to schedule")
                end = step_events[-1]
                engine.recorded_start_ns = step_end_ns + end.gap_ns
                step_end_ns = engine.recorded_start_ns + end.schedule_ns + end.model_ns + end.postprocess_ns
                engine.step()
            if sink.index < len(step_events):
                raise _Diverged(step_events[sink.index], None, "the trace has an event the replay did not emit")
        except _Diverged as d:
            divergence = Divergence(step, sink.index, d.expected, d.actual, d.reason,
                                    live_state(engine.scheduler, step, seqs))
            return ReplayResult(step, num_events + sink.index, time.perf_counter() - start, divergence)
        num_events += len(step_events)
    scheduler = engine.scheduler
    return ReplayResult(engine.num_steps, num_events, time.perf_counter() - start,
                        num_unfinished=len(scheduler.waiting) + len(scheduler.running))


def divergence_report(name: str, result, events) -> str:
    """What `replay` prints when a re-execution diverges: the step, the expected
    and the actual event, the recorded step's row, the recorded state before the
    step and the replaying scheduler's state when it diverged."""
    d = result.divergence
    lines = [f"{name}: replay diverges at step {d.step} (event {d.index} of the step): {d.reason}",
             f"  expected: {format_event(d.expected, wall_clock=False)}",
             f"  actual:   {format_event(d.actual, wall_clock=False)}",
             f"{result.num_steps} steps and {result.num_events} events reproduced before it"]
    fold = Fold(events)
    if d.step <= fold.num_steps:
        lines += [f"recorded step {d.step}:", "  " + render_step(fold.events_at(d.step))]
    lines.append("recorded state before the step:")
    lines += ["  " + line for line in render_state(fold.state_at(before_step=min(d.step, fold.num_steps))).splitlines()]
    lines.append("replayed state at the divergence:")
    lines += ["  " + line for line in render_state(d.state, when=f"in the middle of step {d.step}").splitlines()]
    return "\n".join(lines) + "\n"
