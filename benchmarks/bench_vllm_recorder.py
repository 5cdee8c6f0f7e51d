"""The recorder's overhead on vLLM's scheduler step: the same workload through
vLLM's own Scheduler (vLLM's real KVCacheManager and block pool, on the CPU,
driven as its engine core drives it with fabricated model outputs:
tracengine/vllm/drive.py), side by side in one run:

  plain      vLLM's Scheduler
  idle       tracengine.vllm.RecordingScheduler, not recording (the subclass alone)
  recording  RecordingScheduler writing a trace (frames stored in the step; the
             compaction at close is clocked apart, it is off the step path)

Repetitions alternate (plain, idle, recording, recording, idle, plain, ...) so
drift hits all alike; medians of steps per second (wall clock and this
process's CPU time) are compared. The clocked time is the driven loop: schedule(),
the fabricated output, update_from_output(), steps that vLLM's engine core
would run around a model.

    python benchmarks/bench_vllm_recorder.py [--repeats 7] [--requests 200] [--async] [--speculative]

--speculative: ngram speculative decoding, 3 drafts a step, the driver's made-up drafts (about
three in four right: tracengine/vllm/spec.py), recorded as SpecDraft, SpecDecode, SpecAccepted.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
    from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from tracengine.trace.tracelog import TraceWriter  # noqa: E402
from tracengine.vllm.build import build_scheduler, default_config  # noqa: E402
from tracengine.vllm.header import trace_header
from tracengine.vllm.drive import RequestSpec, run  # noqa: E402

PREFIX = list(range(100, 164))     # 4 blocks of 16 shared by every request


def workload(num_requests: int) -> list[RequestSpec]:
    """Prompts of 64 shared + 32..400 own tokens, 16..128 output tokens, arriving 2 per step."""
    return [RequestSpec(f"r{i}", PREFIX + [i % 997] * (32 + (i * 37) % 369), 16 + (i * 53) % 113,
                        arrival_step=i // 2, eos_after=0) for i in range(num_requests)]


def one_run(kind: str, config: dict, specs, directory: str) -> tuple[int, float, float, float]:
    """(steps, wall s, cpu s, compaction s) of one run of `kind`."""
    plain_cls = AsyncScheduler if config["scheduler_kind"] == "async" else Scheduler
    scheduler = build_scheduler(config, plain_cls if kind == "plain" else None)
    if kind == "recording":
        header = trace_header(scheduler)
        path = os.path.join(directory, "run.trace")
        if os.path.exists(path):
            os.remove(path)
        scheduler.record_to(TraceWriter(path, header), header.created_at)
    wall, cpu = time.perf_counter(), time.process_time()
    num_steps = run(scheduler, specs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    close = time.perf_counter()
    scheduler.shutdown()
    return num_steps, wall, cpu, time.perf_counter() - close


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--async", dest="is_async", action="store_true", help="AsyncScheduler (production's)")
    parser.add_argument("--speculative", action="store_true", help="ngram speculative decoding, 3 drafts")
    args = parser.parse_args()
    speculative = dict(speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                       prompt_lookup_max=3) if args.speculative else {}
    config = default_config(num_gpu_blocks=512, max_num_batched_tokens=512, max_num_seqs=64,
                            scheduler_kind="async" if args.is_async else "sync", **speculative)
    specs = workload(args.requests)
    kinds = ["plain", "idle", "recording"]
    results = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory() as directory:
        one_run("recording", config, specs, directory)      # warm: imports, first allocations
        for r in range(args.repeats):
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                results[kind].append(one_run(kind, config, specs, directory))
    num_steps = results["plain"][0][0]
    assert all(res[0] == num_steps for runs in results.values() for res in runs), "a run scheduled differently"
    print(f"vLLM {config['scheduler_kind']} scheduler{', ngram drafts' if speculative else ''}, "
          f"{args.requests} requests, {num_steps} steps, "
          f"{args.repeats} alternating repeats (medians)")
    median = {kind: (statistics.median(num_steps / r[1] for r in runs), statistics.median(num_steps / r[2] for r in runs))
              for kind, runs in results.items()}
    for kind in kinds:
        wall, cpu = median[kind]
        print(f"  {kind:<10} {wall:8,.0f} steps/s wall  {cpu:8,.0f} steps/s cpu   "
              f"x{median['plain'][0] / wall:.2f} / x{median['plain'][1] / cpu:.2f} of plain's step time")
    close = statistics.median(r[3] for r in results["recording"])
    print(f"  the recording's close (end frame and compaction): {close * 1000:.1f} ms median")


if __name__ == "__main__":
    main()
