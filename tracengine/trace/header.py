"""A trace's first record: making the header of this format version, and checking that a
stream of events starts with one."""
import time
from typing import Iterator

from tracengine.version import __version__
from tracengine.errors import TraceError
from tracengine.trace.events import AnyEvent, ModelInfo, TraceHeader
from tracengine.trace.frames import FORMAT_VERSION


def make_header(config, model: ModelInfo | None = None, device: str = "cpu", torch_version: str = "",
                seed: int | None = None) -> TraceHeader:
    """A header of this format version for `config` (any object with `to_dict()` and `seed`)."""
    return TraceHeader(FORMAT_VERSION, __version__, config.to_dict(),
                       model if model is not None else ModelInfo("synthetic", "none", "none"),
                       device, torch_version, config.seed if seed is None else seed, time.time())


def check_header(event) -> TraceHeader:
    """The first event of a trace, which must be its TraceHeader: the one check."""
    if not isinstance(event, TraceHeader):
        got = "nothing" if event is None else type(event).__name__
        raise TraceError(f"a trace starts with a TraceHeader, not {got}")
    return event


def split_header(events) -> tuple[TraceHeader, Iterator[AnyEvent]]:
    """(the header, an iterator over the events after it)."""
    it = iter(events)
    return check_header(next(it, None)), it


def not_recorded_note(header: TraceHeader) -> str | None:
    """What `replay` and `check` say first of a trace that does not hold all its engine did (a
    vLLM feature recorded anyway, tracengine/vllm/features.py); None for a whole recording."""
    if not header.not_recorded:
        return None
    return (f"the trace was recorded without {'; '.join(header.not_recorded)} (recorded anyway): "
            f"a replay of it is not exact")
