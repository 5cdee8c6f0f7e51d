"""The trace reader against damage and hostile files, with fixed seeds: bit flips
in every region of a recorded trace, a cut at every byte, and hand-made frames
(huge lengths, inflation bombs, deep nesting, a valid checksum over garbage, a
header of a future version). Each read ends in one of three ways, and only these:
a typed error with an offset (or a version error naming both versions), a torn
tail exactly where the file really ends inside its last frame, or every event
of the original. Never a traceback, never a silently shortened read, and the
memory a read takes stays proportional to the file. `benchmarks/fuzz_trace.py`
runs the same harness for longer."""
import dataclasses
import os
import random
import struct
import tracemalloc
import zlib
from pathlib import Path

import msgspec
import pytest

from helpers import record_every_event_type
from tracengine.cli import main
from tracengine.errors import TraceCorruptError, TraceError, TraceVersionError
from tracengine.replay.event_check import EventCheck
from tracengine.testing import every_event_type_config
from tracengine.trace.events import (ModelInfo, RequestAdded, ScheduledSeq, ScheduleDecision, StepEnd,
                                     TokenSample, TraceHeader)
from tracengine.trace.tracelog import END_FRAME, FORMAT_VERSION, TraceReader, TraceWriter, make_header
from tracengine.trace.dictionary import DICTIONARY
from tracengine.trace.frames import FRAME_HEAD, MAX_INFLATE_RATIO, PREAMBLE, WINDOW_BITS, frame_bytes

# What a read may cost beyond the file itself: the interpreter's own noise, zlib's window,
# one scan buffer. A hostile file takes at most MEMORY_PER_BYTE bytes per byte of it on top.
MEMORY_CONSTANT = 8 << 20
# A frame inflates to 32 times its stored bytes at most, and typed events decode to at most ~15
# times their msgpack bytes (an int above 256 is 3 bytes there, 40 here), plus the inflated bytes.
MEMORY_PER_BYTE = 600


def recorded_trace(path: Path, deflate: bool = True) -> list:
    """Records the every-event-type run to `path`; returns its events, header first."""
    header, events, _ = record_every_event_type(path, deflate)
    return [header] + events


@dataclasses.dataclass
class Outcome:
    kind: str                     # "read" or "refused"
    events: list = dataclasses.field(default_factory=list)
    error: TraceError | None = None
    torn_offset: int | None = None
    ended: bool = False
    peak_bytes: int = 0


def read_all(path: Path, measure: bool = False) -> Outcome:
    """Reads a trace as the commands do: index, header, then every event. A TraceError is
    a refusal; anything else propagates (a traceback is a failure of the test). With
    `measure`, the outcome carries the peak of memory allocated while reading."""
    if measure:
        tracemalloc.start()
    try:
        outcome = _read(path)
    finally:
        if measure:
            outcome_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    if measure:
        outcome.peak_bytes = outcome_peak
    return outcome


def _read(path: Path) -> Outcome:
    try:
        with TraceReader(path) as reader:
            events = []
            try:
                for event in reader.events():
                    events.append(event)
            except TraceError as exc:
                return Outcome("refused", events, exc)
            torn = reader.torn_tail.offset if reader.torn_tail is not None else None
            return Outcome("read", events, torn_offset=torn, ended=reader.ended)
    except TraceError as exc:
        return Outcome("refused", error=exc)


def frame_ends(path: Path) -> list[int]:
    """Offsets where each frame of an intact trace ends, the end frame last."""
    with TraceReader(path) as reader:
        ends = [f.offset + FRAME_HEAD.size + f.nbytes for f in reader.frames()]
    return ends + [os.path.getsize(path)]


def is_reported(outcome: Outcome) -> bool:
    """A typed error that says where, or names the versions, or (a damaged magic) says
    the file is no trace: never a read that goes on."""
    error = outcome.error
    return outcome.kind == "refused" and (isinstance(error, TraceCorruptError) and error.offset >= 0
                                          or isinstance(error, TraceVersionError)
                                          or "not a tracengine trace" in str(error))


def classify_flip(original: list, outcome: Outcome) -> str:
    """'reported' (a typed error with an offset), or 'silent': the read went on as if nothing
    happened, or came back shorter, or called the damage a torn tail (the file is whole)."""
    if is_reported(outcome):
        return "reported"
    return "silent"


