"""A trace writer that encodes, deflates and writes each step's frame on a
thread of its own, while the engine runs the next step: the step loop only
hands the step's events over. zlib and the file write release the GIL, so
most of the writer's time leaves the step (TraceWriter does it all inside).

At most one finished step waits for its write: a StepEnd hands its events
over only once the frame before it is on the file (flushed), so a process
killed at any point loses at most its last finished step, besides the one it
was running. The frames are TraceWriter's own, byte for byte."""
import threading

from tracengine.trace.events import Event, StepEnd, TraceHeader
from tracengine.trace.tracelog import TraceWriter


class ThreadedTraceWriter(TraceWriter):

    def __init__(self, path, header: TraceHeader, deflate: bool = True):
        super().__init__(path, header, deflate)       # the header frame is written here, at once
        self._cond = threading.Condition()
        self._queued: list[Event] | None = None       # the one step handed over and not yet written
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tracengine-trace-writer", daemon=True)
        self._thread.start()

    def emit(self, event: Event) -> None:
        self._pending.append(event)
        if type(event) is StepEnd:
            with self._cond:
                while self._queued is not None and self._error is None:
                    self._cond.wait()             # the frame before is still being written
                if self._error is not None:
                    raise self._error
                self._queued, self._pending = self._pending, []
                self._last_step_written = event.step
                self._cond.notify_all()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while self._queued is None and not self._closing:
                    cond.wait()
                events = self._queued
            if events is None:
                return
            try:
                self._write_frame(events)
            except BaseException as exc:          # the step loop raises it at the next StepEnd or close
                self._error = exc
            with cond:
                self._queued = None
                cond.notify_all()
            if self._error is not None:
                return

    def close(self) -> None:
        """Writes the step handed over, then as TraceWriter.close: the events after the
        last finished step that came between steps, and the end frame. A failed write
        is raised here too."""
        if self._file.closed:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        if self._error is not None:
            # no end frame after a frame that failed: the trace reads as a killed writer's
            self._file.close()
            raise self._error
        super().close()
