"""A disaggregated fleet's decode replicas folded with the blocks their KV transfers take in
(replay/fold_transfer.py): `check` folds every replica of a P/D trace, and the TUI's
blocks view of a decode replica shows the transferred blocks (docs/cluster.md)."""
import json

import msgspec
import pytest

from tracengine.fleet.stats import replica_streams
from tracengine.cli.main import main
from tracengine.fleet.engine import simulate_fleet
from tracengine.fleet.spec import FleetSpec
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
    """A sink that keeps, at each step's end of each replica, its block pool as the live block
    manager holds it (replay/state.live_state), by replica."""
    enabled = True

    def __init__(self):
        from tracengine.trace.sinks import ListSink
        self.fleet, self.current, self.states = None, 0, {}
        self.inner = ListSink()

    def emit(self, e):
        from tracengine.replay.state import live_state
        from tracengine.trace.events import ReplicaScope
        self.inner.emit(e)
        if type(e) is ReplicaScope:
            self.current = e.replica
        elif type(e) is StepEnd:
            scheduler = self.fleet.replicas[self.current].scheduler
            self.states.setdefault(self.current, []).append(live_state(scheduler, e.step))


def run_live(config, spec, requests):
    """(the events, header first, and LiveBlocks' states) of a fleet's run in simulated time."""
    from tracengine.sim.engine import SimulatedEngine
    from tracengine.fleet.engine import Fleet, fleet_header, run_fleet
    from tracengine.sim.runners import SyntheticRunner
    step_time, sink = fixed_step_time(), LiveBlocks()
    sink.fleet = fleet = Fleet(config, spec, lambda i, c: SimulatedEngine(c, SyntheticRunner(seed=1), step_time,
                                                                       sink, policy=c.scheduling_policy), sink,
                                step_time=step_time)
    run_fleet(fleet, requests)
    return [fleet_header(config, step_time, spec), *sink.inner.events], sink.states


def same_pool(state, live) -> bool:
    return ((state.free_block_ids, state.ref_counts, state.hashes, state.hash_to_block_id, state.waiting,
             state.running) == (live.free_block_ids, live.ref_counts, live.hashes, live.hash_to_block_id,
                                live.waiting, live.running)
            and all(state.seqs[s].block_table == q.block_table for s, q in live.seqs.items()))


@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
@pytest.mark.parametrize("num_blocks, seed", [(24, 0), (30, 1), (48, 2)])
def test_every_replicas_fold_is_its_live_block_pool_step_for_step(policy, num_blocks, seed):
    from tracengine.replay.fold import Fold
    config = CONFIG.replace(scheduling_policy=policy, num_kvcache_blocks=num_blocks, max_num_seqs=3)
    events, states = run_live(config, FleetSpec(num_prefill_replicas=1, num_decode_replicas=2), workload(24, seed))
    _, streams = replica_streams(events, transfers=True)
    for replica in (0, 1, 2):
        fold = Fold(streams[replica])
        assert fold.num_steps == len(states[replica]) > 0
        assert all(same_pool(fold.state_at(live.step), live) for live in states[replica])


def test_the_tui_blocks_view_of_a_decode_replica_is_the_live_block_pool(tmp_path):
    from tracengine.tui.fleet_app import FleetView
    from tracengine.tui.widgets.block_map import block_kind
    # one decode replica of few sequences and a small cache: transferred requests wait there, and evict
    events, states = run_live(CONFIG.replace(max_num_seqs=2, num_kvcache_blocks=30),
                              FleetSpec(num_prefill_replicas=2, num_decode_replicas=1), workload(16))
    path = tmp_path / "pd.trace"
    with_writer(path, events)
    view = FleetView(path)
    index = view.index(2)
    try:
        assert index.num_steps == len(states[2]) > 0
        num_cached = 0
        for live in states[2]:
            state = index.state_at(live.step)
            assert same_pool(state, live)
            num_cached += sum(block_kind(b, state) == "cached" for b in state.blocks)
        assert num_cached > 0      # the blocks view shows free, cached blocks: those transfers took in
        # the step that took a transfer in says so
        _, streams = replica_streams(events)
        first = next(e.step for e in streams[2] if type(e) is ScheduleDecision)
        assert "prompt KV landed from replica" in index.view_at(first).explanation
    finally:
        index.close()
        view.close()