def flip_trials(data: bytes, regions: dict[str, range], rng: random.Random, num_trials: int) -> list[tuple]:
    """(region, byte offset, bit) for num_trials flips spread over the regions in turn,
    every bit of the small regions first."""
    trials = []
    names = list(regions)
    for i in range(num_trials):
        name = names[i % len(names)]
        offset = rng.choice(regions[name])
        trials.append((name, offset, rng.randrange(8)))
    return trials


def trace_regions(path: Path) -> dict[str, range]:
    """Byte ranges of each region of an intact, ended v3 trace."""
    with TraceReader(path) as reader:
        frames = reader.frames()
    size = os.path.getsize(path)
    head = FRAME_HEAD.size
    end_frame = size - len(END_FRAME)
    step_heads = [o for f in frames[1:] for o in range(f.offset, f.offset + head)]
    step_payloads = [o for f in frames[1:] for o in range(f.offset + head, f.offset + head + f.nbytes)]
    return {
        "preamble": range(0, PREAMBLE.size),
        "header head": range(frames[0].offset, frames[0].offset + head),
        "header payload": range(frames[0].offset + head, frames[0].offset + head + frames[0].nbytes),
        "step heads": step_heads,
        "step payloads": step_payloads,
        "end frame": range(end_frame, size),
    }


def run_flips(path: Path, work: Path, num_trials: int, seed: int) -> dict:
    """Flips one bit per trial; returns counts per region and outcome."""
    data = path.read_bytes()
    original = read_all(path).events
    counts: dict = {}
    for region, offset, bit in flip_trials(data, trace_regions(path), random.Random(seed), num_trials):
        damaged = bytearray(data)
        damaged[offset] ^= 1 << bit
        work.write_bytes(bytes(damaged))
        verdict = classify_flip(original, read_all(work))
        counts.setdefault(region, {"reported": 0, "silent": 0})[verdict] += 1
        if verdict == "silent":
            counts.setdefault("silent_cases", []).append((region, offset, bit))
    return counts


def check_cut(path: Path, data: bytes, work: Path, ends: list[int], cut: int) -> str | None:
    """Reads the first `cut` bytes of `data` (the trace at `path`); returns what is wrong
    with the outcome, or None."""
    work.write_bytes(data[:cut])
    outcome = read_all(work)
    header_end = ends[0]
    if cut < header_end:
        return None if is_reported(outcome) or (outcome.kind == "refused" and cut == 0) else f"{outcome}"
    if outcome.kind != "read":
        return f"refused: {outcome.error}"
    whole = [e for e in ends if e <= cut]          # frames wholly inside the cut
    num_frames = len(whole) if cut < ends[-1] else len(ends) - 1
    expected = frames_events(path, num_frames)
    if outcome.events != expected:
        return f"{len(outcome.events)} events, {len(expected)} in the whole frames before the cut"
    at_boundary = cut in ends
    if at_boundary and outcome.torn_offset is not None:
        return f"a torn tail at {outcome.torn_offset}, but the cut is between frames"
    if not at_boundary and outcome.torn_offset != whole[-1]:
        return f"torn tail at {outcome.torn_offset}, the cut frame starts at {whole[-1]}"
    if outcome.ended != (cut == ends[-1]):
        return "ended wrongly"
    return None


_FRAME_EVENTS: dict = {}


def frames_events(path: Path, num_frames: int) -> list:
    """The events of the first num_frames frames of the intact trace (the end frame has none)."""
    key = (str(path), os.path.getmtime(path))
    if key not in _FRAME_EVENTS:
        with TraceReader(path) as reader:
            _FRAME_EVENTS[key] = [reader.read_frame(i) for i in range(reader.num_frames)]
    return [e for frame in _FRAME_EVENTS[key][:num_frames] for e in frame]


# --- hostile files --------------------------------------------------------------------------------------

def deflate(payload: bytes, level: int = 9) -> bytes:
    deflater = zlib.compressobj(level, zlib.DEFLATED, -WINDOW_BITS, 9, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)
    return deflater.compress(payload) + deflater.flush()


