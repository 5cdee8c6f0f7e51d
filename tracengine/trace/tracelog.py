"""The trace file: the only module that knows frames.

Format version 4: this layout, the events of events.py, and the dictionary of
dictionary.py. Version 3 had the same layout without the fields version 4
appended to the events (the engine, what vLLM's scheduler records). Versions 1 and 2 had a frame head without its own check (12
bytes); version 1 had the events without the fields appended since. Both
read, with those fields' defaults.

    preamble  b"TRCE" + uint16 format version + 2 reserved bytes (zero)
    frame     uint32 length word + uint64 checksum + uint32 head check (little-endian),
              then the stored payload
      length word  bits 0-30: bytes of the stored payload (at most MAX_FRAME_BYTES);
                   bit 31 (DEFLATED): the payload is deflated
      checksum     xxh64 of the stored payload, seeded with 1 when it is deflated and
                   0 when not (so the flag is covered too): damage is found before
                   anything is inflated or decoded
      head check   xxh32 of the 12 bytes before it: a damaged length is found before
                   it is believed, so a torn tail is only ever where the file really
                   ends inside its last frame, never a length that points past the end
      payload      a msgpack array of events; deflated, it is raw deflate (RFC 1951,
                   window of 2**13 bytes) primed with trace_dictionary.DICTIONARY,
                   and inflates to at most MAX_INFLATE_RATIO times its stored bytes
                   plus INFLATE_SLACK (and at most MAX_FRAME_BYTES); the writer
                   stores a payload that would deflate more than that

Bounds on hostile files: a frame's stored bytes, what they may inflate to and
the typed events they decode to (flat lists of scalars; the header's config a
flat map of scalars) keep the memory a frame takes proportional to its size in
the file: any file is read or refused in memory proportional to the file.

The writer stores each frame as it is written and deflates them all when it
closes (compaction): the step pays only for encode, checksum and one write
(BENCHMARKS.md, recording overhead), and deflate runs warm, in one loop, off
the request path. Each frame stays decodable on its own (random access, follow
mode, a torn tail loses one frame). A frame is deflated when that makes it
smaller, with a copy of one primed compressor (priming it anew would cost more
than deflating the frame). A trace whose frames are all stored (a killed
writer's, `simulate --record`'s, traces written before deflate was added) is a
valid trace too, about 1.4x larger (BENCHMARKS.md, trace size).

The first frame holds only the TraceHeader; each later frame holds one engine
step's events and is written (one write on an unbuffered file) when that
step's StepEnd arrives, so a killed process leaves every finished step
readable. Closing the writer appends the end frame, an empty array (stored,
one byte of payload): a reader following the file knows the recording is
over, and a trace without it is still being written or was left by a killed
writer. Then the closed trace is compacted: its deflated copy is written
beside it (PATH.compacting.tmp), synced, and renamed over it, so the path
always names a whole trace (the stored one until the rename), and a reader
that has the old file open reads it to its end frame. A compaction killed
leaves the stored trace (and its copy, removed by the next writer of the path).

Events are decoded by one typed msgspec Decoder only. The frame index alone
reads a frame's first step by hand from its leading bytes (`_leading_step`: an
array header, an event's header, its tag and step, as msgpack ints), so
indexing a trace decodes no event; a frame it misreads still fails its typed
decode when read. A reader reports what it cannot read (a torn last frame, a
checksum mismatch, a payload that does not inflate) and still gives every
complete frame before it."""
import bisect
import os
import stat
import struct
import sys
import time
import zlib
from typing import Callable, Iterator, NamedTuple

import msgspec
import xxhash

from tracengine import __version__
from tracengine.errors import TraceCorruptError, TraceError, TraceVersionError
from tracengine.trace.encoded import EncodedTokens
from tracengine.trace.events import AnyEvent, Event, ModelInfo, RequestAdded, StepEnd, TraceHeader
from tracengine.trace.dictionary import DICTIONARY

