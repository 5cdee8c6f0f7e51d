"""Format 9: block id lists as runs on the wire (trace/block_runs.py), read back as the same events."""
from pathlib import Path

import msgspec
import pytest

from tracengine.errors import TraceCorruptError
from tracengine.testing import every_event_type, every_event_type_config
from tracengine.trace.block_runs import (
    MAX_RUN_LENGTH,
    BlockFreeRuns,
    WireEvent,
    id_runs,
    ids_of_runs,
    to_wire,
)
from tracengine.trace.events import BlockAllocate, BlockFree, Preempt, PromptBlocksHashed, StepEnd
from tracengine.trace.views import without_wall_clock
from tracengine.trace.tracelog import TraceReader, TraceWriter, make_header

TRACES = Path(__file__).resolve().parents[1] / "traces"


@pytest.mark.parametrize("ids", [[], [5], [1, 2, 3], [3, 2, 1], [1, 3, 5], [7, 8, 9, 20, 19, 18, 4], [1, 2, 1, 2],
                                 list(range(3 * MAX_RUN_LENGTH + 5)), list(range(2 * MAX_RUN_LENGTH, 0, -1))])
def test_a_block_id_list_and_its_runs_hold_the_same_ids(ids):
    runs = id_runs(ids)
    assert ids_of_runs(runs) == ids
    assert all(0 < abs(count) <= MAX_RUN_LENGTH for count in runs[1::2])


def test_runs_of_consecutive_ids_take_two_ints_a_run_tail_first_too():
    assert id_runs([10, 11, 12, 13, 40, 41]) == [10, 4, 40, 2]
    assert id_runs([13, 12, 11, 10, 7]) == [13, -4, 7, 1]


def test_an_event_is_written_as_runs_only_where_they_are_shorter():
    scattered = BlockFree(step=1, seq_id=0, block_ids=[9, 4, 7])
    assert to_wire(scattered) is scattered
    wire = to_wire(BlockFree(step=1, seq_id=0, block_ids=[9, 8, 7, 6]))
    assert type(wire) is BlockFreeRuns and wire.block_ids == [9, -4]


def wire_events(path) -> list:
    """The events of a trace whose frames are stored, as encoded: wire forms not turned back."""
    decoder = msgspec.msgpack.Decoder(list[WireEvent])
    with TraceReader(path) as reader:
        return [e for _, stored in reader.stored_frames() for e in decoder.decode(stored)]


def test_every_block_id_list_is_written_as_runs_and_read_back_as_the_events_emitted(tmp_path):
    """All four events that hold block ids (a hash-id run's PromptBlocksHashed, BlockAllocate,
    BlockFree, Preempt) go through a writer and come back as they were, their lists having been
    runs on the file."""
    with TraceReader(TRACES / "hash_ids_v7.trace") as reader:
        header, *events = list(reader.events())
    with TraceReader(TRACES / "format-v1.trace") as reader:
        events += [e for e in list(reader.events())[1:] if type(e) is Preempt]
    out = tmp_path / "runs.trace"
    with TraceWriter(out, header, deflate=False) as writer:
        for event in events + [StepEnd(step=10**6, num_free_blocks=0, schedule_ns=0, model_ns=0, postprocess_ns=0)]:
            writer.emit(event)
    with TraceReader(out) as reader:
        assert reader.version >= 9     # block id lists are runs since format 9
        assert list(reader.events())[1:-1] == events
    written = wire_events(out)
    assert {"BlockAllocateRuns", "BlockFreeRuns", "PreemptRuns", "PromptBlocksHashedRuns"} <= {
        type(e).__name__ for e in written}
    plain = [e for e in written if type(e) in (BlockAllocate, BlockFree, Preempt, PromptBlocksHashed)]
    assert all(len(id_runs(ids)) >= len(ids) for e in plain
               for ids in [e.freed_block_ids if type(e) is Preempt else e.block_ids])   # no shorter as runs


def test_the_format_9_trace_reads_as_the_same_events_as_format_1():
    """traces/format-v9.trace (scripts/make_format_trace.py) is the run format-v1.trace pins,
    written with block id runs: the same events, every block list included."""
    with TraceReader(TRACES / "format-v1.trace") as old, TraceReader(TRACES / "format-v9.trace") as new:
        old_events, new_events = list(old.events()), list(new.events())
        assert (old.version, new.version) == (1, 9)
    assert [without_wall_clock(e) for e in new_events[1:]] == [without_wall_clock(e) for e in old_events[1:]]
    assert {BlockAllocate, BlockFree, Preempt} <= {type(e) for e in new_events}
    assert PromptBlocksHashed not in {type(e) for e in new_events}


def test_the_format_9_trace_is_what_the_writer_writes_today(tmp_path):
    with TraceWriter(tmp_path / "today.trace", make_header(every_event_type_config())) as writer:
        every_event_type(writer)
    with TraceReader(tmp_path / "today.trace") as today, TraceReader(TRACES / "format-v9.trace") as kept:
        assert [without_wall_clock(e) for e in list(today.events())[1:]] == \
            [without_wall_clock(e) for e in list(kept.events())[1:]]


@pytest.mark.parametrize("runs", [[5, 0], [5, 2, 9], [5, MAX_RUN_LENGTH + 1]])
def test_a_damaged_run_list_is_a_corrupt_frame_not_a_crash_or_a_huge_list(tmp_path, runs):
    out = tmp_path / "bad.trace"
    with TraceWriter(out, make_header(every_event_type_config()), deflate=False) as writer:
        writer.emit(BlockFreeRuns(step=0, seq_id=0, block_ids=runs))    # as a damaged file holds it
        writer.emit(StepEnd(step=0, num_free_blocks=0, schedule_ns=0, model_ns=0, postprocess_ns=0))
    with TraceReader(out) as reader, pytest.raises(TraceCorruptError, match="frame 1 does not decode"):
        list(reader.events())
