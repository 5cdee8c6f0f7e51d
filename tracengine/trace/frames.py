"""The trace file's bytes: the format, its frames and their heads (writer.py writes them,
reader.py reads them; nothing else knows frames).

Format version 10: this layout, the events of events.py (block id lists as runs where
that makes them shorter: block_runs.py), and the dictionary of dictionary.py. Version 9 had no
RequestAdded session fields (a turn's session, turn, dependencies and think time); version 8 wrote
every block id list id by id; version 7 had no between-steps frame but a trace's last (below); version 6
had no PromptBlocksHashed (a hash-id prompt's blocks were a
BlockHash each); version 5 no RunEnd in the end frame; version 4 had the events
without the fields version 5 appended
(the header's engine, what vLLM's scheduler records: tracengine/vllm/); version 3
had neither RequestAdded's hash-id prompt fields nor a fleet's events
(ReplicaScope, RouteDecision, KVTransfer and the header's fleet); versions 1 and 2
also had a frame head without its own check (12 bytes); version 1 had the events
without the fields appended since. All read, with those fields' defaults.

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
flat map of scalars; block id runs of bounded length, block_runs.py) keep the memory a
frame takes proportional to its size in the file: any file is read or refused in memory proportional to the file.

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
readable. Events that come between steps (requests added, requests aborted:
BETWEEN_STEPS) are written with the step they precede, except where the writer
is flushed first (`TraceWriter.flush`: a server whose abort leaves the engine
idle, with no step to come): then they are a between-steps frame of their own,
written at once, and that step's frame follows with the rest of its events
(format 8). A step's events are so one or more frames of that step, the last
ending with its StepEnd; a reader that wants a step reads them all
(`TraceReader.read_step`), a reader of the stream sees the same events in the
same order either way. Closing the writer appends the end frame, an empty array (stored,
one byte of payload): a reader following the file knows the recording is
over, and a trace without it is still being written or was left by a killed
writer. A run that failed or was interrupted ends instead with an end frame
holding one RunEnd event (why, and its last finished step), stored too: the
trace is closed and replays to that step, and `check` tells it from a run that
finished (format 6). Then the closed trace is compacted: its deflated copy is written
beside it (PATH.compacting.tmp), synced, and renamed over it, so the path
always names a whole trace (the stored one until the rename), and a reader
that has the old file open reads it to its end frame. A compaction killed
leaves the stored trace (and its copy, removed by the next writer of the path).

A writer given the path of an existing regular file writes beside it
(PATH.recording.tmp) and renames its trace over the old one when the first
step's frame (or a flushed between-steps frame) is on the file (or, for a run
of no step, when it closes whole):
a run that fails before its first step leaves the old file as it was.

Events are decoded by one typed msgspec Decoder only. The frame index alone
reads a frame's first step by hand from its leading bytes (`leading_event`: an
array header, an event's header, its tag and step, as msgpack ints), so
indexing a trace decodes no event; a frame it misreads still fails its typed
decode when read. A reader reports what it cannot read (a torn last frame, a
checksum mismatch, a payload that does not inflate) and still gives every
complete frame before it."""
import struct
import zlib
from typing import NamedTuple

import msgspec
import xxhash

from tracengine.trace.dictionary import DICTIONARY
from tracengine.trace.events import BlockFree, RequestAdded, RunEnd, SeqAbort, StepEnd