def header_frame(config=None, version: int = FORMAT_VERSION) -> bytes:
    config = config if config is not None else every_event_type_config().to_dict()
    header = TraceHeader(version, "0.1.0", config, ModelInfo("m", "float32", "Qwen3"), "cpu", "", 0)
    return frame_bytes(msgspec.msgpack.encode([header]))


def preamble(version: int = FORMAT_VERSION) -> bytes:
    return PREAMBLE.pack(b"TRCE", version)


def raw_header_payload(config_bytes: bytes) -> bytes:
    """A header frame's payload whose config is the given msgpack bytes (whatever a hostile file holds)."""
    head = msgspec.msgpack.encode([TraceHeader(FORMAT_VERSION, "0.1.0", {}, ModelInfo("m", "f", "a"), "cpu", "", 0)])
    empty_map = msgspec.msgpack.encode({})
    assert head.count(empty_map) == 2           # the config's, then the fleet's (format 4)
    return head.replace(empty_map, config_bytes, 1)


def ints_bomb(num_ints: int) -> bytes:
    """One StepEnd-stamped frame of a RequestAdded whose prompt is num_ints 3-byte ints."""
    prompt = b"\xdd" + struct.pack(">I", num_ints) + b"\xcd\x01\x00" * num_ints
    event = msgspec.msgpack.encode(RequestAdded(0, 0, [], 1, 1.0, False, stop_token_ids=[7]))
    assert event.count(b"\x90") == 3                # its empty prompt list, prompt_hash_ids and depends_on
    return b"\x91" + event.replace(b"\x90", prompt, 1)


def largest_accepted_frame() -> bytes:
    """A step of 8 requests of 128Ki tokens, nine in ten of them the same: deflated 31 to
    1, just inside what a reader inflates (its events decode to ~13 times their bytes)."""
    rng = random.Random(7)
    events = [RequestAdded(0, i, [300 + (rng.random() > 0.9) for _ in range(128 << 10)], 1, 1.0, False)
              for i in range(8)]
    payload = msgspec.msgpack.encode(events + [StepEnd(0, 9, 1, 2, 3)])
    deflated = deflate(payload)
    assert 24 * len(deflated) < len(payload) <= MAX_INFLATE_RATIO * len(deflated)
    return frame_bytes(deflated, deflated=True)


def _good_header() -> bytes:
    return preamble() + header_frame()


def _step() -> bytes:
    return msgspec.msgpack.encode([TokenSample(0, 0, 5, True), StepEnd(0, 9, 1, 2, 3)])


def _million_lists() -> bytes:
    keys = b"".join(b"\xa4" + struct.pack(">I", i) + b"\x90" for i in range(1 << 20))   # each an empty list
    return preamble() + frame_bytes(deflate(raw_header_payload(b"\xdf" + struct.pack(">I", 1 << 20) + keys), 1),
                                    deflated=True)


GARBAGE = bytes(random.Random(5).randrange(256) for _ in range(4096))

# name -> (a function building the file, what a reader must say: 'corrupt', 'version', 'torn' or 'read')
HOSTILE_FILES = {
    "huge length, head check holds": (lambda: _good_header() + huge_length_frame(), "corrupt"),
    "length past the end, head check holds": (lambda: _good_header() + frame_bytes(_step())[:FRAME_HEAD.size + 3],
                                              "torn"),
    # 24 MiB of 3-byte ints, a few KiB deflated
    "inflation bomb": (lambda: _good_header() + frame_bytes(deflate(ints_bomb(8 << 20), 1), deflated=True),
                       "corrupt"),
    "largest frame under the inflate bound": (lambda: _good_header() + largest_accepted_frame() + END_FRAME, "read"),
    "deep nesting in the config": (lambda: preamble() + frame_bytes(raw_header_payload(
        b"\x81\xa1a" + b"\x91" * 990 + b"\x90")), "corrupt"),          # {"a": [[[...]]]}, 990 deep
    "a million lists in the config": (_million_lists, "corrupt"),
    "array of 4 billion events": (lambda: _good_header() + frame_bytes(b"\xdd\xff\xff\xff\xff" + b"\x01" * 64),
                                  "corrupt"),
    "valid checksum over garbage": (lambda: _good_header() + frame_bytes(GARBAGE), "corrupt"),
    "valid checksum over garbage, deflated": (lambda: _good_header() + frame_bytes(GARBAGE, deflated=True), "corrupt"),
    "future version": (lambda: preamble(FORMAT_VERSION + 1) + header_frame(version=FORMAT_VERSION + 1), "version"),
    "header of a future version": (lambda: preamble() + header_frame(version=FORMAT_VERSION + 1), "corrupt"),
    "bytes after the end frame": (lambda: _good_header() + frame_bytes(_step()) + END_FRAME + b"\x00", "corrupt"),
}


