"""A disaggregated fleet's decode replicas folded with the blocks their KV transfers take in
(replay/fold_transfer.py): `check` folds every replica of a P/D trace, and the TUI's
blocks view of a decode replica shows the transferred blocks (docs/cluster.md)."""
import json

import msgspec
import pytest

from tracengine.analysis.fleet import replica_streams
from tracengine.cli.main import main
from tracengine.sim.fleet import FleetSpec, simulate_fleet
from tracengine.trace.events import ScheduleDecision, StepEnd
from test_fleet import CONFIG, fixed_step_time, with_writer, workload

PD = FleetSpec(num_prefill_replicas=1, num_decode_replicas=2, kv_bytes_per_token=64, kv_transfer_gbps=1,
               kv_transfer_latency_ns=200_000)


@pytest.mark.parametrize("config", [CONFIG, CONFIG.replace(scheduling_policy="mixed"),
                                    CONFIG.replace(num_kvcache_blocks=22)],      # transfers that evict, or do not fit
                         ids=["prefill_first", "mixed", "small_cache"])
def test_check_folds_the_decode_replicas_of_a_pd_trace(tmp_path, capsys, config):
    events = simulate_fleet(config, workload(30), fixed_step_time(), PD)
    path = tmp_path / "pd.trace"
    with_writer(path, events)
    assert main(["check", str(path)]) == 0
    assert "whole" in capsys.readouterr().out
    # a decode replica's events are checked, not skipped: its free count one off is found there
    decode_end = next(i for i, e in enumerate(events) if type(e) is StepEnd and i > _first_decode_scope(events))
    planted = list(events)
    planted[decode_end] = msgspec.structs.replace(events[decode_end], num_free_blocks=events[decode_end].num_free_blocks + 1)
    bad = tmp_path / "bad.trace"
    with_writer(bad, planted)
    assert main(["check", str(bad), "--json"]) == 1
    impossible = json.loads(capsys.readouterr().out)["impossible"]
    assert "StepEnd says" in impossible["message"] and "free blocks" in impossible["message"]


def _first_decode_scope(events) -> int:
    from tracengine.trace.events import ReplicaScope
    return next(i for i, e in enumerate(events) if type(e) is ReplicaScope and e.replica >= 1)


class LiveBlocks:
    """A sink that keeps, at each step's end of replica `replica`, its block pool as the live
    block manager holds it (replay/state.live_state)."""
    enabled = True

    def __init__(self, replica: int):
        from tracengine.trace.events import ListSink
        self.replica, self.fleet, self.current, self.states = replica, None, 0, []
        self.inner = ListSink()

    def emit(self, e):
        from tracengine.replay.state import live_state
        from tracengine.trace.events import ReplicaScope
        self.inner.emit(e)
        if type(e) is ReplicaScope:
            self.current = e.replica
        elif type(e) is StepEnd and self.current == self.replica:
            self.states.append(live_state(self.fleet.replicas[self.replica].scheduler, e.step))


def test_the_tui_blocks_view_of_a_decode_replica_is_the_live_block_pool(tmp_path):
    from tracengine.sim.engine import SimulatedEngine
    from tracengine.sim.fleet import Fleet, fleet_header, run_fleet
    from tracengine.sim.runners import SyntheticRunner
    from tracengine.tui.fleet import FleetView
    from tracengine.tui.widgets.block_map import block_kind
    # one decode replica of few sequences and a small cache: transferred requests wait there, and evict
    config, step_time = CONFIG.replace(max_num_seqs=2, num_kvcache_blocks=30), fixed_step_time()
    spec = FleetSpec(num_prefill_replicas=2, num_decode_replicas=1)
    sink = LiveBlocks(2)
    sink.fleet = fleet = Fleet(config, spec, lambda i, c: SimulatedEngine(c, SyntheticRunner(seed=1), step_time,
                                                                       sink), sink)
    run_fleet(fleet, workload(16), step_time)
    path, events = tmp_path / "pd.trace", [fleet_header(config, step_time, spec), *sink.inner.events]
    with_writer(path, events)
    view = FleetView(path)
    index = view.index(2)
    try:
        assert index.num_steps == len(sink.states) > 0
        num_cached = 0
        for live in sink.states:
            state = index.state_at(live.step)
            assert (state.free_block_ids, state.ref_counts, state.hashes, state.hash_to_block_id) == \
                (live.free_block_ids, live.ref_counts, live.hashes, live.hash_to_block_id)
            assert (state.waiting, state.running) == (live.waiting, live.running)
            assert {s: state.seqs[s].block_table for s in live.seqs} == {s: q.block_table for s, q in live.seqs.items()}
            num_cached += sum(block_kind(b, state) == "cached" for b in state.blocks)
        assert num_cached > 0      # the blocks view shows free, cached blocks: those transfers took in
        # the step that took a transfer in says so
        _, streams = replica_streams(events)
        first = next(e.step for e in streams[2] if type(e) is ScheduleDecision)
        assert "prompt KV landed from replica" in index.view_at(first).explanation
    finally:
        index.close()
        view.close()
