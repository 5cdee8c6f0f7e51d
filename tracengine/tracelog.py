"""The trace file: the only module that knows frames.

    preamble  b"TRCE" + uint16 format version + 2 reserved bytes
    frame     uint32 payload length + uint64 xxh64 of the payload (little-endian),
              then the payload: a msgpack array of events

The first frame holds only the TraceHeader; each later frame holds one engine
step's events and is written, and flushed, when that step's StepEnd arrives, so
a killed process leaves every finished step readable. Decoding is typed msgspec
only. A reader reports what it cannot read (a torn last frame, a checksum
mismatch) and still gives every complete frame before it."""
import bisect
import os
import struct
import time
from typing import Callable, Iterator, NamedTuple

import msgspec
import xxhash

from tracengine import __version__
from tracengine.errors import TraceCorruptError, TraceError, TraceVersionError
from tracengine.events import AnyEvent, Event, ModelInfo, StepEnd, TraceHeader

FORMAT_VERSION = 1
MAGIC = b"TRCE"
PREAMBLE = struct.Struct("<4sH2x")
FRAME_HEAD = struct.Struct("<IQ")      # payload length, xxh64 of the payload
MAX_FRAME_BYTES = 64 << 20             # a longer frame is damage, not something to allocate


class FrameInfo(NamedTuple):
    offset: int   # of the frame head in the file
    step: int     # step of the frame's first event; -1 for the header frame
    nbytes: int   # payload bytes


class TornTail(NamedTuple):
    offset: int   # where the incomplete last frame starts
    nbytes: int   # bytes of it present in the file


class _FirstStep(msgspec.Struct, array_like=True):
    """The leading tag and step of an array-like event; later fields are ignored."""
    tag: int
    step: int


def make_header(config, model: ModelInfo | None = None, device: str = "cpu", torch_version: str = "",
                seed: int | None = None) -> TraceHeader:
    """A header of this format version for `config` (any object with `to_dict()` and `seed`)."""
    return TraceHeader(FORMAT_VERSION, __version__, config.to_dict(),
                       model if model is not None else ModelInfo("synthetic", "none", "none"),
                       device, torch_version, config.seed if seed is None else seed, time.time())


