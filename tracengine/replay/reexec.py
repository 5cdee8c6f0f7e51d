"""Re-execution of tracengine's engine: its own step loop (the real Scheduler and
BlockManager) as a replaying engine (replay/reexecution.py, the one re-execution of every
backend): the trace's requests and aborts given where they were recorded, its sampled tokens
fed back, every event it emits checked against the recorded one, stopping at the first
difference; and the report of a divergence, whichever backend's."""
from tracengine.analysis.render import format_event, render_state, render_step
from tracengine.engine.config import Config
from tracengine.engine.hash_id_prompt import request_prompt
from tracengine.engine.llm_engine import LLMEngine
from tracengine.engine.sampling_params import SamplingParams
from tracengine.engine.spec_decode import SYNTHETIC_DRAFT
from tracengine.replay.fold import Fold
from tracengine.replay.reexecution import ABORT, ADD, STEP, ComparingSink, Diverged, ReplayResult, replay
from tracengine.replay.state import live_state
from tracengine.trace.events import DraftProposed, DraftVerified, RequestAdded, SeqAbort, StepEnd, TokenSample
from tracengine.trace.tracelog import split_header
from tracengine.trace.views import iter_steps


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


class RecordedClockEngine(LLMEngine):
    """The engine of a re-execution: a CPU tier's transfers count the recorded time (each step
    starts where its StepEnd says), so they end at the steps they ended at."""
    recorded_start_ns = 0

    def transfer_clock_ns(self, t0: int) -> int:
        return self.recorded_start_ns


class EngineReplay:
    """tracengine's engine as a replaying engine (replay/reexecution.py): each recorded step's
    requests and aborts where they were recorded, then its step, fed the step's sampled tokens
    and drafts (RecordedRunner); every event of the step must be emitted."""
    no_abort = "the replay has no sequence {seq_id} to abort"
    nothing_left = "the replay has nothing left to schedule"

    def __init__(self, header, frames, policy=None):
        self.runner, self.sink = RecordedRunner(), ComparingSink()
        self.engine = RecordedClockEngine(Config.from_dict(header.config), self.runner, self.sink, policy=policy)
        self.frames = frames
        self.step_end_ns = 0      # the recorded end of the last step, ns from the start of the run
        self.seqs = []            # every sequence added, to show those caught mid-step
        self.num_events = 0       # of the steps reproduced in full
        self.step_no = 0

    def calls(self):
        sink, engine = self.sink, self.engine
        for step_events in self.frames:
            self.step_no = engine.num_steps
            sink.expected, sink.index = step_events, 0
            for e in step_events:
                t = type(e)
                if t is RequestAdded:
                    yield ADD, e
                elif t is SeqAbort:
                    # applied where it was recorded: between the requests added before this step
                    yield ABORT, e
            if type(step_events[-1]) is StepEnd:
                yield STEP, step_events
            if sink.index < len(step_events):
                raise sink.missing()
            self.num_events += len(step_events)

    def add(self, index: int, e: RequestAdded) -> None:
        self.seqs.append(self.engine.add_request(request_prompt(e), SamplingParams(
            e.temperature, e.max_tokens, e.ignore_eos, e.top_k, e.top_p, None if e.seed == -1 else e.seed),
            seq_id=e.seq_id, session=(e.session_id, e.turn, e.depends_on, e.think_ns) if e.session_id else None))

    def abort(self, seq_id: int, reason: str) -> bool:
        return self.engine.abort_request(seq_id, reason) is not None

    def feed(self, step_events) -> None:
        runner = self.runner
        runner.tokens = tokens = {}
        runner.verified = verified = {}
        runner.proposer.drafts = {}
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
        end = step_events[-1]
        self.engine.recorded_start_ns = start_ns = self.step_end_ns + end.gap_ns
        self.step_end_ns = start_ns + end.schedule_ns + end.model_ns + end.postprocess_ns

    def is_finished(self) -> bool:
        return self.engine.is_finished()

    def step(self):
        self.engine.step()

    def diverged(self, d: Diverged):
        step, index = self.step_no, self.sink.index
        state = live_state(self.engine.scheduler, step, self.seqs)
        return {"step": step, "index": index, "state": state}, step, self.num_events + index

    def replayed(self):
        scheduler = self.engine.scheduler
        return self.engine.num_steps, self.num_events, len(scheduler.waiting) + len(scheduler.running)


def reexecute(events, policy: type | str | None = None) -> ReplayResult:
    """Re-execute `events` (TraceHeader first); stops at the first divergence. `policy`: the
    scheduler to replay with; without it the recorded built-in policy (a recorded policy of
    one's own is never imported on its own: pass it)."""
    header, it = split_header(events)
    return replay(EngineReplay(header, iter_steps(it), policy))


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
