"""The trace file: round trips, one frame per step, deflated and stored
frames, torn tails, corruption, versions, following a file being written, and
a writer killed mid-run."""
import collections
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import msgspec
import pytest
import xxhash

from helpers import EOS, record_every_event_type
from tracengine.errors import TraceCorruptError, TraceError, TraceVersionError
from tracengine.trace.events import (CPU_TIER_EVENT_TYPES, EVENT_TYPES, FLEET_EVENT_TYPES, HASH_ID_EVENT_TYPES,
                               SPEC_EVENT_TYPES, VLLM_EVENT_TYPES, BlockAllocate, BlockAppend, BlockFree, BlockHash,
                               CpuHit, CpuLoad, CpuStore, DraftProposed, DraftVerified, ModelInfo,
                               Preempt, PromptBlocksHashed, RequestAdded, ScheduledSeq, ScheduleDecision, SeqAbort,
                               SeqFinish, SpecAccepted, SpecDecode, SpecDraft, StepEnd,
                               TokenSample, TraceHeader, ReplicaScope, RouteDecision, KVTransfer, RunEnd)
from tracengine.engine.llm_engine import LLMEngine
from tracengine.trace.vllm_events import (ALL_EVENT_TYPES, BlockSkip, GrammarRequested, GrammarState, ConnectorAllocated,
                                          ConnectorFinished, ConnectorMatched, ConnectorPending,
                                          KVTransfersDone)
from tracengine.replay.reexec import reexecute
from tracengine.trace.sglang_events import PolicyOrder, PrefillStop
from tracengine.sim.runners import SyntheticRunner
from tracengine.testing import every_event_type_config
from tracengine.engine.sampling_params import SamplingParams
from tracengine.trace import reader as trace_reader, writer as trace_writer
from tracengine.trace.dictionary import DICTIONARY, DICTIONARY_XXH64
from tracengine.trace.tracelog import END_FRAME, FORMAT_VERSION, TraceReader, TraceWriter, make_header, open_trace
from tracengine.trace.frames import pack_head, DEFLATED, END_PAYLOAD, FRAME_HEAD, PREAMBLE, WINDOW_BITS, frame_bytes

REPO = Path(__file__).resolve().parents[1]


def small_config():
    return every_event_type_config()


def record(path) -> tuple[TraceHeader, list, LLMEngine]:
    """Records the workload to `path`; returns the header, the events emitted, the engine."""
    return record_every_event_type(path)


@pytest.fixture
def recorded(tmp_path):
    path = tmp_path / "run.trace"
    header, events, engine = record(path)
    return path, header, events, engine


SAMPLES = [
    TraceHeader(FORMAT_VERSION, "0.1.0", {"kvcache_block_size": 4, "model": ""}, ModelInfo("m", "float32", "Qwen3"),
                "cpu", "2.13", 7, 1.5, 2),
    RequestAdded(0, 1, [5, 6, 7], 16, 0.7, True, 2.5),
    ScheduleDecision(0, "prefill", [ScheduledSeq(1, 3, 0)], 3, "waiting_empty", -1, 0, 5, 0, 1),
    BlockAllocate(0, 1, [0, 1], 1),
    BlockAppend(3, 1, 2),
    BlockHash(0, 1, 0, 2**64 - 1),
    PromptBlocksHashed(0, 1, [3, 4], 2, 16, 2**64 - 1, [7, 8], 64),
    BlockFree(4, 1, [2, 1, 0]),
    Preempt(5, 2, 1, [4, 3], 9),
    TokenSample(0, 1, 42, False),
    SeqFinish(6, 1, "eos", 3, 4),
    SeqAbort(7, 2, "client", "running", 5, 2),
    StepEnd(0, 5, 10, 20, 30),
    ReplicaScope(3, 2),
    RouteDecision(3, 9, 2, [0, 1, 2], [4.0, 1.5, 0.5], "prefill", 1_000),
    KVTransfer(4, 9, 0, 2, 33, 33_000, 16_500, 8),
    CpuStore(2, 1, 0, [2**64 - 1, 5], [9]),
    CpuHit(3, 2, 1, [5], 1_000, 3_048),
    CpuLoad(4, 2, 1, 7),
    RunEnd(6, "failed", "boom"),    # only ever in an end frame: tests/test_run_end.py
    SpecDraft(2, 1, [7, 8, 9], 1),
    SpecDecode(3, [1, 2], [3, 0], 3),
    SpecAccepted(3, [1], [2]),
    ConnectorMatched(3, 1, 16, 32, True),
    ConnectorAllocated(3, 1, 32, [4, 5, 6]),
    ConnectorFinished(4, 1, True),
    ConnectorPending(4, True),
    KVTransfersDone(5, [1], [2], [3], [7]),
    GrammarRequested(1, 2, "regex"),
    GrammarState(3, 2, "ready"),
    BlockSkip(5, 1, [9, 8], 1),
    BlockAllocate(5, 2, [10, 11, 12], 1, 2),
    BlockFree(6, 2, [12, 11, 10], 2),
    DraftProposed(2, 1, 3, [7, 8, 9]),
    DraftVerified(3, 1, 3, 2),
    PolicyOrder(2, "lpm", "lpm", [4, 1], 3, [64, 0], [2]),
    PrefillStop(2, "no_token", "no_token", 1, False, 2, 30, 16000, 12),
]


