"""Reading a trace: `TraceReader` indexes the frames (without decoding an event), checks
each frame's head and checksum, inflates and decodes it with one typed msgspec decoder,
reports a torn tail or damage with its offset and still gives every complete frame before
it; `open_trace` follows a file that is still being written (frames.py: the format)."""
import bisect
import os
import stat
import time
import zlib
from typing import Callable, Iterator

import msgspec
import xxhash

from tracengine.errors import TraceCorruptError, TraceError, TraceVersionError
from tracengine.trace.dictionary import DICTIONARY
from tracengine.trace.events import AnyEvent, RunEnd, StepEnd, TraceHeader
from tracengine.trace.frames import (
    DEFLATED,
    END_FRAME_V2,
    END_PAYLOAD,
    FRAME_HEAD,
    FRAME_HEAD_V2,
    INFLATE_SLACK,
    LEADING_BYTES,
    LENGTH_MASK,
    MAGIC,
    MAX_FRAME_BYTES,
    MAX_INFLATE_RATIO,
    MAX_INFLATE_RATIO_V2,
    PREAMBLE,
    READABLE_VERSIONS,
    SCAN_BYTES,
    WINDOW_BITS,
    FrameInfo,
    TornTail,
    RUN_END_SINCE,
    RUN_END_TAG,
    leading_event,
)


