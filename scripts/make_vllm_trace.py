"""Writes traces/vllm.trace: vLLM's own V1 scheduler (the installed vLLM, run on the CPU
with fabricated model outputs, tracengine/vllm/drive.py) recorded by
tracengine.vllm.RecordingScheduler. 12 requests sharing a 32-token prefix in
24 blocks of 16 with a budget of 64 tokens: chunked prefill, mixed steps,
prefix-cache hits, preemptions, an abort, EOS and length finishes. Kept: its
re-execution needs the vLLM it names (tests/test_vllm.py), the commands that
read it (tests/test_vllm_trace.py) need no vLLM.

    python scripts/make_vllm_trace.py [OUT]
    python scripts/make_vllm_trace.py --hybrid [OUT]

--hybrid writes traces/vllm_hybrid.trace: a hybrid model's KV cache (a full-attention group, a
sliding-window group of 64 tokens and a Mamba group, one pool of 48 blocks of 16), 12 requests
sharing a 64-token prefix, one every two steps, async scheduling: window and Mamba blocks given back as requests run
(BlockSkip), preemptions, prefix-cache hits in every group.
"""
import collections
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracengine.trace.tracelog import TraceWriter, open_trace  # noqa: E402

PREFIX = list(range(100, 132))


def main(out: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from tracengine.vllm.build import build_scheduler, default_config
        from tracengine.vllm.header import trace_header
        from tracengine.vllm.drive import RequestSpec, run
    scheduler = build_scheduler(default_config(num_gpu_blocks=24, max_num_batched_tokens=64, max_num_seqs=8))
    header = trace_header(scheduler)
    scheduler.record_to(TraceWriter(out, header), header.created_at)
    specs = [RequestSpec(f"chatcmpl-{i}", PREFIX + [i] * (16 + 8 * i), 20, arrival_step=2 * i,
                         eos_after=5 if i % 4 == 1 else 0) for i in range(12)]
    run(scheduler, specs, aborts={14: ["chatcmpl-6"]})
    scheduler.shutdown()
    counts = collections.Counter(type(e).__name__ for e in open_trace(out))
    print(f"{out}: vLLM {header.engine_version}, {dict(counts)}")


def hybrid_groups(spec):
    """The groups of a hybrid model beside `spec`, the full-attention group: a sliding window of 64
    tokens and a Mamba group (vLLM 0.33's kv_cache_interface)."""
    import torch
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec, SlidingWindowSpec
    window = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32, sliding_window=64)
    mamba = MambaSpec(block_size=16, shapes=((4, 64),), dtypes=(torch.float32,), mamba_cache_mode="align")
    return [KVCacheGroupSpec(["full"], spec), KVCacheGroupSpec(["window"], window),
            KVCacheGroupSpec(["mamba.0", "mamba.1"], mamba)]


def main_hybrid(out: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from tracengine.vllm.build import build_scheduler, default_config
        from tracengine.vllm.header import trace_header
        from tracengine.vllm.drive import RequestSpec, run
    config = default_config(num_gpu_blocks=48, max_num_batched_tokens=64, max_num_seqs=16, scheduler_kind="async")
    scheduler = build_scheduler(config, kv_cache_groups=hybrid_groups)
    header = trace_header(scheduler)
    scheduler.record_to(TraceWriter(out, header), header.created_at)
    specs = [RequestSpec(f"chatcmpl-{i}", list(range(100, 164)) + [i] * (20 + 5 * i), 48, arrival_step=2 * i,
                         eos_after=30 if i % 4 == 1 else 0) for i in range(12)]
    run(scheduler, specs)
    scheduler.shutdown()
    counts = collections.Counter((type(e).__name__, getattr(e, "group", None)) for e in open_trace(out))
    print(f"{out}: vLLM {header.engine_version}, {dict(counts)}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--hybrid"]
    traces = Path(__file__).resolve().parents[1] / "traces"
    if "--hybrid" in sys.argv[1:]:
        main_hybrid(Path(args[0]) if args else traces / "vllm_hybrid.trace")
    else:
        main(Path(args[0]) if args else traces / "vllm.trace")