def test_samples_cover_every_event_type():
    assert {type(e).__name__ for e in SAMPLES} == set(ALL_EVENT_TYPES)     # events.py's and vllm_events.py's


@pytest.mark.parametrize("event", [e for e in SAMPLES[1:] if type(e) is not RunEnd], ids=lambda e: type(e).__name__)
def test_every_event_type_round_trips(tmp_path, event):
    path = tmp_path / "one.trace"
    with TraceWriter(path, SAMPLES[0]) as writer:
        writer.emit(event)
        writer.emit(StepEnd(9, 1, 2, 3, 4))
    assert list(open_trace(path)) == [SAMPLES[0], event, StepEnd(9, 1, 2, 3, 4)]


def test_recorded_run_reads_back_event_for_event(recorded):
    path, header, events, engine = recorded
    assert {type(e).__name__ for e in events} == set(EVENT_TYPES) - {"TraceHeader", "SeqAbort", "RunEnd"} \
        - FLEET_EVENT_TYPES - HASH_ID_EVENT_TYPES - VLLM_EVENT_TYPES - SPEC_EVENT_TYPES \
        - CPU_TIER_EVENT_TYPES   # no server, fleet, failure, drafts or CPU tier
    assert list(open_trace(path)) == [header] + events
    with TraceReader(path) as reader:
        assert reader.header == header
        assert reader.torn_tail is None and reader.corruption is None


def test_one_frame_per_step_ending_with_its_step_end(recorded):
    path, _, _, engine = recorded
    with TraceReader(path) as reader:
        frames = reader.frames()
        assert len(frames) == 1 + engine.num_steps   # the header frame, then one per step
        assert [f.step for f in frames] == [-1] + list(range(engine.num_steps))
        assert frames[0].offset == PREAMBLE.size
        for i, frame in enumerate(frames[1:], start=1):
            events = reader.read_frame(i)
            assert {e.step for e in events} == {frame.step}
            assert type(events[-1]) is StepEnd
            assert [type(e) for e in events].count(ScheduleDecision) == 1
        # then the end frame: an empty array, stored
        end = frames[-1].offset + FRAME_HEAD.size + frames[-1].nbytes
        assert end + FRAME_HEAD.size + len(END_PAYLOAD) == os.path.getsize(path)
        assert path.read_bytes()[end + FRAME_HEAD.size:] == END_PAYLOAD == b"\x90"
        assert reader.ended


def test_end_frame_ends_following_and_bytes_after_it_are_corruption(recorded, tmp_path):
    path, header, events, _ = recorded
    assert list(open_trace(path, follow=True, stop=lambda: False)) == [header] + events   # returns: ended
    with TraceWriter(tmp_path / "open.trace", header) as writer:
        writer.emit(StepEnd(0, 1, 2, 3, 4))
        with TraceReader(tmp_path / "open.trace") as reader:
            assert not reader.ended and reader.num_frames == 2
        writer.emit(StepEnd(1, 1, 2, 3, 4))
    with TraceReader(tmp_path / "open.trace") as reader:
        assert reader.ended and reader.num_frames == 3 and reader.torn_tail is None
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"\0" * 5)
    with TraceReader(path) as reader:
        assert reader.ended and reader.corruption.offset == size
        with pytest.raises(TraceCorruptError, match=f"5 bytes follow the end frame at offset {size}"):
            list(reader.events())


