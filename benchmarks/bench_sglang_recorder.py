"""The recorder's overhead on SGLang's scheduler step: the same workload through SGLang 0.5.23's
real Scheduler on the CPU (tracengine/sglang/drive.py: its normal or overlap loop, a stand-in worker),
side by side in one run:

  idle       the scheduler with tracengine's hooks installed, not recording
  recording  the same, writing a trace (frames stored; the compaction at close is off the step path)

Repetitions alternate so drift hits both alike; medians of this process's CPU time per step
over the driven loop (get_next_batch_to_run, run_batch with the stand-in, process_batch_result).

    python benchmarks/bench_sglang_recorder.py [--repeats 5] [--requests 48] [--loop overlap]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one_run(config, specs, record: bool) -> tuple[float, int]:
    from tracengine.sglang.build import build_scheduler
    from tracengine.sglang.drive import Tokens, run
    from tracengine.sglang.header import trace_header
    from tracengine.sglang.recorder import record_to, stop_recording
    from tracengine.trace.tracelog import TraceWriter
    scheduler = build_scheduler(config, Tokens(specs))
    with tempfile.TemporaryDirectory() as tmp:
        if record:
            header = trace_header(scheduler)
            record_to(scheduler, TraceWriter(os.path.join(tmp, "run.trace"), header, deflate=False), header.created_at)
        cpu = time.process_time()
        num_steps = run(scheduler, specs)
        cpu = time.process_time() - cpu
        stop_recording(scheduler)
    return cpu, num_steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--loop", choices=("normal", "overlap"), default="normal",
                        help="SGLang's loop: normal, or overlap (a batch in flight; frames written whole)")
    args = parser.parse_args()
    from tracengine.sglang.build import default_config
    from tracengine.sglang.drive import RequestSpec
    specs = [RequestSpec(f"r{i}", [5] * 64 + [i] * (40 + i % 200), 64, arrival_step=i) for i in range(args.requests)]
    config = default_config(max_total_tokens=4096, chunked_prefill_size=256, max_running_requests=16,
                            scheduler_loop=args.loop)
    per_step = {False: [], True: []}
    num_steps = 0
    for rep in range(args.repeats):
        for record in ((False, True) if rep % 2 == 0 else (True, False)):
            cpu, num_steps = one_run(config, specs, record)
            per_step[record].append(cpu / num_steps * 1e6)
    idle, recording = statistics.median(per_step[False]), statistics.median(per_step[True])
    print(f"{args.loop} loop: {args.requests} requests, {num_steps} steps, {args.repeats} alternating repeats, "
          f"median CPU us/step: idle {idle:,.0f}, recording {recording:,.0f} "
          f"({recording / idle:.2f}x, +{recording - idle:,.0f} us a step)")


if __name__ == "__main__":
    main()
