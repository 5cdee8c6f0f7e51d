"""Writes traces/vllm.trace: vLLM's own V1 scheduler (the installed vLLM, run on the CPU
with fabricated model outputs, tracengine/vllm/drive.py) recorded by
tracengine.vllm.RecordingScheduler. 12 requests sharing a 32-token prefix in
24 blocks of 16 with a budget of 64 tokens: chunked prefill, mixed steps,
prefix-cache hits, preemptions, an abort, EOS and length finishes. Kept: its
re-execution needs the vLLM it names (tests/test_vllm.py), the commands that
read it (tests/test_vllm_trace.py) need no vLLM.

    python scripts/make_vllm_trace.py [OUT]
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


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "traces" / "vllm.trace")
