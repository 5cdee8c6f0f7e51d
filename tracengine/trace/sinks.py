"""Where emitters send events (the scheduler, the block manager and the engine hold one sink,
given at construction): the one interface, the disabled sink that costs a branch, and a list."""
from typing import Protocol

from tracengine.trace.events import Event


class EventSink(Protocol):
    """Where emitters send events. Emitters test `enabled` before building an
    event, so a disabled sink costs a branch; each event carries its own step."""
    enabled: bool

    def emit(self, event: Event) -> None: ...


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
