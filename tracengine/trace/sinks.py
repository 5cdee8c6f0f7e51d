"""Where emitters send events (the scheduler, the block manager and the engine hold one sink,
given at construction): the one interface, the disabled sink that costs a branch, and a list."""
from typing import Protocol

from tracengine.trace.events import Event


class EventSink(Protocol):
    """Where emitters send events. Emitters test `enabled` before building an
    event, so a disabled sink costs a branch; each event carries its own step.
    A sink may also say `block_events = False`: it keeps none of the block-level
    events (a block appended, hashed or freed), and the block managers build none
    for it (a live fold of the figures, which no such event changes). And a sink
    whose only reader is a live fold may give `token_kept(step, seq_id)`, the
    fold's own: the scheduler then calls it for each kept token, building no
    TokenSample (a dropped one, which no figure counts, it skips). A sink that
    says `decode_seqs = False` reads no decode step's sequences (a lean live fold:
    a request's figures start at its first prefill, a decode step's sums need only
    its totals), and gets a decode step's ScheduleDecision with its `seqs` empty.
    The emitters read these once, when the sink is set (their `sink` setters), not per event."""
    enabled: bool

    def emit(self, event: Event) -> None: ...


def block_events_kept(sink: EventSink) -> bool:
    """Whether `sink` keeps the block-level events: unless it says it does not."""
    return getattr(sink, "block_events", True)


def decode_seqs_kept(sink: EventSink) -> bool:
    """Whether `sink` reads a decode step's sequences: unless it says it does not."""
    return getattr(sink, "decode_seqs", True)


class NullSink:
    """No sink attached: emitters check `enabled` and build nothing."""
    enabled = False

    def emit(self, event: Event) -> None:
        pass


NULL_SINK = NullSink()


class ListSink:
    """Keeps events in memory: tests, replay and what-if."""
    enabled = True

    def __init__(self):
        self.events: list[Event] = []
        self.emit = self.events.append     # the list's own method: no Python call per event

    def emit(self, event: Event) -> None:
        self.events.append(event)