def huge_length_frame() -> bytes:
    frame = bytearray(FRAME_HEAD.size)
    from tracengine.trace.frames import pack_head
    pack_head(frame, 0x7FFF_FFF0, 0)
    return bytes(frame) + b"\x00" * 64


# --- the tests -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("reliability") / "run.trace"
    recorded_trace(path)
    return path


def test_every_region_of_the_trace_is_flipped_and_every_flip_reported(trace, tmp_path):
    counts = run_flips(trace, tmp_path / "flipped.trace", num_trials=1200, seed=16)
    assert not counts.get("silent_cases"), counts.get("silent_cases")
    for region in ("preamble", "header head", "header payload", "step heads", "step payloads", "end frame"):
        assert counts[region]["reported"] >= 100, region          # 1200 trials, 6 regions


def test_every_bit_of_the_preamble_and_the_end_frame(trace, tmp_path):
    data = trace.read_bytes()
    work = tmp_path / "flipped.trace"
    for offset in [*range(PREAMBLE.size), *range(len(data) - len(END_FRAME), len(data))]:
        for bit in range(8):
            damaged = bytearray(data)
            damaged[offset] ^= 1 << bit
            work.write_bytes(bytes(damaged))
            assert is_reported(read_all(work)), (offset, bit)


@pytest.mark.parametrize("deflate_frames", [True, False])
def test_a_cut_at_every_byte_is_a_torn_tail_where_the_file_ends(tmp_path, deflate_frames):
    path = tmp_path / "run.trace"
    recorded_trace(path, deflate=deflate_frames)
    data = path.read_bytes()
    ends = frame_ends(path)
    work = tmp_path / "cut.trace"
    problems = [(cut, p) for cut in range(len(data) + 1) if (p := check_cut(path, data, work, ends, cut)) is not None]
    assert problems == []


@pytest.mark.parametrize("name", list(HOSTILE_FILES))
def test_hostile_files_are_refused_in_bounded_memory(tmp_path, name):
    build, expected = HOSTILE_FILES[name]
    data = build()
    path = tmp_path / "hostile.trace"
    path.write_bytes(data)
    outcome = read_all(path, measure=True)
    peak = outcome.peak_bytes
    assert peak <= MEMORY_CONSTANT + MEMORY_PER_BYTE * len(data), f"{peak:,} bytes for a {len(data):,}-byte file"
    if expected == "corrupt":
        assert isinstance(outcome.error, TraceCorruptError) and outcome.error.offset >= 0, outcome
        assert f"at offset {outcome.error.offset}" in str(outcome.error)
    elif expected == "version":
        assert isinstance(outcome.error, TraceVersionError)
        assert f"version {FORMAT_VERSION + 1}, this tracengine reads versions 1 to {FORMAT_VERSION}" in str(outcome.error)
    elif expected == "torn":
        assert outcome.kind == "read" and outcome.torn_offset == len(data) - FRAME_HEAD.size - 3
    else:
        assert outcome.kind == "read"
    code = main(["check", str(path)])            # the CLI says so too: one line, no traceback
    assert code in (1, 2, 3) if expected != "read" else code in (0, 1, 3)


def test_a_7_byte_file_is_cut_inside_its_preamble(tmp_path, capsys):
    path = tmp_path / "seven.trace"
    path.write_bytes(b"TRCE\x03\x00\x00")
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().out == (f"{path}: damaged: {path}: the file ends inside its preamble "
                                       f"(7 of 8 bytes; no header was written) at offset 7\n")
    path.write_bytes(b"TRCX\x03\x00\x00\x00")
    assert main(["events", str(path)]) == 2
    assert "not a tracengine trace (it does not start with b'TRCE')" in capsys.readouterr().err


