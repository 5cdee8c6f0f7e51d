"""The one loop in simulated time, over the engine interface (engine/interface.py), and
tracengine's own engine on that clock (`ClockedEngine`).

`run_in_time` gives an engine each request at its arrival, before any step that starts
later, and steps it until it is finished and no request is left to come: tracengine's
engine (`ClockedEngine`), vLLM's scheduler (vllm/timed.py) and a fleet (fleet/engine.py)
all run through it, so a session's turns, the progress reports and the step limit are the
same for each. Each engine keeps its own clock: when its next step starts (`next_step_ns`,
None when idle), which an arrival may bring forward."""
import operator
from typing import Any, Final

from tracengine.engine.llm_engine import postprocess_drafting
from tracengine.engine.native import mypyc_attr
from tracengine.engine.scheduler import Scheduler
from tracengine.engine.sequence import Sequence
from tracengine.errors import TracengineError
from tracengine.engine.request import Request
from tracengine.engine.sampling_params import SamplingParams
from tracengine.sim.steptime import LinearStepTime, holds_decode, seqs_shape, step_shape
from tracengine.trace.events import StepEnd, prefill_flags
from tracengine.workload.sessions import NOT_HELD, session_turn

PROGRESS_EVERY = 512     # steps between two calls of a run's `on_progress`
STEP_END: Final = StepEnd     # made every step: Final, compiled, a C static, not a lookup in the module's dict


class Stepped:
    """What an engine's `step()` did: the sequences that finished, the seq_ids its departures
    took out, and whether a step ran (False: its clients left, or a fleet's transfer landed).
    A class of the compiled core, not a NamedTuple: made every step, natively."""

    def __init__(self, finished: list, aborted: list, ran: bool, end_ns: int) -> None:
        self.finished = finished
        self.aborted = aborted
        self.ran = ran
        self.end_ns = end_ns          # when the step ended, on the engine's clock

    def _replace(self, **changes: Any) -> "Stepped":
        """A copy with the fields `changes` names changed, as a NamedTuple's `_replace`."""
        fields: dict[str, Any] = {"finished": self.finished, "aborted": self.aborted, "ran": self.ran,
                                  "end_ns": self.end_ns}
        fields.update(changes)
        return Stepped(fields["finished"], fields["aborted"], fields["ran"], fields["end_ns"])

    def __repr__(self) -> str:
        return (f"Stepped(finished={self.finished!r}, aborted={self.aborted!r}, ran={self.ran!r}, "
                f"end_ns={self.end_ns!r})")


def sampling_params_of(request: Request) -> SamplingParams:
    return SamplingParams(request.temperature, request.max_tokens, request.ignore_eos)


def run_in_time(engine, take, sessions=None, max_steps: int = 10_000_000, on_progress=None,
                arrival: str = "arrival_ns") -> int:
    """Runs `engine` (the engine interface, simulated time) over the requests `take()` gives, as
    (index, request) in arrival order, NOT_HELD when none is left; `sessions` (a SessionRelease,
    whose `pop` is then `take`): turns released as their dependencies finish, and ended by an
    abort. Returns the number of steps that ran. `on_progress(num_finished, now_ns)`: every
    PROGRESS_EVERY steps and at the end. `arrival`: the request's field its engine's clock
    reads, "arrival_ns", or "arrival_step" for an engine on a clock of steps (StepClockedEngine)."""
    arrival_of = operator.attrgetter(arrival)
    clocked = engine if isinstance(engine, ClockedEngine) else None     # tracengine's: called natively
    index, request = take()
    arrival_at = arrival_of(request) if request is not None else 0    # the next request's, read once
    num_steps = num_finished = 0
    end_ns = 0
    while True:
        start = clocked.next_step_ns() if clocked is not None else engine.next_step_ns()
        if request is not None and (start is None or arrival_at <= start):
            engine.add(index, request)
            index, request = take()
            arrival_at = arrival_of(request) if request is not None else 0
            continue
        if start is None:
            if engine.is_finished():
                break
            raise TracengineError(engine.stuck_reason())
        stepped: Stepped = clocked.step() if clocked is not None else engine.step()
        if sessions is not None:
            if stepped.aborted:        # an aborted turn ends its session
                index, request = sessions.end(stepped.aborted, (index, request))
            if stepped.finished:       # the turns they release: sent after their think time
                index, request = sessions.release(stepped.finished, stepped.end_ns, (index, request))
            arrival_at = arrival_of(request) if request is not None else 0
        if not stepped.ran:
            continue
        end_ns = stepped.end_ns
        num_steps += 1
        num_finished += len(stepped.finished)
        if num_steps >= max_steps:
            raise TracengineError(f"the {'simulation' if arrival == 'arrival_ns' else 'workload'} did not finish "
                                  f"in {max_steps} steps")
        if on_progress is not None and not num_steps % PROGRESS_EVERY:
            on_progress(num_finished, end_ns)
    if on_progress is not None:
        on_progress(num_finished, end_ns)
    return num_steps


