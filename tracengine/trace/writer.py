"""Writing a trace: `TraceWriter`, the event sink that writes one frame per step as it
ends (crash-safe: a killed process leaves every finished step), a between-steps frame when
flushed (an idle server's abort), the end frame at close, and
the compaction that then deflates the closed trace in place (frames.py: the format)."""
import os
import stat
import sys

import msgspec

from tracengine.errors import TraceError, TracengineError
from tracengine.process.signals import interrupt_signal_name
from tracengine.trace.block_runs import events_to_wire
from tracengine.trace.events import Event, RunEnd, StepEnd, TraceHeader
from tracengine.trace.frames import (
    BETWEEN_STEPS,
    DEFLATED,
    FORMAT_VERSION,
    FRAME_BUFFER_BYTES,
    MAGIC,
    MAX_FRAME_BYTES,
    PREAMBLE,
    deflate_frame,
    end_frame,
    frame_bytes,
    primed_deflater,
    stored_frame_head,
)
from tracengine.trace.header import split_header
from tracengine.trace.reader import TraceReader


def run_end_of(exc: BaseException, last_step: int) -> RunEnd:
    """The RunEnd of a run that `exc` ended after `last_step`: a signal's name, or the error's first line."""
    if isinstance(exc, KeyboardInterrupt):
        return RunEnd(last_step, "interrupted", interrupt_signal_name(exc))
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if not isinstance(exc, TracengineError):
        message = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return RunEnd(last_step, "failed", message)


def recording_temp(path: str) -> str:
    """Where a writer records until its first step replaces the existing file at `path`."""
    return path + ".recording.tmp"


def _existing_file(path: str) -> str | None:
    """The real path of the regular file at `path` (through links), or None: nothing there,
    or a device or a pipe (`--record /dev/null`), written in place."""
    real = os.path.realpath(path)
    try:
        return real if stat.S_ISREG(os.stat(real).st_mode) else None
    except FileNotFoundError:
        return None


def compaction_temp(path) -> str:
    """Where the deflated copy of the trace at `path` is written before it replaces it."""
    return os.fspath(path) + ".compacting.tmp"


def compact(path) -> None:
    """Rewrites the closed trace at `path` with every stored frame deflated where
    that makes it smaller (`deflate_frame`; deflated frames are copied as they
    are, no event is decoded): the copy is written to
    `compaction_temp(path)`, synced, then renamed over `path`, so `path` names a
    whole trace at every instant, and a reader that has it open keeps reading
    the old file. Raises OSError or TraceError (the trace left as it was)."""
    path = os.path.realpath(path)        # a link stays a link to the compacted trace
    temp = compaction_temp(path)
    with TraceReader(path) as reader:
        if not reader.ended or reader.corruption is not None or reader.version != FORMAT_VERSION:
            raise TraceError(f"{path}: only a whole, closed format {FORMAT_VERSION} trace is compacted")
        deflater = primed_deflater()
        try:
            # buffered: the copy is written in a loop and synced once; O_EXCL: a file of this name
            # is a killed compaction's, removed first (it never names a trace)
            _remove_stale(temp)
            with open(temp, "xb") as out:
                os.fchmod(out.fileno(), stat.S_IMODE(os.fstat(reader._fd).st_mode))
                out.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION))
                for word, stored in reader.stored_frames():
                    if not word & DEFLATED:
                        word, stored = deflate_frame(deflater, stored)
                    out.write(frame_bytes(stored, bool(word & DEFLATED)))
                out.write(end_frame(reader.run_end))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            _remove_stale(temp)
            raise
    try:    # the rename itself, on the disk
        directory = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:     # a file system that syncs no directory: the trace is whole either way
        pass


def _remove_stale(temp: str) -> None:
    try:
        if stat.S_ISREG(os.lstat(temp).st_mode):
            os.remove(temp)
    except FileNotFoundError:
        pass