def test_reading_from_a_step(recorded):
    path, _, events, _ = recorded
    with TraceReader(path) as reader:
        i = reader.step_frame(5)
        assert reader.frames()[i].step == 5
        assert list(reader.events(start_frame=i)) == [e for e in events if e.step >= 5]
        assert reader.step_frame(-3) == 1          # before the first step: the first step frame
        assert reader.step_frame(10_000) == reader.num_frames


def test_close_writes_the_events_of_an_unfinished_step(tmp_path):
    path = tmp_path / "run.trace"
    config = small_config()
    with TraceWriter(path, make_header(config)) as writer:
        engine = LLMEngine(config, SyntheticRunner(eos=EOS), writer)
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
        engine.step()
        engine.add_request([4, 5, 6], SamplingParams(max_tokens=2))   # added, never stepped
    with TraceReader(path) as reader:
        assert [f.step for f in reader.frames()] == [-1, 0, 1]
        assert [type(e) for e in reader.read_frame(2)] == [RequestAdded]


@pytest.mark.parametrize("cut", [0, 1, 15, 16, 17, -1])
def test_a_frame_written_short_is_written_whole_after(tmp_path, monkeypatch, cut):
    """A frame's head and payload go out in one gathered write; where the kernel takes only
    part of them (a full pipe, a signal), the rest follows and the trace is the same."""
    writev = os.writev

    def short_writev(fd, buffers):    # every other frame's write stops `cut` bytes in
        short_writev.calls += 1
        if short_writev.calls % 2:
            data = b"".join(buffers)
            return os.write(fd, data[:cut if cut >= 0 else len(data) - 1])
        return writev(fd, buffers)
    short_writev.calls = 0
    monkeypatch.setattr(trace_writer.os, "writev", short_writev)
    cut_path = tmp_path / "cut.trace"
    _, events, _ = record_every_event_type(cut_path, deflate=False)    # the writer's own frames, as written
    assert short_writev.calls > 4
    monkeypatch.undo()
    with TraceReader(cut_path) as reader:
        assert reader.ended and reader.corruption is None and reader.torn_tail is None
        assert [e for e in reader.events() if type(e) is not TraceHeader] == events


def test_frames_before_and_after_a_frame_longer_than_the_writers_buffer_read_back(tmp_path, monkeypatch):
    """Every frame is encoded into the writer's one buffer; a frame past FRAME_BUFFER_BYTES
    (a step that adds long prompts) is not kept, and the frames around it are written
    whole, each its own length."""
    monkeypatch.setattr(trace_writer, "FRAME_BUFFER_BYTES", 100)
    path = tmp_path / "run.trace"
    config = small_config()
    with TraceWriter(path, make_header(config), deflate=False) as writer:
        engine = LLMEngine(config, SyntheticRunner(eos=EOS), writer)
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=3))
        engine.step()
        engine.add_request(list(range(1000, 1020)), SamplingParams(max_tokens=2))     # a frame over 100 bytes
        while not engine.is_finished():
            engine.step()
        kept = sys.getsizeof(writer._payload)     # its memory, not only its length
    assert kept < 2 * 100      # the long frame's buffer was not kept
    with TraceReader(path) as reader:
        assert reader.ended and reader.corruption is None
        payloads = [f.nbytes for f in reader.frames()]
        events = list(reader.events())
    assert max(payloads) > 100 > min(payloads)
    prompts = [e.prompt_token_ids for e in events if type(e) is RequestAdded]
    assert prompts == [[1, 2, 3], list(range(1000, 1020))]
    assert sum(type(e) is StepEnd for e in events) == engine.num_steps


def frame_words(path) -> list[int]:
    """The length word of every frame: bit 31 says deflated."""
    data = Path(path).read_bytes()
    with TraceReader(path) as reader:
        return [FRAME_HEAD.unpack_from(data, f.offset)[0] for f in reader.frames()]