def decision_times(step_time: Any, decision: Any) -> tuple[int, int, int]:
    """(schedule_ns, model_ns, postprocess_ns) that `step_time` gives the batch of a recorded
    ScheduleDecision (a prefill step that also decodes is `mixed`): how an engine whose scheduler
    records its decisions (vLLM's, SGLang's) times its steps."""
    flags = prefill_flags(decision)
    is_prefill = any(flags)
    shape = step_shape((s.num_tokens, s.num_cached_tokens) for s in decision.seqs)
    return step_time.predict(is_prefill, *shape, mixed=is_prefill and not all(flags))


def in_arrival_order(requests: list, arrival: str = "arrival_ns"):
    """`take` for run_in_time over a list: (index, request) by arrival (`arrival`: the field), in
    list order at a tie."""
    arrival_of = operator.attrgetter(arrival)
    return taking(iter(sorted(enumerate(requests), key=lambda item: arrival_of(item[1]))))


def taking(pairs):
    """`take` for run_in_time over an iterator of (index, request): NOT_HELD once it is spent."""
    return lambda: next(pairs, NOT_HELD)


@mypyc_attr(native_class=False)     # its class is the model: read as the class, not an instance
class NoTime:
    """Steps of no duration: a re-execution follows the recorded order and compares no time."""
    kind = "replay"
    gap_ns = 0
    wake_ns = 0

    @staticmethod
    def predict(is_prefill, *shape, mixed=False):
        return 0, 0, 0


class SimulatedStepper:
    """The step of tracengine's engine in simulated time (sim/engine.SimulatedEngine's, which
    keeps its clock and counts here): schedule -> run -> postprocess -> StepEnd, each step lasting
    what the step-time model says. Compiled with the scheduler: the step's calls to it, the
    model and the sink are native where they can be, and the counts typed."""

    def __init__(self, step_time: Any) -> None:
        # (it holds none of its engine: the engine holds it, and a run's objects make no reference cycle)
        self.step_time = step_time
        # a linear model (the usual one) called natively, its features as machine ints
        self.linear: LinearStepTime | None = step_time if isinstance(step_time, LinearStepTime) else None
        self.now_ns = 0               # the engine's clock: its next step's start, then that step's end
        self.last_step_end_ns = 0
        self.num_steps = 0
        self.num_batched_tokens = 0   # tokens computed in the last step
        self.waits = False            # the last step scheduled nothing: every sequence waits for a transfer
        self.drafts = False           # speculative decoding is on

    def bind(self, scheduler: Scheduler, runner: Any, sink: Any, pending: list[Any], spec: Any, proposer: Any) -> None:
        """The engine's parts after it is (re)set: its scheduler, runner, sink, queue of arrivals to come,
        and its speculative decoding (None: off) and drafts' proposer."""
        self.scheduler = scheduler
        self.runner = runner
        self.sink = sink
        self.pending = pending
        self.spec = spec
        self.proposer = proposer
        self.drafts = spec is not None

    def is_finished(self) -> bool:
        return not self.pending and self.scheduler.is_finished()

    def step(self) -> tuple[list[Sequence], list[Sequence], bool]:
        """One step at `now_ns`; returns (scheduled, finished, is_prefill) as LLMEngine.step."""
        scheduler = self.scheduler
        step = self.num_steps
        scheduler.begin_step(step)
        tier = scheduler.cpu_tier
        if tier is not None:
            tier.begin_step(step, self.now_ns)
        seqs, is_prefill = scheduler.schedule()
        # a verify step is a decode whose sequences compute 1 + their drafts tokens each
        num_tokens, num_seqs, context, attended = seqs_shape(seqs, is_prefill, self.drafts)
        self.num_batched_tokens = num_tokens
        token_ids = self.runner.run(seqs, is_prefill)
        schedule_ns = model_ns = postprocess_ns = 0      # no sequence (each waits for a transfer): no forward pass
        if seqs:
            mixed = is_prefill and holds_decode(seqs)
            linear = self.linear
            if linear is not None:
                schedule_ns, model_ns, postprocess_ns = linear.predict(is_prefill, num_tokens, num_seqs, context,
                                                                       attended, mixed)
            else:
                schedule_ns, model_ns, postprocess_ns = self.step_time.predict(
                    is_prefill, num_tokens, num_seqs, context, attended, mixed=mixed)
        self.waits = not seqs
        if tier is not None:       # the forward pass waits for the stores of the GPU blocks it reuses
            schedule_ns += tier.flush_wait_ns()
        if self.drafts:
            finished: list[Sequence] = postprocess_drafting(scheduler, self.spec, self.proposer, seqs, token_ids,
                                                            is_prefill)
        else:
            finished = scheduler.postprocess(seqs, token_ids, is_prefill)
        sink = self.sink
        if sink.enabled:
            sink.emit(STEP_END(step, scheduler.block_manager.num_free_blocks, schedule_ns, model_ns, postprocess_ns,
                              self.now_ns - self.last_step_end_ns))
        self.now_ns += schedule_ns + model_ns + postprocess_ns
        self.last_step_end_ns = self.now_ns
        self.num_steps = step + 1
        return seqs, finished, is_prefill


