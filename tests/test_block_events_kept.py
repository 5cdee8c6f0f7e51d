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


def test_the_live_fold_takes_kept_tokens_without_their_events_and_folds_the_same():
    """A live fold with nothing behind it takes each kept token by `token_kept` (no TokenSample built);
    with a writer behind it every token comes as its event. The figures are the same."""
    from tracengine.engine.request import Request
    from tracengine.sim.engine import run_timed
    from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime

    config = Config(num_kvcache_blocks=24, kvcache_block_size=4, max_num_batched_tokens=16, max_num_seqs=3,
                    max_model_len=64, scheduling_policy="mixed", eos=999)
    requests = [Request(list(range(5 * i, 5 * i + 9 + 6 * (i % 3))), 4 + i % 5, arrival_ns=i * 30_000,
                        ignore_eos=True) for i in range(10)]
    taken_directly = RequestTimelineSink(make_header(config))
    assert taken_directly.token_kept is not None
    written = ListSink()
    as_events = RequestTimelineSink(make_header(config), inner=written)
    assert as_events.token_kept is None
    for sink in (taken_directly, as_events):
        timing = LinearStepTime({phase: {part: [1000.0 * (k + 1) for k in range(len(FEATURES))] for part in PARTS}
                                 for phase in ("prefill", "decode", "mixed")}, gap_ns=5_000, wake_ns=0)
        run_timed(config, list(requests), timing, sink=sink)
    assert sum(type(e).__name__ == "TokenSample" for e in written.events) > 40      # chunks' dropped ones too
    direct, folded = taken_directly.timeline, as_events.timeline
    assert direct.itl() == folded.itl()
    assert [(r.first_token_step, r.last_token_step, r.num_tokens) for r in direct.requests.values()] == \
        [(r.first_token_step, r.last_token_step, r.num_tokens) for r in folded.requests.values()]


def test_a_fleets_live_fold_keeps_block_and_token_events_only_for_a_writer_behind_it():
    from tracengine.fleet.engine import fleet_header
    from tracengine.fleet.spec import FleetSpec
    from tracengine.fleet.stats import FleetTimelines
    from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime
    timing = LinearStepTime({phase: {part: [1000.0] * len(FEATURES) for part in PARTS}
                             for phase in ("prefill", "decode", "mixed")})
    header = fleet_header(Config(num_kvcache_blocks=16, kvcache_block_size=4), timing, FleetSpec(2, "round_robin"))
    alone, written = FleetTimelines(header, lean=True), FleetTimelines(header, ListSink(), lean=True)
    # with no writer behind, each replica's engine has its timeline's own sink, which takes kept tokens
    assert not alone.block_events and alone.replica_sink(0).token_kept == alone.timelines[0].token_kept
    assert written.block_events and written.replica_sink(0) is written and getattr(written, "token_kept", None) is None