class TraceWriter:
    """An event sink that writes one frame per step, at its StepEnd, stored, and
    compacts the trace when it closes (`compact`: every frame deflated where that
    makes it smaller). With `deflate=False` the frames stay stored
    (`simulate --record`, benchmarks, tests). A compaction that fails (a full
    disk) leaves the stored trace, whole, and says so on stderr.

    Closed by a `with` that an exception leaves, or after `end_with`, the trace
    ends with a RunEnd (failed, or interrupted by a signal) instead of the empty
    end frame of a run that finished. Given an existing regular file, the writer
    replaces it only at the first step (frames.py)."""
    enabled = True

    def __init__(self, path, header: TraceHeader, deflate: bool = True):
        if header.format_version != FORMAT_VERSION:   # a header copied from an older trace (what-if, a snapshot)
            header = msgspec.structs.replace(header, format_version=FORMAT_VERSION)
        self.header = header
        self.path = os.fspath(path)
        self._encoder = msgspec.msgpack.Encoder()
        # every frame is encoded into this one buffer (encode_into keeps its memory): a new
        # payload per frame grew by reallocation as msgspec wrote it, some seven times for a
        # frame of a few KB
        self._payload = bytearray()
        self._pending: list[Event] = []
        self._last_step_written = -1
        self._last_step_complete = -1     # the last step whose frame is wholly on the file
        self._run_end: RunEnd | None = None
        # the old file a run replaces once its first step is written (None: nothing to replace)
        self._replacing = _existing_file(self.path)
        # unbuffered: each frame is on the file (in the kernel: a killed process keeps it) when
        # its write returns, with no flush to call
        if self._replacing is None:
            self._file = open(path, "wb", buffering=0)
        else:
            _remove_stale(recording_temp(self._replacing))   # a killed writer's
            self._file = open(recording_temp(self._replacing), "xb", buffering=0)
        self._fd = self._file.fileno()
        st = os.fstat(self._fd)
        # a device or a pipe (--record /dev/null) is written, never replaced
        self._compact = deflate and stat.S_ISREG(st.st_mode)
        self._identity = (st.st_dev, st.st_ino)
        if self._compact:
            _remove_stale(compaction_temp(os.path.realpath(path)))   # a killed compaction's
        try:
            self._write(PREAMBLE.pack(MAGIC, FORMAT_VERSION))
            self._write_frame([header])
        except BaseException:
            self._file.close()
            if self._replacing is not None:
                os.remove(recording_temp(self._replacing))
            raise

    def emit(self, event: Event) -> None:
        self._pending.append(event)
        if type(event) is StepEnd:
            # Marked written before the write: an interrupt anywhere in it loses this step, or
            # nothing, but never writes it twice (see close).
            self._last_step_written = event.step
            self._write_frame(self._pending)
            self._pending = []
            self._last_step_complete = event.step
            if self._replacing is not None:
                self._replace_old_file()

    def _write_frame(self, events: list[Event]) -> None:
        # Inside the step loop, after a forward pass has evicted the caches: every call and
        # allocation here is paid cold, so the frame is encoded into the writer's one buffer,
        # stored (deflate waits for close), and goes to the file in one write call on an
        # unbuffered file.
        payload = self._payload
        try:
            self._encoder.encode_into(events_to_wire(events), payload)
        except OverflowError as exc:    # a simulated time past 2**64 ns (a step-time model's absurd scale)
            raise TraceError(f"a number of the run does not fit the trace's 64-bit integers ({exc})") from None
        nbytes = len(payload)
        if nbytes > FRAME_BUFFER_BYTES:     # a frame of long prompts: its memory is not kept
            self._payload = bytearray()
        if nbytes > MAX_FRAME_BYTES:
            raise TraceError(f"a frame of {nbytes} bytes exceeds the limit of {MAX_FRAME_BYTES}")
        # head and payload in one call, gathered by the kernel: a frame is not copied to be joined
        head = stored_frame_head(payload)
        written = os.writev(self._fd, (head, payload))
        if written < len(head) + len(payload):     # a short write: the rest as _write writes
            self._write((head + payload)[written:])

    def _write(self, data: bytes) -> None:
        """All of `data`, in one write call but for a short write (a full disk, a signal)."""
        written = self._file.write(data)
        while written < len(data):
            with memoryview(data) as view:
                written += self._file.write(view[written:])

    def flush(self) -> None:
        """Writes the events that came since the last step and before the next one began
        (requests added or aborted) as a between-steps frame, now (format 8): a server
        whose abort leaves the engine idle has the abort on the file at once, not at a next
        step that may never come. The step's own events, if it has begun, wait for its
        StepEnd; nothing pending, nothing written."""
        pending = self._pending
        if self._file.closed or (pending and type(pending[-1]) is StepEnd):   # a step interrupted in its write
            return
        begun = _first_step_event(pending)
        if begun:
            # detached before the write: an interrupt in it writes them or loses them, never twice
            self._pending = pending[begun:]
            self._write_frame(pending[:begun])
            if self._replacing is not None:     # the new run has recorded something of its own
                self._replace_old_file()

    def close(self) -> None:
        """Ends the trace at the last finished step, then the end frame. Of the events
        after it, those between steps (requests added or aborted) are written as a
        frame; a step that began and did not finish (an interrupt, an error in the
        model) leaves nothing, so the trace never holds half a step. Then compacts it."""
        if self._file.closed:
            return
        pending = self._pending
        if pending and type(pending[-1]) is StepEnd:
            if pending[-1].step == self._last_step_written:   # interrupted in its write: written or lost
                pending = []
        else:
            pending = pending[:_first_step_event(pending)]
        try:
            if pending:
                self._write_frame(pending)
        except BaseException as exc:    # the between-steps frame: the trace still ends, saying why
            self.end_with(exc)
            raise
        finally:
            self._pending = []
            self._end()

    def end_with(self, exc: BaseException) -> None:
        """Close (when it comes) as a run that `exc` ended: failed, or interrupted by a signal."""
        if self._run_end is None:
            self._run_end = run_end_of(exc, self._last_step_complete)

    def _replace_old_file(self) -> None:
        os.replace(recording_temp(self._replacing), self._replacing)
        self._replacing = None

    def _end(self) -> None:
        run_end = self._run_end
        if run_end is not None and run_end.step != self._last_step_complete:
            run_end = msgspec.structs.replace(run_end, step=self._last_step_complete)
        self._write(end_frame(run_end))
        self._file.close()
        if self._replacing is not None:     # no step was written
            if run_end is None:
                self._replace_old_file()
            else:
                os.remove(recording_temp(self._replacing))
                print(f"tracengine: note: {self.path} is kept as it was: the new run "
                      f"{'failed' if run_end.outcome == 'failed' else 'was interrupted'} before its first step",
                      file=sys.stderr)
                return
        if self._compact:
            self._compact_closed()

    def _compact_closed(self) -> None:
        # The stored trace is whole and ended: a compaction that fails leaves it as it is, and
        # the recording succeeded all the same.
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) != self._identity:
                raise TraceError("the path names another file now")
            compact(self.path)
        except (OSError, TraceError) as exc:
            print(f"tracengine: warning: {self.path} is kept with its frames stored, not deflated ({exc})",
                  file=sys.stderr)

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            self.end_with(exc)
        self.close()


def _first_step_event(pending: list[Event]) -> int:
    """The index of the first event of `pending` that belongs to a step (len(pending) if none):
    the events before it came between steps."""
    return next((i for i, e in enumerate(pending) if type(e) not in BETWEEN_STEPS), len(pending))


def write_trace(path, events, **writer_options) -> str:
    """Events (the TraceHeader first) written as a whole trace file; returns the path."""
    header, rest = split_header(events)
    with TraceWriter(path, header, **writer_options) as writer:
        for event in rest:
            writer.emit(event)
    return str(path)
