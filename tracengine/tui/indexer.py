"""Reading a trace in the background, with no Textual in it: the app runs
`read_in_background` in a thread worker and turns its callbacks into
messages (post_message is thread-safe; no widget is touched here)."""
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tracengine.errors import TracengineError
from tracengine.tui.trace_index import TraceIndex


@dataclass(frozen=True, slots=True)
class Pacing:
    slice_frames: int = 256         # frames read and folded at a time
    report_interval: float = 0.25   # seconds between two progress reports
    poll_interval: float = 0.2      # seconds between looks at a followed file
    yield_after_move: float = 0.5   # reading pauses this long after the user moves, so moving stays quick


def read_in_background(index: TraceIndex, follow: bool, stop: threading.Event, last_move: Callable[[], float],
                       report: Callable[[int, bool], None], fail: Callable[[str], None],
                       pacing: Pacing = Pacing()) -> None:
    """Reads `index` to the end of its file, then, when following, keeps
    reading what is appended until `stop` is set. `report(num_steps, done)`
    at most once per report interval, and once with done=True at the end of a
    file that is not followed or whose writer closed it (its end frame);
    `fail(message)` on damage, which ends reading.
    A torn last frame is a frame still being written: it is read once whole."""
    reported, reported_at = index.num_steps, time.monotonic()
    while not stop.is_set():
        if time.monotonic() - last_move() < pacing.yield_after_move:
            stop.wait(pacing.yield_after_move / 5)    # leave the interpreter to the user's moves
            continue
        try:
            added = index.index_more(pacing.slice_frames)
        except TracengineError as exc:
            fail(str(exc))
            return
        now = time.monotonic()
        if added and now - reported_at < pacing.report_interval:
            continue
        if index.num_steps != reported:
            report(index.num_steps, False)
            reported, reported_at = index.num_steps, now
        if added:
            continue
        if index.problem:
            fail(index.problem)
            return
        if not follow or index.ended:
            report(index.num_steps, True)
            return
        stop.wait(pacing.poll_interval)