class TraceReader:
    """Random access to a trace's frames. The index (offset, first step, stored
    bytes of each frame) is built by one scan that checks every checksum;
    events are inflated and decoded only when a frame is read. `refresh()`
    picks up appended frames; `ended` turns true at the writer's end frame,
    which is not indexed (bytes after it are corruption).

    What could not be read is reported, not raised: `torn_tail` for an
    incomplete last frame, `corruption` (a TraceCorruptError) for a frame that
    fails its checksum or does not inflate; frames after a corrupt one are not
    indexed."""

    def __init__(self, path, max_frames: int | None = None):
        self.path = os.fspath(path)
        self._decoder = msgspec.msgpack.Decoder(list[AnyEvent])
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            if stat.S_ISDIR(os.fstat(self._fd).st_mode):   # opens on Linux; its reads fail with no name
                raise TraceError(f"{self.path} is a directory, not a trace")
            self._read_preamble()
            self._frames: list[FrameInfo] = []
            self._end = PREAMBLE.size
            self.torn_tail: TornTail | None = None
            self.corruption: TraceCorruptError | None = None
            self.ended = False   # the end frame was read: nothing more will be written
            self.run_end: RunEnd | None = None   # from the end frame: why the run ended early
            self._num_forgotten = 0   # frames dropped from the index by events_once
            self.refresh(max_frames)
            self.header = self._read_header()
        except BaseException:
            os.close(self._fd)
            raise

    def _read_preamble(self) -> None:
        data = os.pread(self._fd, PREAMBLE.size, 0)
        if data[:len(MAGIC)] != MAGIC[:len(data)] or not data:
            what = "it is empty" if not data else f"it does not start with {MAGIC!r}"
            raise TraceError(f"{self.path}: not a tracengine trace ({what})")
        if len(data) < PREAMBLE.size:
            raise TraceCorruptError(f"{self.path}: the file ends inside its preamble ({len(data)} of "
                                    f"{PREAMBLE.size} bytes; no header was written)", len(data))
        version, reserved = PREAMBLE.unpack(data)[1], int.from_bytes(data[6:8], "little")
        if version not in READABLE_VERSIONS:
            raise TraceVersionError(f"{self.path}: trace format version {version}, "
                                    f"this tracengine reads versions {READABLE_VERSIONS[0]} to {READABLE_VERSIONS[-1]}")
        if reserved and version >= 3:
            raise TraceCorruptError(f"{self.path}: the preamble's reserved bytes are {reserved:#06x}, not zero", 6)
        self.version = version
        self._head = FRAME_HEAD if version >= 3 else FRAME_HEAD_V2
        self._max_ratio = MAX_INFLATE_RATIO if version >= 3 else MAX_INFLATE_RATIO_V2

    def _read_header(self) -> TraceHeader:
        if not self._frames:
            if self.corruption is not None:
                raise self.corruption
            raise TraceCorruptError(f"{self.path}: the file ends inside its header frame (no complete header)",
                                    PREAMBLE.size)
        events = self.read_frame(0)
        if len(events) != 1 or type(events[0]) is not TraceHeader:
            raise TraceCorruptError(f"{self.path}: the first frame holds no TraceHeader", PREAMBLE.size)
        if events[0].format_version != self.version:
            raise TraceCorruptError(f"{self.path}: the header says format version {events[0].format_version}, "
                                    f"the preamble {self.version}", PREAMBLE.size)
        return events[0]

    def refresh(self, max_frames: int | None = None) -> int:
        """Indexes frames appended since the last scan, at most `max_frames` of
        them (so a large trace can be indexed in slices); returns how many."""
        num_before = len(self._frames)
        file_size = os.fstat(self._fd).st_size
        data, base = b"", self._end        # file bytes from offset `base`, read SCAN_BYTES at a time
        while self.corruption is None and not self.ended:
            if max_frames is not None and len(self._frames) - num_before >= max_frames:
                self.torn_tail = None     # the end is not reached yet
                return len(self._frames) - num_before
            offset = self._end
            head = self._head
            if file_size - offset < head.size:
                break
            if offset + head.size > base + len(data):
                data, base = os.pread(self._fd, min(SCAN_BYTES, file_size - offset), offset), offset
            word, checksum, *head_check = head.unpack_from(data, offset - base)
            if head_check and xxhash.xxh32_intdigest(data[offset - base:offset - base + 12]) != head_check[0]:
                self._corrupt(f"frame {self._num_forgotten + len(self._frames)}'s head (length and checksum) fails its check", offset)
                break
            nbytes = word & LENGTH_MASK
            if nbytes > MAX_FRAME_BYTES:
                self._corrupt(f"frame {self._num_forgotten + len(self._frames)} claims {nbytes} bytes, over the limit of {MAX_FRAME_BYTES}",
                              offset)
                break
            end = offset + head.size + nbytes
            if end > file_size:
                # Without a head check (v1, v2) a damaged length looks like a torn tail;
                # a file that goes on to an end frame was not torn.
                if not head_check and self._ends_with_end_frame(file_size):
                    self._corrupt(f"frame {self._num_forgotten + len(self._frames)} claims {nbytes} bytes, past the end of a file "
                                  f"that ends with an end frame: a damaged length", offset)
                break
            if end > base + len(data):
                data, base = os.pread(self._fd, min(max(SCAN_BYTES, end - offset), file_size - offset), offset), offset
            stored = data[offset - base + head.size:end - base]
            if xxhash.xxh64_intdigest(stored, word >> 31) != checksum:
                self._corrupt(f"frame {self._num_forgotten + len(self._frames)} fails its checksum", offset)
                break
            if stored == END_PAYLOAD and not word & DEFLATED and self._frames:
                self.ended, self._end = True, end
                if file_size > end:
                    self._corrupt(f"{file_size - end} bytes follow the end frame", end)
                break
            leading = self._first_event(stored, word, offset) if self._frames else (None, -1)
            if leading is None:
                break
            tag, step = leading
            if tag == RUN_END_TAG and self.version >= RUN_END_SINCE:
                self._read_run_end(stored, word, offset)
                if self.corruption is None:
                    self.ended, self._end = True, end
                    if file_size > end:
                        self._corrupt(f"{file_size - end} bytes follow the end frame", end)
                break
            self._frames.append(FrameInfo(offset, step, nbytes))
            self._end = end
        tail = file_size - self._end
        self.torn_tail = TornTail(self._end, tail) if tail and self.corruption is None else None
        return len(self._frames) - num_before

    def _ends_with_end_frame(self, file_size: int) -> bool:
        tail = os.pread(self._fd, len(END_FRAME_V2), file_size - len(END_FRAME_V2))
        return tail == END_FRAME_V2

    def _read_run_end(self, stored, word: int, offset: int) -> None:
        """The end frame of a run that ended early: one RunEnd, stored."""
        try:
            events = None if word & DEFLATED else self._decoder.decode(stored)
        except msgspec.DecodeError:
            events = None
        if not events or len(events) != 1 or type(events[0]) is not RunEnd:
            self._corrupt(f"frame {self._num_forgotten + len(self._frames)} holds a RunEnd that is not a whole "
                          f"end frame", offset)
        else:
            self.run_end = events[0]

    def _first_event(self, stored, word: int, offset: int) -> tuple[int | None, int] | None:
        """The step of the frame's first event, from its leading payload bytes
        (the previous frame's step for a frame without events)."""
        try:
            if word & DEFLATED:
                leading = zlib.decompressobj(-WINDOW_BITS, DICTIONARY).decompress(stored, LEADING_BYTES)
            else:
                leading = stored[:LEADING_BYTES]
            found = leading_event(leading)
        except zlib.error as exc:
            self._corrupt(f"frame {self._num_forgotten + len(self._frames)} does not inflate ({exc})", offset)
            return None
        except (ValueError, IndexError) as exc:
            self._corrupt(f"frame {self._num_forgotten + len(self._frames)} does not decode ({exc})", offset)
            return None
        return (None, self._frames[-1].step) if found is None else found

    def _corrupt(self, message: str, offset: int) -> None:
        last_step = self._frames[-1].step if len(self._frames) > 1 else None
        self.corruption = TraceCorruptError(f"{self.path}: {message}", offset, last_step)

    def describe_torn_tail(self) -> str | None:
        """The one message for a torn tail (every command and the TUI print it), or None."""
        torn = self.torn_tail
        if torn is None:
            return None
        after = f" (after step {self._frames[-1].step})" if len(self._frames) > 1 else ""
        return f"torn last frame: {torn.nbytes} bytes at offset {torn.offset}{after} not read"

    def frames(self) -> list[FrameInfo]:
        """The index of complete, intact frames; frame 0 is the header frame."""
        return list(self._frames)

    def read_frame(self, i: int) -> list[AnyEvent]:
        frame = self._frames[i]
        data = os.pread(self._fd, self._head.size + frame.nbytes, frame.offset)
        return self._decode_frame(i, data, 0)

    def read_step(self, step: int) -> list[AnyEvent]:
        """A step's events: from its first frame (from format 8, a between-steps frame may come
        before the step's own: frames.py) to the one that ends with its StepEnd, or as far as
        the index goes. Empty for a step not in the index."""
        events: list[AnyEvent] = []
        for i in range(self.step_frame(step), len(self._frames)):
            events += self.read_frame(i)
            if events and type(events[-1]) is StepEnd:
                break
        return events

    def _decode_frame(self, i: int, data: bytes, pos: int) -> list[AnyEvent]:
        """Frame i's events from `data`, which holds the frame at `pos`."""
        word, stored = self._stored(i, data, pos)
        try:
            return self._decoder.decode(self._inflate(stored, i) if word & DEFLATED else stored)
        except msgspec.DecodeError as exc:
            raise self._damaged(i, f"does not decode ({exc})") from None

    def _stored(self, i: int, data: bytes, pos: int) -> tuple[int, bytes]:
        """(length word, stored payload) of frame i from `data`, which holds the frame at `pos`."""
        frame = self._frames[i]
        end = pos + self._head.size + frame.nbytes
        if len(data) < end:
            raise TraceCorruptError(f"{self.path}: frame {i} changed since it was indexed", frame.offset, frame.step)
        word, checksum, *_ = self._head.unpack_from(data, pos)
        stored = data[pos + self._head.size:end]
        if word & LENGTH_MASK != frame.nbytes or xxhash.xxh64_intdigest(stored, word >> 31) != checksum:
            raise TraceCorruptError(f"{self.path}: frame {i} changed since it was indexed", frame.offset, frame.step)
        return word, stored

    def _inflate(self, stored: bytes, i: int) -> bytes:
        inflater = zlib.decompressobj(-WINDOW_BITS, DICTIONARY)   # primes as fast as a copy would
        limit = min(MAX_FRAME_BYTES, self._max_ratio * len(stored) + INFLATE_SLACK)
        try:
            payload = inflater.decompress(stored, limit)
        except zlib.error as exc:
            raise self._damaged(i, f"does not inflate ({exc})") from None
        if inflater.unconsumed_tail or (len(payload) == limit and inflater.decompress(b"", 1)):
            raise self._damaged(i, f"inflates past its limit of {limit} bytes ({self._max_ratio} per stored byte "
                                f"and {INFLATE_SLACK})")
        if not inflater.eof or inflater.unused_data:
            raise self._damaged(i, "is not one whole deflate stream")
        return payload

    def _damaged(self, i: int, what: str) -> TraceCorruptError:
        """Damage found in indexed frame i, after the step of the frame before it."""
        number = i + (self._num_forgotten if i else 0)
        return TraceCorruptError(f"{self.path}: frame {number} {what}", self._frames[i].offset,
                                 self._frames[i - 1].step if i > 1 else None)

    def events(self, start_frame: int = 0) -> Iterator[AnyEvent]:
        """Events of the indexed frames from `start_frame`; then raises the
        corruption that ended the index, if any. A torn tail is not raised."""
        for i, data, pos in self._frame_slices(start_frame):
            yield from self._decode_frame(i, data, pos)
        if self.corruption is not None:
            raise self.corruption

    def events_once(self, frames_per_slice: int = 256) -> Iterator[AnyEvent]:
        """Every event, TraceHeader first, in one pass that indexes the file a slice of frames
        at a time and forgets each slice once read (all but the header's and the last frame):
        memory bounded by a slice, however long the trace. For a one-pass reader (export)
        opened with `max_frames=1`; afterwards frames() and read_frame() no longer apply."""
        yield from self._decode_frame(0, os.pread(self._fd, self._head.size + self._frames[0].nbytes,
                                                  self._frames[0].offset), 0)
        start = len(self._frames)
        while True:
            for i, data, pos in self._frame_slices(start):
                yield from self._decode_frame(i, data, pos)
            if len(self._frames) > 2:      # the last stays: an empty frame after it takes its step
                self._num_forgotten += len(self._frames) - 2
                self._frames[1:-1] = []
            start = len(self._frames)
            if not self.refresh(frames_per_slice):
                break
        if self.corruption is not None:
            raise self.corruption

    def stored_frames(self, start_frame: int = 0) -> Iterator[tuple[int, bytes]]:
        """(length word, stored payload) of each indexed frame from `start_frame`,
        neither inflated nor decoded (compaction copies them)."""
        for i, data, pos in self._frame_slices(start_frame):
            yield self._stored(i, data, pos)

    def _frame_slices(self, start_frame: int) -> Iterator[tuple[int, bytes, int]]:
        """(i, data, pos) for each indexed frame from `start_frame`: `data` holds frame i at `pos`."""
        i = start_frame
        while i < len(self._frames):
            # one read for the frames in the next SCAN_BYTES (at least one frame)
            frames = self._frames
            first = frames[i]
            last = i + 1
            limit = first.offset + SCAN_BYTES
            head_size = self._head.size
            while last < len(frames) and frames[last].offset + head_size + frames[last].nbytes <= limit:
                last += 1
            end = frames[last - 1].offset + head_size + frames[last - 1].nbytes
            data = os.pread(self._fd, end - first.offset, first.offset)
            for j in range(i, last):
                yield j, data, frames[j].offset - first.offset
            i = last

    def step_frame(self, step: int) -> int:
        """Index of the first frame at `step` or later (len(frames()) if none)."""
        return bisect.bisect_left(self._frames, step, lo=1, key=lambda f: f.step)

    @property
    def num_frames(self) -> int:
        return len(self._frames)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "TraceReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_trace(path, follow: bool = False, poll_interval: float = 0.1,
               stop: Callable[[], bool] | None = None) -> Iterator[AnyEvent]:
    """Typed events of a trace, TraceHeader first. With `follow`, keeps
    yielding events as complete frames are appended (a torn last frame is one
    still being written) until the end frame or until `stop()` returns true."""
    with TraceReader(path) as reader:
        yield from reader.events()
        next_frame = reader.num_frames
        while follow and not reader.ended:
            stopping = stop is not None and stop()
            if not stopping:
                time.sleep(poll_interval)
            reader.refresh()
            yield from reader.events(next_frame)
            next_frame = reader.num_frames
            if stopping:
                return
