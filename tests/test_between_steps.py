"""Format 8's between-steps frames (issue 34, item 8): an abort that leaves the engine idle is
written at once, as a frame of its own before the step it precedes (TraceWriter.flush), and
every reader of a trace (re-execution, fold, check, stats, what-if, export, diff, events, the
TUI's index, live or not) reads a step split that way as the same step."""
from pathlib import Path

import msgspec
import pytest

from tracengine.analysis.stats import stats
from tracengine.cli import main
from tracengine.engine.llm_engine import LLMEngine
from tracengine.engine.sampling_params import SamplingParams
from tracengine.errors import TraceError
from tracengine.replay.event_check import EventCheck
from tracengine.replay.fold import Fold
from tracengine.replay.reexec import reexecute
from tracengine.replay.whatif import whatif
from tracengine.sim.runners import SyntheticRunner
from tracengine.testing import aborts_between_steps, every_event_type_config
from tracengine.trace.events import BlockAllocate, BlockFree, RequestAdded, ScheduleDecision, SeqAbort, StepEnd
from tracengine.trace.tracelog import TraceReader, TraceWriter, make_header, open_trace
from tracengine.tui.trace_index import TraceIndex

GOLDEN = Path(__file__).resolve().parents[1] / "traces" / "format-v8.trace"
# the frames of aborts_between_steps, by their first step: step 2's abort before step 2's frame,
# and the last abort, after step 6, before the end frame
FRAME_STEPS = [-1, 0, 1, 2, 2, 3, 4, 5, 6, 7]


def one_running_request(writer) -> LLMEngine:
    config = every_event_type_config()
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos), writer)
    engine.add_request(list(range(20, 30)), SamplingParams(max_tokens=20, ignore_eos=True))
    engine.step()
    engine.step()
    return engine


def test_a_flushed_abort_is_on_the_file_with_no_step_after_it(tmp_path):
    path = tmp_path / "idle.trace"
    writer = TraceWriter(path, make_header(every_event_type_config()))
    engine = one_running_request(writer)
    engine.abort_request(0, "client")
    writer.flush()
    # the writer is still open, no step follows: the file alone holds the abort
    events = list(open_trace(path))
    assert [type(e) for e in events[-2:]] == [SeqAbort, BlockFree]
    assert events[-2].seq_id == 0 and events[-2].step == 2 and events[-1].block_ids == [2, 1, 0]
    writer.close()
    with TraceReader(path) as reader:
        assert reader.ended and [f.step for f in reader.frames()] == [-1, 0, 1, 2]
        assert list(reader.events()) == events          # closing wrote nothing twice
    assert main(["check", str(path)]) == 0


def test_flush_writes_only_what_came_between_steps(tmp_path):
    events = list(open_trace(GOLDEN))
    header, rest = events[0], events[1:]
    step_5 = [e for e in rest if e.step == 5]
    assert [type(e) for e in step_5[:2]] == [RequestAdded, BlockAllocate]
    path = tmp_path / "flush.trace"
    with TraceWriter(path, header, deflate=False) as writer:
        for event in rest:
            if event.step == 5 and type(event) is not RequestAdded:
                writer.flush()              # twice: after RequestAdded, and once step 5 has begun
            writer.emit(event)
            if event.step == 4 and type(event) is StepEnd:
                writer.flush()              # nothing pending: no frame
    with TraceReader(path) as reader:
        # the golden's frames, and step 5's RequestAdded in a frame of its own before the step's
        # (the aborts, not flushed here, go with step 2's frame and with the end frame)
        assert [f.step for f in reader.frames()] == [-1, 0, 1, 2, 3, 4, 5, 5, 6, 7]
        assert [type(e) for e in reader.read_frame(6)] == [RequestAdded]
        assert reader.read_step(5) == step_5 and list(reader.events())[1:] == rest


def test_the_format_v8_trace_is_what_the_writer_writes(tmp_path):
    # scripts/make_format_trace.py wrote it; a change in the writer's frames shows here
    path = tmp_path / "v8.trace"
    with TraceWriter(path, make_header(every_event_type_config())) as writer:
        aborts_between_steps(writer)
    with TraceReader(path) as new, TraceReader(GOLDEN) as old:
        assert old.version == 8 and old.ended and old.run_end is None
        assert [f.step for f in new.frames()] == [f.step for f in old.frames()] == FRAME_STEPS
        assert ([type(e).__name__ for e in new.events()] == [type(e).__name__ for e in old.events()])