FORMAT_VERSION = 4
# 2 appended arrival_ns, top_k, top_p, seed to RequestAdded and gap_ns to StepEnd; 3 checks each frame head;
# 4 appended the engine to TraceHeader and what vLLM's scheduler records (events.py)
READABLE_VERSIONS = (1, 2, 3, 4)
MAGIC = b"TRCE"
PREAMBLE = struct.Struct("<4sH2x")     # magic, format version, 2 reserved bytes (0)
FRAME_HEAD = struct.Struct("<IQI")     # length word, xxh64 of the stored payload (seed: the flag), head check
FRAME_HEAD_V2 = struct.Struct("<IQ")   # versions 1 and 2: no head check
HEAD_CHECK = struct.Struct("<I")       # v3: xxh32 of the FRAME_HEAD_V2 bytes before it
DEFLATED = 1 << 31                     # length word flag: the payload is deflated
LENGTH_MASK = DEFLATED - 1
MAX_FRAME_BYTES = 64 << 20             # a longer frame is damage, not something to allocate
FRAME_BUFFER_BYTES = 1 << 20           # a writer's frame buffer is kept up to this size
MAX_INFLATE_RATIO = 32                 # inflated bytes per stored byte that a v3 writer writes, and a reader takes
MAX_INFLATE_RATIO_V2 = 256             # v1/v2 writers had no bound: a looser one for their (real) frames
INFLATE_SLACK = 64 << 10               # any frame may inflate to this much
WINDOW_BITS = 13                       # deflate window of 8 KiB; the dictionary fills it
DEFLATE_LEVEL = 1                      # the writer's; readers do not depend on it
MIN_DEFLATE_BYTES = 32                 # smaller payloads are stored as they are
SCAN_BYTES = 1 << 20                   # the index scan and events() read this much at a time
_LEADING_BYTES = 32                    # enough payload to hold the first event's tag and step
END_PAYLOAD = msgspec.msgpack.encode([])   # the end frame's payload: no events


def frame_head(word: int, checksum: int) -> bytes:
    """A v3 frame head: the length word, the payload's checksum, and the head check over both."""
    head = FRAME_HEAD_V2.pack(word, checksum)
    return head + HEAD_CHECK.pack(xxhash.xxh32_intdigest(head))


def pack_head(buffer, word: int, checksum: int) -> None:
    """Writes a v3 frame head at the start of `buffer` (a bytearray or a writable memoryview)."""
    buffer[:FRAME_HEAD.size] = frame_head(word, checksum)


def frame_bytes(payload: bytes, deflated: bool = False) -> bytes:
    """A whole v3 frame around a stored payload."""
    return stored_frame_head(payload, deflated) + payload


def stored_frame_head(payload: bytes, deflated: bool = False) -> bytes:
    """The v3 frame head of a stored payload: frame_bytes without the payload copied after it."""
    return frame_head(len(payload) | (DEFLATED if deflated else 0), xxhash.xxh64_intdigest(payload, int(deflated)))


END_FRAME = frame_bytes(END_PAYLOAD)   # stored
END_FRAME_V2 = FRAME_HEAD_V2.pack(len(END_PAYLOAD), xxhash.xxh64_intdigest(END_PAYLOAD, 0)) + END_PAYLOAD
# Between steps (before a step's first scheduling event) come only these: requests that
# arrive and requests taken out (SeqAbort and the BlockFree of its blocks).
_BETWEEN_STEPS = frozenset({"RequestAdded", "SeqAbort", "BlockFree"})


class FrameInfo(NamedTuple):
    offset: int   # of the frame head in the file
    step: int     # step of the frame's first event; -1 for the header frame
    nbytes: int   # stored payload bytes (deflated or not)


class TornTail(NamedTuple):
    offset: int   # where the incomplete last frame starts
    nbytes: int   # bytes of it present in the file


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