class ClockedEngine:
    """tracengine's simulated engine (sim/engine.SimulatedEngine) on the clock: the requests
    given it that enter before its next step, when that step starts, and the clients that leave.

    A step starts its loop gap after the last one ended; idle, it sleeps until a request comes
    and wakes `wake_ns` after it (the first step no sooner than `first_step_ns`, a recording's
    start-up); a step that ran nothing (every sequence waits for a CPU tier's transfer) is
    followed by one when the next transfer ends, or when a request comes, if sooner. Requests
    enter, then those whose clients left by the step's start (`leaving(now_ns)`: (seq_id,
    reason) of each) leave, then it steps, unless they all left."""

    def __init__(self, engine, step_time, first_step_ns: int = 0, leaving=None, records_sessions: bool = True):
        self.engine = engine
        self.gap_ns, self.wake_ns = step_time.gap_ns, step_time.wake_ns
        self.first_step_ns = first_step_ns
        self.leaving = leaving
        self.records_sessions = records_sessions    # a fleet's decode replica records none: its prefill side did
        self.queued: list = []       # (index, request) given it, entering before its next step
        self.start_ns: int | None = None            # its next step's start; None: idle
        # the SimulatedEngine's step, clock and counts, called natively
        self.stepper: SimulatedStepper = engine.stepper

    @property
    def scheduler(self) -> Any:
        return self.engine.scheduler

    # -- the engine interface --------------------------------------------------------------

    def next_step_ns(self) -> int | None:
        return self.start_ns

    def add(self, index: int, request) -> None:
        """`request` arrives (at its arrival_ns): it enters before the next step."""
        self.queued.append((index, request))
        stepper, arrival_ns = self.stepper, request.arrival_ns
        if self.start_ns is None:        # idle: it sleeps until this arrival, and wakes late
            base = stepper.now_ns + self.gap_ns if stepper.num_steps else max(self.gap_ns, self.first_step_ns)
            self.start_ns = max(base, arrival_ns + self.wake_ns)
        elif stepper.waits:              # waiting for a CPU tier's transfer: an arrival wakes it sooner
            self.start_ns = min(self.start_ns, max(stepper.now_ns + self.gap_ns, arrival_ns + self.wake_ns))

    def abort(self, seq_id: int, reason: str) -> bool:
        """Its client leaves: a request given it but not entered yet is dropped (no event: the
        engine never saw it), one in the engine is aborted there."""
        for i, (index, r) in enumerate(self.queued):
            if (index if r.seq_id is None else r.seq_id) == seq_id:
                del self.queued[i]
                return True
        return self.engine.abort_request(seq_id, reason) is not None

    def is_finished(self) -> bool:
        return not self.queued and self.stepper.is_finished()

    def step(self) -> Stepped:
        """The step starting at `next_step_ns()`: entries, departures, then the engine's step, timed."""
        start = self.start_ns
        assert start is not None, "a step with none due"     # run_in_time asks next_step_ns first
        self.stepper.now_ns = start
        return self.run_step()

    def run_step(self, aborts=None) -> Stepped:
        """step() at the engine's `now_ns` as it is (a re-execution sets it); `aborts`: (seq_id,
        reason) of each client that leaves instead of `leaving`'s."""
        stepper = self.stepper
        if self.queued:
            self.enter()
        aborted = self._leave(aborts, stepper.now_ns)
        if stepper.is_finished():     # every request it held left: no step, it sleeps
            self.start_ns = None
            return Stepped([], aborted, False, stepper.now_ns)
        finished = stepper.step()[1]
        self._plan_next()
        return Stepped(finished, aborted, True, stepper.now_ns)

    def _leave(self, aborts: Any, now_ns: int) -> list[int]:
        """The seq_ids of the requests taken out before a step at `now_ns`: `aborts`' (seq_id,
        reason) pairs, or else `leaving`'s, each that is still held."""
        leaving = aborts if aborts is not None else self.leaving(now_ns) if self.leaving is not None else None
        if not leaving:
            return []
        return [seq_id for seq_id, reason in leaving if self.engine.abort_request(seq_id, reason) is not None]

    def _plan_next(self) -> None:
        """The next step's start after the one that just ended: a loop gap on, unless nothing is
        left; one that ran nothing (`waits`) waits for the CPU tier's next transfer to end."""
        stepper = self.stepper
        self.start_ns = stepper.now_ns + self.gap_ns if not stepper.is_finished() else None
        if stepper.waits and self.start_ns is not None:
            done = stepper.scheduler.cpu_tier.next_done_ns()
            self.start_ns = None if done is None else max(self.start_ns, done)

    def stuck_reason(self) -> str:
        return (f"the simulation is stuck at step {self.engine.num_steps}: no sequence can run and no transfer "
                "is in flight (the sequences set aside to load hold the KV blocks)")

    def enter(self) -> None:
        """The requests given it enter the engine (a request without a seq_id: its index)."""
        engine = self.engine
        for index, r in self.queued:
            engine.add_request(r.prompt, sampling_params_of(r), seq_id=index if r.seq_id is None else r.seq_id,
                               arrival_ns=r.arrival_ns, session=session_turn(r) if self.records_sessions else None)
        self.queued.clear()