def test_every_reader_reads_the_format_v8_trace(tmp_path, capsys):
    events = list(open_trace(GOLDEN))
    assert reexecute(events).ok
    fold = Fold(events)
    assert fold.num_steps == 7 and [type(e) for e in fold.events_at(7)] == [SeqAbort, BlockFree]
    assert fold.state_at(2).seqs[1].finish_reason == "abort"
    with TraceReader(GOLDEN) as reader:
        check = EventCheck(reader.header)
        for i in range(1, reader.num_frames):
            check.frame(reader.read_frame(i))
        step_2 = reader.read_step(2)
    assert [type(e) for e in step_2[:3]] == [SeqAbort, BlockFree, ScheduleDecision] and type(step_2[-1]) is StepEnd
    assert stats(str(GOLDEN))["requests"]["num_aborted"] == 2
    assert whatif(events, {"num_kvcache_blocks": 8}).original == stats(events)
    for argv in (["check", str(GOLDEN)], ["replay", str(GOLDEN)], ["diff", str(GOLDEN), str(GOLDEN)],
                 ["export", str(GOLDEN), "--perfetto", str(tmp_path / "out.json")]):
        assert main(argv) == 0, argv
    capsys.readouterr()
    assert main(["events", str(GOLDEN), "--step", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:2] == ["2", "SeqAbort"]


def test_the_tui_index_shows_a_step_with_the_frame_before_it():
    index = TraceIndex(GOLDEN)
    try:
        assert index.num_steps == 7
        shown = index.events_at(2)
        assert [type(e) for e in shown[:2]] == [SeqAbort, BlockFree] and type(shown[-1]) is StepEnd
        assert index.find_step("SeqAbort", -1, 1) == 2
        # each step's lines start where the step before it ended, the abort's lines in step 2
        assert index.event_start(3) - index.event_start(2) == len(shown)
        assert index.view_at(2).state.seqs[1].finish_reason == "abort"
    finally:
        index.close()


def test_the_tui_index_follows_a_server_idle_after_an_abort(tmp_path):
    path = tmp_path / "live.trace"
    with TraceWriter(path, make_header(every_event_type_config()), deflate=False) as writer:
        engine = one_running_request(writer)
        engine.add_request(list(range(40, 46)), SamplingParams(max_tokens=10, ignore_eos=True))
        engine.step()
        engine.abort_request(0, "client")
        writer.flush()
        index = TraceIndex(path)
        try:
            assert index.num_steps == 3 and not index.ended
            engine.step()                               # the server gets busy again
            index.index_more()
            assert index.num_steps == 4
            shown = index.events_at(3)
            assert type(shown[0]) is SeqAbort and type(shown[-1]) is StepEnd
            assert index.find_step("SeqAbort", -1, 1) == 3
        finally:
            index.close()


def test_a_format_7_trace_may_not_continue_after_a_frame_without_a_step_end():
    # before format 8 only a trace's last frame ends without a StepEnd: a frame after it is damage
    with TraceReader(GOLDEN) as reader:
        frames = [reader.read_frame(i) for i in range(1, reader.num_frames)]
        header = msgspec.structs.replace(reader.header, format_version=7)
    check = EventCheck(header)
    for events in frames[:3]:
        check.frame(events)
    with pytest.raises(TraceError, match="a frame follows one that ended without its step's StepEnd"):
        check.frame(frames[3])


def test_a_frame_that_begins_a_step_and_does_not_end_it_is_last(tmp_path):
    with TraceReader(GOLDEN) as reader:
        frames = [reader.read_frame(i) for i in range(1, reader.num_frames)]
        check = EventCheck(reader.header)
    for events in frames[:3]:                # steps 0 and 1, and the abort before step 2
        check.frame(events)
    check.frame(frames[3][:-1])              # step 2 without its StepEnd
    with pytest.raises(TraceError, match="ended without its step's StepEnd"):
        check.frame(frames[3][-1:])


def test_a_flushed_frame_replaces_the_old_file_as_a_step_would(tmp_path):
    # a server started with --force whose first request is aborted before any step: the abort is
    # in the file at its path at once, not in a temporary file beside the old trace
    path = tmp_path / "served.trace"
    path.write_bytes(b"the old trace")
    writer = TraceWriter(path, make_header(every_event_type_config()))
    config = every_event_type_config()
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos), writer)
    engine.add_request(list(range(20, 30)), SamplingParams(max_tokens=4))
    engine.abort_request(0, "client")
    writer.flush()
    assert [type(e) for e in open_trace(path)][1:] == [RequestAdded, SeqAbort]
    assert not (tmp_path / "served.trace.recording.tmp").exists()
    writer.close()
    assert main(["check", str(path)]) == 0