def deflate_frame(deflater, payload: bytes) -> tuple[int, bytes]:
    """(length word, stored bytes) of a frame's payload: deflated with a copy of
    `deflater` (primed: `primed_deflater()`) when that makes it smaller, as it is
    when not, or when it would inflate past what a reader takes."""
    nbytes = len(payload)
    if nbytes >= MIN_DEFLATE_BYTES:
        deflater = deflater.copy()
        deflated = deflater.compress(payload) + deflater.flush()
        if len(deflated) < nbytes and nbytes <= MAX_INFLATE_RATIO * len(deflated) + INFLATE_SLACK:
            return len(deflated) | DEFLATED, deflated
    return nbytes, payload


def primed_deflater():
    # Level 1: 17-27% less time per frame than 6 for 1-3% more bytes (BENCHMARKS.md, recording
    # overhead); inflate reads any level.
    return zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -WINDOW_BITS, 5, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)


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
                out.write(END_FRAME)
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
    disk) leaves the stored trace, whole, and says so on stderr."""
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
        # unbuffered: each frame is on the file (in the kernel: a killed process keeps it) when
        # its write returns, with no flush to call
        self._file = open(path, "wb", buffering=0)
        self._fd = self._file.fileno()
        st = os.fstat(self._fd)
        # a device or a pipe (--record /dev/null) is written, never replaced
        self._compact = deflate and stat.S_ISREG(st.st_mode)
        self._identity = (st.st_dev, st.st_ino)
        if self._compact:
            _remove_stale(compaction_temp(os.path.realpath(path)))   # a killed compaction's
        self._write(PREAMBLE.pack(MAGIC, FORMAT_VERSION))
        self._write_frame([header])

    def emit(self, event: Event) -> None:
        self._pending.append(event)
        if type(event) is StepEnd:
            # Marked written before the write: an interrupt anywhere in it loses this step, or
            # nothing, but never writes it twice (see close).
            self._last_step_written = event.step
            self._write_frame(self._pending)
            self._pending = []

    def _write_frame(self, events: list[Event]) -> None:
        # Inside the step loop, after a forward pass has evicted the caches: every call and
        # allocation here is paid cold, so the frame is encoded into the writer's one buffer,
        # stored (deflate waits for close), and goes to the file in one write call on an
        # unbuffered file.
        for i, event in enumerate(events):   # the requests a step adds come first in its frame
            if type(event) is not RequestAdded:
                break
            if type(event.prompt_token_ids) is EncodedTokens:     # the same bytes, copied
                events[i] = msgspec.structs.replace(event, prompt_token_ids=msgspec.Raw(event.prompt_token_ids.msgpack()))
        payload = self._payload
        try:
            self._encoder.encode_into(events, payload)
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
            begun = next((i for i, e in enumerate(pending) if type(e).__name__ not in _BETWEEN_STEPS), len(pending))
            pending = pending[:begun]
        if pending:
            self._write_frame(pending)
        self._pending = []
        self._write(END_FRAME)
        self._file.close()
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

    def __exit__(self, *exc) -> None:
        self.close()


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
                self._corrupt(f"frame {len(self._frames)}'s head (length and checksum) fails its check", offset)
                break
            nbytes = word & LENGTH_MASK
            if nbytes > MAX_FRAME_BYTES:
                self._corrupt(f"frame {len(self._frames)} claims {nbytes} bytes, over the limit of {MAX_FRAME_BYTES}",
                              offset)
                break
            end = offset + head.size + nbytes
            if end > file_size:
                # Without a head check (v1, v2) a damaged length looks like a torn tail;
                # a file that goes on to an end frame was not torn.
                if not head_check and self._ends_with_end_frame(file_size):
                    self._corrupt(f"frame {len(self._frames)} claims {nbytes} bytes, past the end of a file "
                                  f"that ends with an end frame: a damaged length", offset)
                break
            if end > base + len(data):
                data, base = os.pread(self._fd, min(max(SCAN_BYTES, end - offset), file_size - offset), offset), offset
            stored = data[offset - base + head.size:end - base]
            if xxhash.xxh64_intdigest(stored, word >> 31) != checksum:
                self._corrupt(f"frame {len(self._frames)} fails its checksum", offset)
                break
            if stored == END_PAYLOAD and not word & DEFLATED and self._frames:
                self.ended, self._end = True, end
                if file_size > end:
                    self._corrupt(f"{file_size - end} bytes follow the end frame", end)
                break
            step = self._first_step(stored, word, offset) if self._frames else -1
            if step is None:
                break
            self._frames.append(FrameInfo(offset, step, nbytes))
            self._end = end
        tail = file_size - self._end
        self.torn_tail = TornTail(self._end, tail) if tail and self.corruption is None else None
        return len(self._frames) - num_before

    def _ends_with_end_frame(self, file_size: int) -> bool:
        tail = os.pread(self._fd, len(END_FRAME_V2), file_size - len(END_FRAME_V2))
        return tail == END_FRAME_V2

    def _first_step(self, stored, word: int, offset: int) -> int | None:
        """The step of the frame's first event, from its leading payload bytes
        (the previous frame's step for a frame without events)."""
        try:
            if word & DEFLATED:
                leading = zlib.decompressobj(-WINDOW_BITS, DICTIONARY).decompress(stored, _LEADING_BYTES)
            else:
                leading = stored[:_LEADING_BYTES]
            step = _leading_step(leading)
        except zlib.error as exc:
            self._corrupt(f"frame {len(self._frames)} does not inflate ({exc})", offset)
            return None
        except (ValueError, IndexError) as exc:
            self._corrupt(f"frame {len(self._frames)} does not decode ({exc})", offset)
            return None
        return self._frames[-1].step if step is None else step

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
        return TraceCorruptError(f"{self.path}: frame {i} {what}", self._frames[i].offset,
                                 self._frames[i - 1].step if i > 1 else None)

    def events(self, start_frame: int = 0) -> Iterator[AnyEvent]:
        """Events of the indexed frames from `start_frame`; then raises the
        corruption that ended the index, if any. A torn tail is not raised."""
        for i, data, pos in self._frame_slices(start_frame):
            yield from self._decode_frame(i, data, pos)
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


def _leading_step(data) -> int | None:
    """The step of the first event of a msgpack array of array-like events,
    from its leading bytes: [array header][event header][tag][step]. None for
    an empty array."""
    if len(data) >= 5 and 0x91 <= data[0] <= 0x9F and 0x92 <= data[1] <= 0x9F and data[2] <= 0x7F:
        b = data[3]    # the common case: a short array of short events, a small tag
        if b <= 0x7F:
            return b
        if b == 0xCC:
            return data[4]
    num_events, pos = _array_header(data, 0)
    if num_events == 0:
        return None
    num_fields, pos = _array_header(data, pos)
    if num_fields < 2:
        raise ValueError("an event without a step")
    pos = _int(data, pos)[1]               # the tag
    return _int(data, pos)[0]


def _array_header(data, pos: int) -> tuple[int, int]:
    """(element count, position after the header)."""
    b = data[pos]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F, pos + 1
    width = {0xDC: 2, 0xDD: 4}.get(b)
    if width is None:
        raise ValueError(f"expected a msgpack array, found byte {b:#04x}")
    if pos + 1 + width > len(data):
        raise ValueError("too short")
    return int.from_bytes(data[pos + 1:pos + 1 + width], "big"), pos + 1 + width


_INT_WIDTHS = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}


def _int(data, pos: int) -> tuple[int, int]:
    """(value, position after it) of a msgpack integer."""
    b = data[pos]
    if b <= 0x7F:
        return b, pos + 1
    if b >= 0xE0:
        return b - 0x100, pos + 1
    width = _INT_WIDTHS.get(b)
    if width is None:
        raise ValueError(f"expected a msgpack integer, found byte {b:#04x}")
    if pos + 1 + width > len(data):
        raise ValueError("too short")
    return int.from_bytes(data[pos + 1:pos + 1 + width], "big", signed=b >= 0xD0), pos + 1 + width


def write_trace(path, events, **writer_options) -> str:
    """Events (the TraceHeader first) written as a whole trace file; returns the path."""
    header, rest = split_header(events)
    with TraceWriter(path, header, **writer_options) as writer:
        for event in rest:
            writer.emit(event)
    return str(path)