def test_frames_are_deflated_when_that_makes_them_smaller(recorded, tmp_path):
    path, header, events, _ = recorded
    stored = tmp_path / "stored.trace"
    with TraceWriter(stored, header, deflate=False) as writer:
        for event in events:
            writer.emit(event)
    assert not any(word & DEFLATED for word in frame_words(stored))
    assert all(word & DEFLATED for word in frame_words(path))   # every frame of this run gains
    def payload_bytes(trace):
        with TraceReader(trace) as reader:
            return sum(f.nbytes for f in reader.frames())
    assert payload_bytes(path) < 0.8 * payload_bytes(stored)   # frame heads are the same on both sides
    assert list(open_trace(stored)) == list(open_trace(path)) == [header] + events


def test_a_frame_that_deflate_would_grow_is_stored(tmp_path):
    # 64 random 64-bit token ids: deflate cannot shrink them, so the frame is kept as it is
    tokens = list(xxhash.xxh64_intdigest(bytes([i])) for i in range(64))
    header = make_header(small_config())
    path = tmp_path / "random.trace"
    with TraceWriter(path, header) as writer:
        writer.emit(RequestAdded(0, 0, tokens, 8, 1.0, False, 0.5))
        writer.emit(StepEnd(0, 10, 1, 2, 3))
    assert not frame_words(path)[1] & DEFLATED
    assert list(open_trace(path))[1].prompt_token_ids == tokens


def test_the_dictionary_is_pinned():
    # part of format version 1: traces deflated with it read only with it
    assert len(DICTIONARY) <= 8192 - 262            # within the deflate window, less its lookahead
    assert xxhash.xxh64_intdigest(DICTIONARY) == DICTIONARY_XXH64 == 0x6e01051b4f90cd35


def append_frame(path, payload: bytes, deflated: bool) -> int:
    """Appends a frame with a valid checksum, in place of the end frame of a
    closed trace (the recording goes on); returns its offset."""
    offset = os.path.getsize(path)
    if path.read_bytes().endswith(END_FRAME):
        offset -= len(END_FRAME)
    with open(path, "r+b") as f:
        f.truncate(offset)
        f.seek(offset)
        f.write(frame_bytes(payload, deflated))
    return offset


def deflate(payload: bytes) -> bytes:
    deflater = zlib.compressobj(6, zlib.DEFLATED, -WINDOW_BITS, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)
    return deflater.compress(payload) + deflater.flush()


def test_stored_and_deflated_frames_mix_in_one_trace(tmp_path):
    path = tmp_path / "mixed.trace"
    with TraceWriter(path, make_header(small_config())):
        pass
    steps = [[TokenSample(i, 1, 40 + i, True), StepEnd(i, 9, 1, 2, 3)] for i in range(4)]
    for i, events in enumerate(steps):
        payload = msgspec.msgpack.encode(events)
        append_frame(path, deflate(payload) if i % 2 else payload, deflated=bool(i % 2))
    with TraceReader(path) as reader:
        assert [f.step for f in reader.frames()] == [-1, 0, 1, 2, 3]
        assert list(reader.events(1)) == [e for events in steps for e in events]


def test_flipped_deflate_flag_is_caught_by_the_head_check(recorded):
    path = recorded[0]
    with TraceReader(path) as reader:
        bad = reader.frames()[4]
    flip_byte(path, bad.offset + 3, 0x80)              # bit 31 of the length word
    with TraceReader(path) as reader:
        assert reader.corruption.offset == bad.offset and "head (length and checksum) fails" in str(reader.corruption)
        assert reader.num_frames == 4


def test_flipped_deflate_flag_under_a_valid_head_is_caught_by_the_checksum(recorded):
    path = recorded[0]
    with TraceReader(path) as reader:
        bad = reader.frames()[4]
    data = bytearray(path.read_bytes())
    word, checksum, _ = FRAME_HEAD.unpack_from(data, bad.offset)
    pack_head(memoryview(data)[bad.offset:], word ^ DEFLATED, checksum)   # the head's check is redone
    path.write_bytes(bytes(data))
    with TraceReader(path) as reader:
        assert reader.corruption.offset == bad.offset and "fails its checksum" in str(reader.corruption)


