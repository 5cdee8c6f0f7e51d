"""A sink that keeps no block-level events (a live fold of the figures alone) is given none: the
block managers build BlockAppend, BlockHash and BlockFree only for a sink that keeps them, and a
simulation's figures are the same either way."""
import pytest

from tracengine.analysis.timeline_sink import RequestTimelineSink
from tracengine.engine.block_manager import BlockManager
from tracengine.engine.config import Config
from tracengine.engine.sequence import Sequence
from tracengine.engine.vllm_block_manager import VllmBlockManager
from tracengine.trace.events import BlockAllocate, BlockAppend, BlockFree, BlockHash
from tracengine.trace.header import make_header
from tracengine.trace.sinks import ListSink


class FiguresOnly(ListSink):
    block_events = False


def lifecycle(manager):
    """Admit a 22-token prompt's first chunk, give it the rest, then free it."""
    seq = Sequence(0, list(range(22)), 4)
    manager.allocate(seq, manager.cached_block_ids(seq), *((10,) if manager.allocates_per_chunk else ()))
    if manager.allocates_per_chunk:
        seq.num_cached_tokens += 10
        assert manager.allocate_slots(seq, 12)
    else:
        manager.append_blocks(seq, 1)
        seq.num_scheduled_tokens = 22
        manager.hash_blocks(seq)
    manager.deallocate(seq)


@pytest.mark.parametrize("manager_class", [BlockManager, VllmBlockManager])
def test_block_level_events_only_for_a_sink_that_keeps_them(manager_class):
    kept, figures_only = ListSink(), FiguresOnly()
    lifecycle(manager_class(16, 4, kept))
    lifecycle(manager_class(16, 4, figures_only))
    assert {BlockAppend, BlockHash, BlockFree} <= {type(e) for e in kept.events}
    assert [type(e) for e in figures_only.events] == [BlockAllocate]
    assert figures_only.events == [e for e in kept.events if type(e) is BlockAllocate]


def test_a_sink_set_later_decides_too():
    manager = VllmBlockManager(16, 4, FiguresOnly())
    manager.sink = kept = ListSink()
    lifecycle(manager)
    assert BlockAppend in {type(e) for e in kept.events}


def test_the_live_fold_keeps_block_events_only_for_a_writer_behind_it():
    header = make_header(Config(num_kvcache_blocks=16, kvcache_block_size=4))
    assert not RequestTimelineSink(header).block_events
    assert RequestTimelineSink(header, inner=ListSink()).block_events
    assert not RequestTimelineSink(header, inner=FiguresOnly()).block_events