class TraceWriter:
    """An event sink that writes one frame per step, at its StepEnd."""
    enabled = True

    def __init__(self, path, header: TraceHeader):
        self.step = 0
        self.header = header
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer = bytearray()
        self._pending: list[Event] = []
        self._file = open(path, "wb")
        self._file.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION))
        self._write_frame([header])

    def emit(self, event: Event) -> None:
        self._pending.append(event)
        if type(event) is StepEnd:
            self._write_frame(self._pending)
            self._pending.clear()

    def _write_frame(self, events: list[Event]) -> None:
        buffer = self._buffer
        self._encoder.encode_into(events, buffer, FRAME_HEAD.size)
        nbytes = len(buffer) - FRAME_HEAD.size
        if nbytes > MAX_FRAME_BYTES:
            raise TraceError(f"a frame of {nbytes} bytes exceeds the limit of {MAX_FRAME_BYTES}")
        with memoryview(buffer) as view:
            checksum = xxhash.xxh64_intdigest(view[FRAME_HEAD.size:])
        FRAME_HEAD.pack_into(buffer, 0, nbytes, checksum)
        self._file.write(buffer)
        self._file.flush()

    def close(self) -> None:
        """Writes events of an unfinished step as a last frame, then closes."""
        if self._file.closed:
            return
        if self._pending:
            self._write_frame(self._pending)
            self._pending.clear()
        self._file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TraceReader:
    """Random access to a trace's frames. The index (offset, first step, bytes
    of each frame) is built by one scan that checks every checksum; events are
    decoded only when a frame is read. `refresh()` picks up appended frames.

    What could not be read is reported, not raised: `torn_tail` for an
    incomplete last frame, `corruption` (a TraceCorruptError) for a frame that
    fails its checksum; frames after a corrupt one are not indexed."""

    def __init__(self, path, max_frames: int | None = None):
        self.path = os.fspath(path)
        self._decoder = msgspec.msgpack.Decoder(list[AnyEvent])
        self._raw_decoder = msgspec.msgpack.Decoder(list[msgspec.Raw])
        self._step_decoder = msgspec.msgpack.Decoder(_FirstStep)
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            self._read_preamble()
            self._frames: list[FrameInfo] = []
            self._end = PREAMBLE.size
            self.torn_tail: TornTail | None = None
            self.corruption: TraceCorruptError | None = None
            self.refresh(max_frames)
            self.header = self._read_header()
        except BaseException:
            os.close(self._fd)
            raise

    def _read_preamble(self) -> None:
        data = os.pread(self._fd, PREAMBLE.size, 0)
        if len(data) < PREAMBLE.size or data[:4] != MAGIC:
            raise TraceError(f"{self.path}: not a tracengine trace (it does not start with {MAGIC!r})")
        version = PREAMBLE.unpack(data)[1]
        if version != FORMAT_VERSION:
            raise TraceVersionError(f"{self.path}: trace format version {version}, "
                                    f"this tracengine reads version {FORMAT_VERSION}")

    def _read_header(self) -> TraceHeader:
        if not self._frames:
            if self.corruption is not None:
                raise self.corruption
            raise TraceError(f"{self.path}: no complete header frame")
        events = self.read_frame(0)
        if len(events) != 1 or type(events[0]) is not TraceHeader:
            raise TraceCorruptError(f"{self.path}: the first frame holds no TraceHeader", PREAMBLE.size)
        return events[0]

    def refresh(self, max_frames: int | None = None) -> int:
        """Indexes frames appended since the last scan, at most `max_frames` of
        them (so a large trace can be indexed in slices); returns how many."""
        num_before = len(self._frames)
        file_size = os.fstat(self._fd).st_size
        while self.corruption is None:
            if max_frames is not None and len(self._frames) - num_before >= max_frames:
                self.torn_tail = None     # the end is not reached yet
                return len(self._frames) - num_before
            offset = self._end
            if file_size - offset < FRAME_HEAD.size:
                break
            nbytes, checksum = FRAME_HEAD.unpack(os.pread(self._fd, FRAME_HEAD.size, offset))
            if nbytes > MAX_FRAME_BYTES:
                self._corrupt(f"frame {len(self._frames)} claims {nbytes} bytes, over the limit of {MAX_FRAME_BYTES}",
                              offset)
                break
            if file_size - offset - FRAME_HEAD.size < nbytes:
                break
            payload = os.pread(self._fd, nbytes, offset + FRAME_HEAD.size)
            if xxhash.xxh64_intdigest(payload) != checksum:
                self._corrupt(f"frame {len(self._frames)} fails its checksum", offset)
                break
            step = self._first_step(payload, offset) if self._frames else -1
            if step is None:
                break
            self._frames.append(FrameInfo(offset, step, nbytes))
            self._end = offset + FRAME_HEAD.size + nbytes
        tail = file_size - self._end
        self.torn_tail = TornTail(self._end, tail) if tail and self.corruption is None else None
        return len(self._frames) - num_before

    def _first_step(self, payload: bytes, offset: int) -> int | None:
        try:
            raws = self._raw_decoder.decode(payload)
            return self._step_decoder.decode(raws[0]).step if raws else self._frames[-1].step
        except msgspec.DecodeError as exc:
            self._corrupt(f"frame {len(self._frames)} does not decode ({exc})", offset)
            return None

    def _corrupt(self, message: str, offset: int) -> None:
        last_step = self._frames[-1].step if len(self._frames) > 1 else None
        self.corruption = TraceCorruptError(f"{self.path}: {message}", offset, last_step)

    def frames(self) -> list[FrameInfo]:
        """The index of complete, intact frames; frame 0 is the header frame."""
        return list(self._frames)

    def read_frame(self, i: int) -> list[AnyEvent]:
        frame = self._frames[i]
        data = os.pread(self._fd, FRAME_HEAD.size + frame.nbytes, frame.offset)
        payload = data[FRAME_HEAD.size:]
        nbytes, checksum = FRAME_HEAD.unpack_from(data)
        if len(payload) != frame.nbytes or nbytes != frame.nbytes or xxhash.xxh64_intdigest(payload) != checksum:
            raise TraceCorruptError(f"{self.path}: frame {i} changed since it was indexed", frame.offset, frame.step)
        try:
            return self._decoder.decode(payload)
        except msgspec.DecodeError as exc:
            raise TraceCorruptError(f"{self.path}: frame {i} does not decode ({exc})", frame.offset,
                                    self._frames[i - 1].step if i > 1 else None) from None

    def events(self, start_frame: int = 0) -> Iterator[AnyEvent]:
        """Events of the indexed frames from `start_frame`; then raises the
        corruption that ended the index, if any. A torn tail is not raised."""
        i = start_frame
        while i < len(self._frames):
            yield from self.read_frame(i)
            i += 1
        if self.corruption is not None:
            raise self.corruption

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
    still being written) until `stop()` returns true."""
    with TraceReader(path) as reader:
        yield from reader.events()
        next_frame = reader.num_frames
        while follow:
            stopping = stop is not None and stop()
            if not stopping:
                time.sleep(poll_interval)
            reader.refresh()
            yield from reader.events(next_frame)
            next_frame = reader.num_frames
            if stopping:
                return