def test_the_kept_traces_of_every_version_still_read_and_check(capsys):
    traces = Path(__file__).resolve().parents[1] / "traces"
    for path in sorted(traces.glob("*.trace")):
        outcome = read_all(path)
        assert outcome.kind == "read" and outcome.torn_offset is None, path
        # the older ones were written before the end frame; format-v6's run was interrupted (exit 4)
        assert main(["check", str(path)]) in ((4,) if path.name == "format-v6.trace" else (0, 3)), path
    capsys.readouterr()


# --- check folds the events --------------------------------------------------------------------------------

def rewrite_step(path: Path, out: Path, step: int, change) -> None:
    """Copies the trace with `change(events)` applied to one step's frame."""
    with TraceReader(path) as reader:
        frames = [reader.read_frame(i) for i in range(reader.num_frames)]
    with TraceWriter(out, frames[0][0]) as writer:
        for events in frames[1:]:
            for event in (change(events) if events[0].step == step else events):
                writer.emit(event)


@pytest.mark.parametrize("change, match", [
    (lambda evs: [evs[0], TraceHeader(FORMAT_VERSION, "0.1.0", {}, ModelInfo("m", "f", "a"), "cpu", "", 0), *evs[1:]],
     "TraceHeader after the first frame"),
    (lambda evs: [msgspec.structs.replace(e, step=e.step + 5) for e in evs], "it is stamped step 7"),
    (lambda evs: [*evs[:-1], msgspec.structs.replace(evs[-1], num_free_blocks=evs[-1].num_free_blocks + 1)],
     "free blocks, the events leave"),
    (lambda evs: [ScheduleDecision(2, "decode", [ScheduledSeq(77, 1, 4)], 1, "running_empty"), *evs],
     "seq 77 is not running"),
])
def test_check_reports_the_first_event_that_does_not_follow(trace, tmp_path, capsys, change, match):
    bad = tmp_path / "impossible.trace"
    rewrite_step(trace, bad, 2, change)
    assert main(["check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"impossible event: step 2: event " in out and match in out and "frame at offset" in out
    assert out.splitlines()[-1] == f"{bad}: damaged"
    assert main(["check", str(bad), "--fast"]) == 0      # frames and checksums alone hold
    capsys.readouterr()


def test_check_exit_3_for_a_trace_without_end_frame(trace, tmp_path, capsys):
    unended = tmp_path / "unended.trace"
    unended.write_bytes(trace.read_bytes()[:-len(END_FRAME)])
    assert main(["check", str(unended)]) == 3
    assert capsys.readouterr().out.splitlines()[-1] == f"{unended}: not ended (intact, but no end frame: exit 3)"
    assert main(["check", str(unended), "--json"]) == 3
    assert '"status": "not ended"' in capsys.readouterr().out


def test_event_check_accepts_every_recorded_trace(trace):
    with TraceReader(trace) as reader:
        check = EventCheck(reader.header)
        for i in range(1, reader.num_frames):
            check.frame(reader.read_frame(i))


def test_check_follows_aborts_and_the_mixed_policy(tmp_path, capsys):
    from tracengine.engine.llm_engine import LLMEngine
    from tracengine.engine.sampling_params import SamplingParams
    from tracengine.sim.runners import SyntheticRunner
    for policy in ("prefill_first", "mixed"):
        config = dataclasses.replace(every_event_type_config(), scheduling_policy=policy)
        path = tmp_path / f"{policy}.trace"
        with TraceWriter(path, make_header(config)) as writer:
            engine = LLMEngine(config, SyntheticRunner(eos=config.eos), writer)
            for i in range(3):
                engine.add_request(list(range(10 * i, 10 * i + 9)), SamplingParams(max_tokens=6, ignore_eos=True))
            engine.step()
            engine.step()
            assert engine.abort_request(1, "client") is not None
            engine.add_request(list(range(90, 99)), SamplingParams(max_tokens=3, ignore_eos=True))
            while not engine.is_finished():
                engine.step()
        assert main(["check", str(path)]) == 0, capsys.readouterr().out
        assert main(["replay", str(path)]) == 0
    capsys.readouterr()