class StepClockedEngine:
    """tracengine's engine (engine/llm_engine.LLMEngine) on a clock of steps: a step-exact run,
    whose requests arrive before the step their `arrival_step` names (a what-if of a trace at its
    recorded steps, a scripted workload). Its clock reads its next step's number; idle, it skips
    ahead to the next arrival's step, and the requests due by then enter at once. The clients
    that left by a step (`leaving(step)`: (seq_id, reason) of each) leave before it.
    `on_step(engine)`: after every step (property tests check invariants there)."""

    def __init__(self, engine, leaving=None, records_sessions: bool = False, on_step=None):
        self.engine = engine
        self.leaving = leaving
        self.records_sessions = records_sessions
        self.on_step = on_step
        self.start: int | None = None        # the next step's number, or the arrival it skipped to; None: idle

    def next_step_ns(self) -> int | None:
        return self.start

    def add(self, index: int, request) -> None:
        engine = self.engine
        engine.add_request(request.prompt, sampling_params_of(request),
                           seq_id=index if request.seq_id is None else request.seq_id,
                           session=session_turn(request) if self.records_sessions else None)
        if self.start is None:       # idle: the next arrivals come now
            self.start = max(engine.num_steps, request.arrival_step)

    def abort(self, seq_id: int, reason: str) -> bool:
        return self.engine.abort_request(seq_id, reason) is not None

    def is_finished(self) -> bool:
        return self.engine.is_finished()

    def step(self) -> Stepped:
        engine = self.engine
        leaving = self.leaving(engine.num_steps) if self.leaving is not None else ()
        aborted = [seq_id for seq_id, reason in leaving if engine.abort_request(seq_id, reason) is not None]
        if engine.is_finished():     # every request it held left: no step
            self.start = None
            return Stepped([], aborted, False, engine.num_steps)
        finished = engine.step()[1]
        if self.on_step is not None:
            self.on_step(engine)
        self.start = engine.num_steps if not engine.is_finished() else None
        return Stepped(finished, aborted, True, engine.num_steps)

    def stuck_reason(self) -> str:
        return f"the engine is stuck at step {self.engine.num_steps}"