def test_a_frame_that_does_not_inflate_is_corruption_at_its_offset(recorded):
    path = recorded[0]
    offset = append_frame(path, b"\xff" * 40, deflated=True)    # a valid checksum over bytes that are no deflate stream
    with TraceReader(path) as reader:
        assert reader.corruption.offset == offset
        assert "does not inflate" in str(reader.corruption)
        with pytest.raises(TraceCorruptError, match=f"does not inflate .* at offset {offset}"):
            list(reader.events())


def test_a_cut_deflate_stream_is_corruption_when_read(recorded):
    path, header, events, engine = recorded
    step = engine.num_steps
    payload = deflate(msgspec.msgpack.encode([TokenSample(step, 0, 5, True), StepEnd(step, 9, 1, 2, 3)]))
    offset = append_frame(path, payload[:-2], deflated=True)
    with TraceReader(path) as reader:
        assert reader.frames()[-1].offset == offset     # its first event's step still inflates
        read = []
        with pytest.raises(TraceCorruptError, match=f"not one whole deflate stream at offset {offset}"):
            for event in reader.events():
                read.append(event)
        assert read == [header] + events


def test_a_frame_inflating_past_the_limit_is_corruption_not_an_allocation(recorded, monkeypatch):
    path = recorded[0]
    offset = append_frame(path, deflate(msgspec.msgpack.encode([StepEnd(99, 0, 0, 0, 0)] * 200)), deflated=True)
    monkeypatch.setattr(trace_reader, "MAX_FRAME_BYTES", 1000)    # the 200 events take more
    with TraceReader(path) as reader:
        with pytest.raises(TraceCorruptError, match=f"inflates past its limit of 1000 bytes .* at offset {offset}"):
            list(reader.events())


def test_torn_tail_at_every_cut_point_keeps_every_complete_step(recorded, tmp_path):
    path, header, events, _ = recorded
    data = path.read_bytes()
    with TraceReader(path) as reader:
        frames = reader.frames()
    cut_path = tmp_path / "cut.trace"
    header_end = frames[1].offset
    for cut in range(header_end, len(data) + 1):
        cut_path.write_bytes(data[:cut])
        complete = [f for f in frames if f.offset + FRAME_HEAD.size + f.nbytes <= cut]
        with TraceReader(cut_path) as reader:
            assert reader.frames() == complete
            assert reader.ended == (cut == len(data))   # the end frame, whole
            last = complete[-1]
            torn_at = last.offset + FRAME_HEAD.size + last.nbytes
            whole = torn_at == cut or reader.ended
            assert reader.torn_tail == (None if whole else (torn_at, cut - torn_at))
            assert reader.corruption is None
            assert list(reader.events()) == [header] + [e for e in events if e.step <= last.step]


def test_a_trace_cut_inside_its_header_frame_is_refused(recorded, tmp_path):
    path = recorded[0]
    cut_path = tmp_path / "cut.trace"
    cut_path.write_bytes(path.read_bytes()[:PREAMBLE.size + 20])
    with pytest.raises(TraceError, match="the file ends inside its header frame"):
        TraceReader(cut_path)


