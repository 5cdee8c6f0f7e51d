"""Re-execution, written once for every backend: a replaying engine is given the trace's
recorded calls in the recorded order, every event it emits is compared with the recorded one
by one comparison (`same`), and the first difference is reported as one Divergence.

A replaying engine is the engine interface (engine/interface.py: add, abort, step,
is_finished) with what a replay adds to it:

- `calls()`: the recorded order, as (call, argument) pairs: ADD a RequestAdded, ABORT a
  SeqAbort, STEP (`feed(argument)`, then `step()`), OWN (`own(argument)`: a call only that
  backend makes, such as a fleet's KV transfer); the checks of that order (an event the trace
  has where the replay has nothing to call) are raised from it as Diverged;
- `feed(recorded)`: what the step about to run takes from the trace (its sampled tokens, kept
  drafts, proposed drafts), which the replay feeds back as the model's output;
- `sink`: the ComparingSink its events go to; `no_abort`, `nothing_left`: the reasons it gives
  when an abort finds no request and when it has nothing to step where the trace has a step;
- `diverged(d) -> (where, num_steps, num_events)`: where the difference is (the Divergence's
  fields but the events and the reason: its step, its index, the replaying engine's live state
  in tracengine's terms), the steps and events reproduced before it; `replayed() ->
  (num_steps, num_events, num_unfinished)`.

The backends' replaying engines: tracengine's (replay/reexec.EngineReplay), vLLM's scheduler
as its engine core calls it, with steps in flight (vllm/replay.VllmReplay), SGLang's as its
loop runs it (sglang/replay.SglangReplay), a fleet's replicas and routers
(fleet/replay.ReplayingFleet)."""
import operator
import time
from dataclasses import dataclass

from tracengine.engine.hash_id_prompt import hashed_blocks
from tracengine.errors import RequestError
from tracengine.replay.state import FoldState
from tracengine.trace.events import WALL_CLOCK_FIELDS, AnyEvent, BlockHash, Event, PromptBlocksHashed
from tracengine.trace.vllm_events import BACKEND_EVENTS

ADD, ABORT, STEP, OWN = "add", "abort", "step", "own"


def _compared(cls):
    """The fields of `cls` a replay compares, as one getter: `without_wall_clock` without its per-call work."""
    return operator.attrgetter(*[name for name in cls.__struct_fields__ if name not in WALL_CLOCK_FIELDS])


_COMPARED = {cls: _compared(cls) for cls in (*AnyEvent.__args__, *BACKEND_EVENTS)}


def _same_but_wall_clock(recorded, event) -> bool:
    return type(recorded) is type(event) and _COMPARED[type(event)](recorded) == _COMPARED[type(event)](event)


def same(recorded, event) -> bool:
    """The one comparison of a replay: equal events are the same; otherwise only their
    wall-clock fields may differ."""
    return recorded == event or _same_but_wall_clock(recorded, event)


class Diverged(Exception):
    """The first difference: `index` of the event in its step (None: the sink's position)."""

    def __init__(self, expected, actual, reason, index=None):
        super().__init__(reason)
        self.expected, self.actual, self.reason, self.index = expected, actual, reason, index


class ComparingSink:
    """An event sink that checks each event against the next of the recorded ones
    (`expected[index]`) as it is emitted, and raises Diverged at the first difference."""
    enabled = True

    def __init__(self, expected: list | None = None, index: int = 0):
        self.expected: list[Event] = [] if expected is None else expected
        self.index = index

    def emit(self, event: Event) -> None:
        if type(event) is PromptBlocksHashed and self.index < len(self.expected) \
                and type(self.expected[self.index]) is BlockHash:
            # a trace older than format 7 recorded a hash-id prompt's blocks as a BlockHash each
            for block_hash in hashed_blocks(event):
                self.compare(block_hash)
        else:
            self.compare(event)

    def compare(self, event: Event) -> None:
        i = self.index
        try:
            recorded = self.expected[i]
        except IndexError:
            raise Diverged(None, event, "the replay emitted an event the trace does not have") from None
        if recorded != event and not _same_but_wall_clock(recorded, event):
            raise Diverged(recorded, event, "the replay emitted a different event")
        self.index = i + 1

    def next_expected(self):
        return self.expected[self.index] if self.index < len(self.expected) else None

    def missing(self):
        """Diverged: the trace has more events where the replay emitted all it had."""
        return Diverged(self.expected[self.index], None, "the trace has an event the replay did not emit")


def check_emitted(expected: list, emitted) -> None:
    """`emitted` so far in a step against the step's recorded events, where the sink sees them
    only later (vLLM's scheduled step, compared before its output is fed); Diverged with the
    event's index in the step."""
    for i, event in enumerate(emitted):
        recorded = expected[i] if i < len(expected) else None
        if not same(recorded, event):
            raise Diverged(recorded, event, "the replay emitted a different event" if recorded is not None
                           else "the replay emitted an event the trace does not have", i)


@dataclass
class Divergence:
    step: int | None
    index: int                 # of the event within the step (a fleet's: within the trace, the header being 0)
    expected: Event | None     # None: the trace has no more events in this step
    actual: Event | None       # None: the replay emitted nothing where the trace has `expected`
    reason: str
    state: FoldState | None = None   # the replaying scheduler at the moment it diverged
    replica: int | None = None       # a fleet's: the replica whose event it is (None: a router's or a transfer's)
    seq_id: int | None = None        # a fleet's: the request of a routing or transfer divergence


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


def replay(engine) -> ReplayResult:
    """Re-executes a trace on `engine`, a replaying engine (above): its recorded calls in the
    recorded order, stopping at the first difference."""
    start = time.perf_counter()
    sink = engine.sink
    try:
        for call, arg in engine.calls():
            if call is STEP:
                engine.feed(arg)
                if engine.is_finished():
                    raise Diverged(sink.next_expected(), None, engine.nothing_left)
                engine.step()
            elif call is ADD:
                try:
                    engine.add(arg.seq_id, arg)
                except RequestError as exc:
                    raise Diverged(arg, None, f"the replay refused the request: {exc}") from None
            elif call is ABORT:
                if not engine.abort(arg.seq_id, arg.reason):
                    raise Diverged(arg, None, engine.no_abort.format(seq_id=arg.seq_id))
            else:
                engine.own(arg)
    except Diverged as d:
        where, num_steps, num_events = engine.diverged(d)
        return ReplayResult(num_steps, num_events, time.perf_counter() - start,
                            Divergence(expected=d.expected, actual=d.actual, reason=d.reason, **where))
    num_steps, num_events, num_unfinished = engine.replayed()
    return ReplayResult(num_steps, num_events, time.perf_counter() - start, num_unfinished=num_unfinished)
