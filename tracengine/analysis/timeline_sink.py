"""The live fold: an event sink that folds a run's events into a RequestTimeline (timeline.py)
as they come, for the figures of a run with no trace file to read them from (generate, simulate).
A Python class, not in the compiled core: its emit is set per instance, and a benchmark switches
it off on the class (bench_vs_dynamo.py --floor)."""
import msgspec

from tracengine.analysis.timeline import FOLD, RequestTimeline
from tracengine.trace.events import RequestAdded, TraceHeader
from tracengine.trace.sinks import block_events_kept, decode_seqs_kept


def _emit_both(inner_emit, timeline):
    """An emit that passes an event on and folds it, the timeline's add inline (a call less an
    event); a closure over the two, not a sink's bound method kept on the sink (a cycle)."""
    def emit(event) -> None:
        inner_emit(event)
        fold = FOLD.get(type(event))
        if fold is not None:
            fold(timeline, event)
    return emit


def fold_reads(inner, lean: bool) -> tuple[bool, bool]:
    """(`block_events`, `decode_seqs`: trace/sinks.py) of a live fold with `inner` behind it (a
    writer, or None): the block-level events change no figure (timeline.FOLD), and a lean fold reads
    no decode step's sequences, so each is wanted only where the writer behind wants it."""
    block_events = inner is not None and block_events_kept(inner)
    decode_seqs = not lean or inner is not None and decode_seqs_kept(inner)
    return block_events, decode_seqs


class RequestTimelineSink:
    """An event sink that folds what it is given into a RequestTimeline as it comes, and passes it on to
    `inner` (a trace writer) if there is one: the run figures of a run with no trace file to read them from."""
    enabled = True
    token_kept = None     # (the usual run's, set per instance)

    def __init__(self, header: TraceHeader, inner=None, first_step: int = 0, origin_ns: int = 0,
                 lean: bool = False):
        self.timeline = RequestTimeline(header, lean)
        self.inner = inner if inner is not None and inner.enabled else None
        self.block_events, self.decode_seqs = fold_reads(self.inner, lean)
        # An engine that ran before counts on from its last step and its own start: this
        # run's figures count steps from 0 and time from `origin_ns` of the engine's clock.
        self.first_step = first_step
        self.origin_ns = origin_ns
        if not (first_step or origin_ns):    # the usual run: every event as it is, one call less each
            self.emit = (self.timeline.add if self.inner is None     # type: ignore[method-assign]
                         else _emit_both(self.inner.emit, self.timeline))
            if self.inner is None:      # the fold reads the tokens alone: taken without their events (sinks.py)
                self.token_kept = self.timeline.token_kept

    def emit(self, event) -> None:
        if self.inner is not None:
            self.inner.emit(event)
        if self.first_step or self.origin_ns:
            event = msgspec.structs.replace(event, step=event.step - self.first_step)
            if type(event) is RequestAdded and event.arrival_ns >= 0:
                event = msgspec.structs.replace(event, arrival_ns=max(0, event.arrival_ns - self.origin_ns))
        self.timeline.add(event)