def flip_byte(path, offset, mask=0x40):
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def test_flipped_byte_is_corruption_at_its_frame_offset(recorded):
    path, header, events, _ = recorded
    with TraceReader(path) as reader:
        bad = reader.frames()[6]                     # the frame of step 5
    flip_byte(path, bad.offset + FRAME_HEAD.size + bad.nbytes // 2)
    with TraceReader(path) as reader:
        assert reader.corruption.offset == bad.offset
        assert reader.corruption.step == 4           # the last good step
        assert reader.num_frames == 6
        assert reader.torn_tail is None
        read = []
        with pytest.raises(TraceCorruptError, match=f"checksum at offset {bad.offset} \\(after step 4\\)"):
            for event in reader.events():
                read.append(event)
        assert read == [header] + [e for e in events if e.step < 5]


def test_flipped_byte_in_the_header_frame_is_refused(recorded):
    path = recorded[0]
    flip_byte(path, PREAMBLE.size + FRAME_HEAD.size + 3)
    with pytest.raises(TraceCorruptError, match=f"offset {PREAMBLE.size}"):
        TraceReader(path)


def test_absurd_frame_length_is_corruption_not_an_allocation(recorded):
    path = recorded[0]
    with TraceReader(path) as reader:
        bad = reader.frames()[3]
    data = bytearray(path.read_bytes())
    checksum = FRAME_HEAD.unpack_from(data, bad.offset)[1]
    pack_head(memoryview(data)[bad.offset:], 0x7FFF_FFF0, checksum)   # a head whose check holds
    path.write_bytes(bytes(data))
    with TraceReader(path) as reader:
        assert reader.corruption.offset == bad.offset
        assert "over the limit" in str(reader.corruption)
        assert reader.num_frames == 3
        with pytest.raises(TraceCorruptError, match=f"offset {bad.offset}"):
            list(reader.events())


def test_wrong_magic(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello, this is not a trace at all")
    with pytest.raises(TraceError, match="not a tracengine trace"):
        TraceReader(path)
    path.write_bytes(b"")
    with pytest.raises(TraceError, match="not a tracengine trace"):
        TraceReader(path)


def test_other_format_version_names_both(recorded):
    path = recorded[0]
    data = bytearray(path.read_bytes())
    PREAMBLE.pack_into(data, 0, b"TRCE", FORMAT_VERSION + 1)
    path.write_bytes(bytes(data))
    with pytest.raises(TraceVersionError, match=f"trace format version {FORMAT_VERSION + 1}, "
                                                f"this tracengine reads versions 1 to {FORMAT_VERSION}"):
        list(open_trace(path))


def test_refresh_picks_up_frames_and_waits_out_a_half_written_one(recorded, tmp_path):
    path, header, events, engine = recorded
    data = path.read_bytes()
    with TraceReader(path) as full:
        frames = full.frames()
    growing = tmp_path / "growing.trace"
    growing.write_bytes(data[:frames[3].offset])
    with TraceReader(growing) as reader:
        assert reader.num_frames == 3
        half = frames[3].offset + FRAME_HEAD.size + frames[3].nbytes // 2
        with open(growing, "ab") as f:
            f.write(data[frames[3].offset:half])
            f.flush()
            assert reader.refresh() == 0
            assert reader.torn_tail == (frames[3].offset, half - frames[3].offset)
            f.write(data[half:])
        assert reader.refresh() == len(frames) - 3
        assert reader.torn_tail is None
        assert list(reader.events()) == [header] + events


def test_follow_yields_each_step_while_the_trace_is_written(tmp_path):
    path = tmp_path / "live.trace"
    config = small_config()
    writer = TraceWriter(path, make_header(config))
    engine = LLMEngine(config, SyntheticRunner(eos=EOS), writer)
    for i in range(3):
        engine.add_request(list(range(10 * i, 10 * i + 6)), SamplingParams(max_tokens=4))
    seen = queue.Queue()
    done = threading.Event()

    def produce():
        # the next step is written only once the reader has seen this one
        try:
            while not engine.is_finished():
                engine.step()
                assert seen.get(timeout=10) == engine.num_steps - 1
        finally:
            writer.close()
            done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    followed = []
    for event in open_trace(path, follow=True, poll_interval=0.002, stop=done.is_set):
        followed.append(event)
        if type(event) is StepEnd:
            seen.put(event.step)
    producer.join()
    assert [e.step for e in followed if type(e) is StepEnd] == list(range(engine.num_steps))
    assert followed == list(open_trace(path))


def test_format_v1_trace_still_reads():
    # traces/format-v1.trace is kept forever; made by scripts/make_format_trace.py
    path = REPO / "traces" / "format-v1.trace"
    with TraceReader(path) as reader:
        assert reader.header.format_version == 1
        assert reader.num_frames == 1 + 17
        assert reader.torn_tail is None and reader.corruption is None
        assert not reader.ended   # written before writers closed traces with an end frame
    assert all(word & DEFLATED for word in frame_words(path))
    counts = collections.Counter(type(e).__name__ for e in open_trace(path))
    assert counts == {"TraceHeader": 1, "RequestAdded": 4, "ScheduleDecision": 17, "BlockAllocate": 5,
                      "BlockAppend": 4, "BlockHash": 15, "BlockFree": 5, "Preempt": 1, "TokenSample": 30,
                      "SeqFinish": 4, "StepEnd": 17}


def test_format_v4_trace_still_reads_and_replays_as_a_fleet():
    # traces/format-v4.trace is kept forever; made by scripts/make_format_trace.py (a fleet of three)
    from tracengine.fleet.replay import reexecute_fleet
    from tracengine.testing import every_fleet_event_type
    path = REPO / "traces" / "format-v4.trace"
    with TraceReader(path) as reader:
        assert reader.header.format_version == 4 and reader.ended
        assert reader.header.fleet["num_prefill_replicas"] == 1 and reader.header.fleet["num_decode_replicas"] == 2
        events = list(reader.events())
    counts = collections.Counter(type(e).__name__ for e in events)
    assert counts == {"TraceHeader": 1, "RouteDecision": 6, "ReplicaScope": 9, "RequestAdded": 6, "BlockAllocate": 6,
                      "ScheduleDecision": 9, "BlockHash": 8, "TokenSample": 12, "SeqFinish": 6, "BlockFree": 6,
                      "StepEnd": 9, "KVTransfer": 3}
    assert reexecute_fleet(events).ok
    # the same run today writes the same events (a change to the fleet shows here)
    assert every_fleet_event_type()[1:] == events[1:]


CHILD = """
import sys, time
from tracengine.engine.config import Config
from tracengine.engine.llm_engine import LLMEngine
from tracengine.sim.runners import SyntheticRunner
from tracengine.testing import every_event_type_config
from tracengine.engine.sampling_params import SamplingParams
from tracengine.trace.tracelog import TraceWriter, make_header

class SlowRunner(SyntheticRunner):
    def run(self, seqs, is_prefill):
        time.sleep(0.002)
        return super().run(seqs, is_prefill)

config = Config(num_kvcache_blocks=32, kvcache_block_size=4, max_num_batched_tokens=32, max_num_seqs=8,
                max_model_len=128, eos=999)
with TraceWriter(sys.argv[1], make_header(config)) as writer:
    engine = LLMEngine(config, SlowRunner(eos=999), writer)
    for i in range(300):
        engine.add_request([i % 7 + j for j in range(12)], SamplingParams(max_tokens=24, ignore_eos=True))
    while not engine.is_finished():
        engine.step()
"""


def wait_for_frames(path, num_frames, child, timeout=60.0):
    deadline = time.monotonic() + timeout
    reader = None
    try:
        while time.monotonic() < deadline and child.poll() is None:
            if reader is None:
                try:
                    reader = TraceReader(path)
                except (OSError, TraceError):   # not created, or its header not yet written
                    pass
            if reader is not None:
                reader.refresh()
                if reader.num_frames >= num_frames:
                    return
            time.sleep(0.005)
    finally:
        if reader is not None:
            reader.close()


def test_writer_killed_mid_run_leaves_every_finished_step(tmp_path, capsys):
    path = tmp_path / "killed.trace"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        wait_for_frames(path, 10, child)
        assert child.poll() is None, "the writer ended before it was killed"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    with TraceReader(path) as reader:
        assert reader.corruption is None
        frames = reader.frames()
        assert len(frames) >= 10
        assert [f.step for f in frames] == [-1] + list(range(len(frames) - 1))
        for i in range(1, len(frames)):
            assert type(reader.read_frame(i)[-1]) is StepEnd
        torn = reader.torn_tail
    last_step = len(frames) - 2
    assert [e.step for e in open_trace(path) if type(e) is StepEnd] == list(range(last_step + 1))
    assert not any(word & DEFLATED for word in frame_words(path))   # stored as written: no close, no compaction
    assert reexecute(open_trace(path)).ok

    from tracengine.cli import main
    exit_code = main(["check", str(path)])
    out = capsys.readouterr().out
    if torn is None:    # killed between two frames: intact, but never ended (exit 3)
        assert exit_code == 3 and f"steps: {last_step + 1} (0..{last_step})" in out
    else:               # killed while writing a frame
        assert exit_code == 1 and f"torn last frame: {torn.nbytes} bytes at offset {torn.offset}" in out
    assert main(["events", str(path), "--type", "StepEnd"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [int(line.split()[0]) for line in listed] == list(range(last_step + 1))


def test_importing_the_trace_modules_pulls_no_torch():
    code = ("import sys, tracengine, tracengine.trace.tracelog, tracengine.cli.events; "
            "assert tracengine.open_trace is tracengine.trace.tracelog.open_trace; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
