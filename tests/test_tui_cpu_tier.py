"""The TUI's CPU tier panel beside the KV block map: at every step it shows what the fold says
the tier holds, the loads in flight, and what the step stored, evicted, hit and loaded."""
from tracengine.engine.request import Request
from tracengine.replay.fold import Fold
from tracengine.sim.runners import SyntheticRunner, run_workload
from tracengine.trace.events import CpuHit, CpuLoad, CpuStore
from tracengine.trace.sinks import ListSink
from tracengine.trace.tracelog import write_trace
from tracengine.tui.app import TraceApp
from tracengine.tui.trace_index import TraceIndex
from tracengine.tui.widgets.block_map import BlockMap
from tracengine.tui.widgets.cpu_tier import CpuTierPanel
from test_cpu_tier import EOS, tier_config

A = list(range(1, 13))
# A's 3 blocks stored; B's 4 evict them from a tier of 4; C (A's prompt again) hits in a tier of 8
REQUESTS = [Request(A, 1), Request(list(range(100, 116)), 4, arrival_step=3), Request(A + [50], 2, arrival_step=12)]


def recorded(path, num_cpu_blocks: int):
    write_trace(path, run_workload(tier_config(num_cpu_blocks), REQUESTS, SyntheticRunner(eos=EOS), sink=ListSink()))
    return path


async def test_the_cpu_tier_panel_shows_the_folds_tier_at_each_step(tmp_path):
    path = recorded(tmp_path / "tier.trace", 8)
    fold = Fold.from_trace(path)
    app = TraceApp(TraceIndex(path))
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(CpuTierPanel)
        assert panel.capacity == 8
        assert panel.region.x > app.query_one(BlockMap).region.x        # beside the KV map, to its right
        for step in range(fold.num_steps):
            app.go(step)
            await pilot.pause()
            state, events = fold.state_at(step), fold.events_at(step)
            lines = panel.lines()
            assert lines[0].startswith(f"held   {state.cpu.num_blocks:,} of 8 blocks")
            assert lines[1].startswith(f"loads in flight  {len(state.cpu.loading)} ")
            for seq_id, (first, n) in state.cpu.loading.items():
                assert f"  s{seq_id}  blocks {first}–{first + n - 1}" in lines
            stored = sum(len(e.hashes) for e in events if type(e) is CpuStore)
            evicted = sum(len(e.evicted) for e in events if type(e) is CpuStore)
            hit = sum(len(e.hashes) for e in events if type(e) is CpuHit)
            assert f"this step  stored {stored:,}, evicted {evicted:,}" in lines
            assert any(line.strip().startswith(f"hit {hit:,} in {sum(type(e) is CpuHit for e in events)} loads, "
                                               f"{sum(type(e) is CpuLoad for e in events)} ended") for line in lines)
        hit_step = next(s for s in range(fold.num_steps) if any(type(e) is CpuHit for e in fold.events_at(s)))
        app.go(hit_step)
        await pilot.pause()
        assert "loads in flight  1 (2 blocks)" in panel.lines() and "hit 2 in 1 loads, 0 ended" in \
            " ".join(panel.lines())


async def test_a_trace_without_a_tier_has_no_tier_panel(tmp_path):
    path = recorded(tmp_path / "none.trace", 8)
    no_tier = tmp_path / "no_tier.trace"
    write_trace(no_tier, run_workload(tier_config(8).replace(kv_offloading_size=0.0), REQUESTS,
                                      SyntheticRunner(eos=EOS), sink=ListSink()))
    app = TraceApp(TraceIndex(no_tier))
    async with app.run_test(size=(120, 40)):
        assert not app.query(CpuTierPanel)
    assert path.exists()