FORMAT_VERSION = 13
# 2 appended arrival_ns, top_k, top_p, seed to RequestAdded and gap_ns to StepEnd; 3 checks each frame head;
# 4 adds RequestAdded's hash-id prompt fields, a fleet's events (ReplicaScope, RouteDecision, KVTransfer)
# and TraceHeader.fleet (docs/cluster.md); 5 appends the engine and what vLLM's scheduler records;
# 6 ends a failed or interrupted run's trace with a RunEnd in its end frame; 7 records a hash-id
# prompt's full blocks as one PromptBlocksHashed, whose hashes a reader recomputes, not a BlockHash each
# 8 writes a between-steps frame before its step's frame where the writer is flushed; 9 writes block id
# lists as runs (block_runs.py: new tags for the wire forms of the events that hold them); 10 appends
# RequestAdded's session fields (workload/sessions.py); 11 appends TraceHeader.not_recorded, a vLLM trace's
# speculative decoding events (SpecDraft, SpecDecode, SpecAccepted) and LoRA fields, speculative
# decoding's DraftProposed and DraftVerified in tracengine's engine (engine/spec_decode.py), and the CPU
# tier's events (CpuStore with its evictions, CpuLoad, CpuHit: engine/cpu_tier.py); 12 adds a vLLM KV connector's
# answers and transfers (KVConnector*, KVTransfersDone) and structured output's grammars (Grammar*);
# 13 appends the KV cache group to block events and adds BlockSkip (a vLLM hybrid model's groups), and
# SGLang's schedule policy order and prefill adder stop (PolicyOrder, PrefillStop: sglang_events.py)
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)
RUN_END_SINCE = 6                      # the first version whose end frame may hold a RunEnd
BETWEEN_STEPS_FRAMES_SINCE = 8         # the first version whose between-steps frames may come before their step's
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
LEADING_BYTES = 32                    # enough payload to hold the first event's tag and step
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
RUN_END_TAG = RunEnd.__struct_config__.tag


def end_frame(run_end: RunEnd | None = None) -> bytes:
    """The end frame, stored: empty for a run that finished, else holding its RunEnd."""
    return END_FRAME if run_end is None else frame_bytes(msgspec.msgpack.encode([run_end]))
END_FRAME_V2 = FRAME_HEAD_V2.pack(len(END_PAYLOAD), xxhash.xxh64_intdigest(END_PAYLOAD, 0)) + END_PAYLOAD
# Between steps (before a step's first scheduling event) come only these: requests that
# arrive and requests taken out (SeqAbort and the BlockFree of its blocks).
BETWEEN_STEPS = frozenset({RequestAdded, SeqAbort, BlockFree})


def ends_mid_step(events: list, version: int) -> bool:
    """Whether a frame of `events`, in a trace of format `version`, ends in the middle of a step,
    so that no frame may follow it: a frame without its StepEnd, but, from format 8, one of
    events between steps only (a between-steps frame, before its step's frame)."""
    return type(events[-1]) is not StepEnd and not (
        version >= BETWEEN_STEPS_FRAMES_SINCE and all(type(e) in BETWEEN_STEPS for e in events))


class FrameInfo(NamedTuple):
    offset: int   # of the frame head in the file
    step: int     # step of the frame's first event; -1 for the header frame
    nbytes: int   # stored payload bytes (deflated or not)


class TornTail(NamedTuple):
    offset: int   # where the incomplete last frame starts
    nbytes: int   # bytes of it present in the file


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
    # the fastest level: deflate runs over every frame at close, and the bytes it saves over
    # a slower level are few (BENCHMARKS.md, recording overhead); inflate reads any level
    return zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -WINDOW_BITS, 5, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)


def leading_event(data) -> tuple[int, int] | None:
    """(tag, step) of the first event of a msgpack array of array-like events,
    from its leading bytes: [array header][event header][tag][step]. None for
    an empty array."""
    if len(data) >= 5 and 0x91 <= data[0] <= 0x9F and 0x92 <= data[1] <= 0x9F and data[2] <= 0x7F:
        b = data[3]    # the common case: a short array of short events, a small tag
        if b <= 0x7F:
            return data[2], b
        if b == 0xCC:
            return data[2], data[4]
    num_events, pos = _array_header(data, 0)
    if num_events == 0:
        return None
    num_fields, pos = _array_header(data, pos)
    if num_fields < 2:
        raise ValueError("an event without a step")
    tag, pos = _int(data, pos)
    return tag, _int(data, pos)[0]


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
