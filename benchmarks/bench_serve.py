"""`tracengine serve` under `bench-serve` load: the embedded tiny Qwen3 on the
CPU, served by a `tracengine serve` process, sent a synthetic workload with
Poisson arrivals at several rates by the bench-serve client (in this process).

1. Client and trace, side by side: for each rate, the client-side figures
   (TTFT, TPOT, ITL, E2E, completion tokens/s) beside `tracengine stats` of the
   trace the server recorded of the same run. They differ by the HTTP path:
   the trace's clock starts when the request reached the server's handler
   and stops when the step that sampled the token ended; the client's starts
   before it sends and stops when the SSE chunk is read. The table prints the
   differences (client - trace).
2. Recording overhead: the same load at saturation (every request at 0) on a
   server without and with --record (frames written stored inside the step;
   the trace compacted when the server stops, after the load). Runs alternate
   so drift hits each alike; medians of the completion-token throughput and
   of the server's CPU per token compared. Then in-process, with the same
   engine: the time the step loop spends in the sink at each StepEnd, for the
   writer before (deflating each frame in the step) and the writer now,
   against the step's duration, and the writer's close (the compaction) per
   frame.

    python benchmarks/bench_serve.py [--num-prompts 48] [--rates 4,16,inf] [--repeats 3]
"""
import argparse
import asyncio
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from tracengine.analysis.stats import stats  # noqa: E402
from tracengine.serve.bench import figures, run_benchmark  # noqa: E402
from tracengine.trace.events import RequestAdded, StepEnd  # noqa: E402
from tracengine.trace.tracelog import open_trace  # noqa: E402
from tracengine.workload.arrivals import arrival_times  # noqa: E402
from tracengine.workload.formats import Request  # noqa: E402

ENGINE_FLAGS = ["--max-model-len", "512", "--max-num-seqs", "32"]
VOCAB = 1024


def workload(num_prompts: int, rate: float, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    times = arrival_times(num_prompts, rate, 1.0, seed)
    return [Request([rng.randrange(1, VOCAB) for _ in range(rng.randint(32, 128))], rng.randint(32, 64), t,
                    temperature=0.0, ignore_eos=True) for t in times]


class Server:
    """A `tracengine serve` process on a free port; stopped with SIGTERM."""

    def __init__(self, *flags: str):
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tracengine.cli", "serve", "--port", "0", *ENGINE_FLAGS,
                                      *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if "http://" not in line:
            self.proc.kill()
            raise SystemExit(f"the server did not start: {line!r} {self.proc.communicate()[1]}")
        self.url = line.split(" on ")[1].split()[0]

    def cpu_s(self) -> float:
        """CPU seconds the server has used (all its threads), from /proc."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=120)
        if self.proc.returncode != 0:
            raise SystemExit(f"the server exited {self.proc.returncode}: {err}")


def bench(url: str, requests: list[Request]) -> dict:
    results, duration = asyncio.run(run_benchmark(url, requests, "embedded"))
    f = figures(results, duration)
    if f["num_failed"]:
        raise SystemExit(f"{f['num_failed']} requests failed: {f['errors']}")
    return f


def trace_window_s(path) -> float:
    """First arrival to the end of the last step, on the trace's own clock."""
    first, t = None, 0
    for e in open_trace(path):
        if type(e) is RequestAdded and first is None:
            first = e.arrival_ns
        elif type(e) is StepEnd:
            t += e.gap_ns + e.schedule_ns + e.model_ns + e.postprocess_ns
    return (t - first) / 1e9


def side_by_side(args, tmp: Path):
    print(f"1. client (bench-serve) and trace (tracengine stats) of the same run: {args.num_prompts} requests, "
          "32-128 prompt tokens, 32-64 greedy tokens (EOS ignored), Poisson arrivals\n")
    head = f"{'rate':>6} {'figure':<22}{'client':>12}{'trace':>12}{'client-trace':>14}"
    print(head)
    print("-" * len(head))
    for rate in args.rates:
        path = tmp / f"rate-{rate}.trace"
        server = Server("--record", str(path))
        try:
            f = bench(server.url, workload(args.num_prompts, rate))
        finally:
            server.stop()
        s = stats(str(path))
        lat = s["latency"]
        window = trace_window_s(path)
        rows = [("TTFT mean ms", f["ttft_ms"]["mean"], lat["ttft"]["seconds"]["mean"] * 1e3),
                ("TTFT p50 ms", f["ttft_ms"]["p50"], lat["ttft"]["seconds"]["p50"] * 1e3),
                ("TTFT p99 ms", f["ttft_ms"]["p99"], lat["ttft"]["seconds"]["p99"] * 1e3),
                ("TPOT mean ms", f["tpot_ms"]["mean"], lat["tpot"]["seconds"]["mean"] * 1e3),
                ("ITL p50 ms", f["itl_ms"]["p50"], lat["itl"]["seconds"]["p50"] * 1e3),
                ("E2E mean ms", f["e2e_ms"]["mean"], lat["e2e"]["seconds"]["mean"] * 1e3),
                ("E2E p99 ms", f["e2e_ms"]["p99"], lat["e2e"]["seconds"]["p99"] * 1e3),
                ("completion tok/s", f["output_token_throughput"], s["tokens"]["num_completion_tokens"] / window),
                ("requests/s", f["request_throughput"], s["requests"]["num_finished"] / window)]
        label = "inf" if math.isinf(rate) else f"{rate:g}"
        for name, client, trace in rows:
            print(f"{label:>6} {name:<22}{client:>12.2f}{trace:>12.2f}{client - trace:>+14.2f}")
            label = ""
        print(f"{'':>6} {'steps, preemptions':<22}{'':>12}{s['steps']['num_steps']:>12}"
              f"{s['preemption']['num_preemptions']:>14}")
        print()


def recording_overhead(args, tmp: Path):
    print(f"2. recording overhead at saturation: {args.num_prompts} requests at once, {args.repeats} alternating "
          "rounds\n")
    variants = {"no --record": [], "--record": ["--record", "{path}"]}
    throughput = {name: [] for name in variants}
    cpu_per_token = {name: [] for name in variants}
    requests = workload(args.num_prompts, math.inf, seed=1)
    for r in range(args.repeats):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            flags = [flag.format(path=tmp / f"overhead-{r}-{list(variants).index(name)}.trace")
                     for flag in variants[name]]
            server = Server(*flags)
            try:
                bench(server.url, requests[:4])                      # warm-up, not counted
                cpu = server.cpu_s()
                f = bench(server.url, requests)
                cpu_per_token[name].append((server.cpu_s() - cpu) / f["num_completion_tokens"])
                throughput[name].append(f["output_token_throughput"])
            finally:
                server.stop()
    base, base_cpu = statistics.median(throughput["no --record"]), statistics.median(cpu_per_token["no --record"])
    for name, values in throughput.items():
        median, cpu = statistics.median(values), statistics.median(cpu_per_token[name])
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {name:<32} {median:7.1f} completion tok/s ({median / base - 1:+6.1%}), server CPU "
              f"{cpu * 1e3:.3f} ms/token ({cpu / base_cpu - 1:+6.1%})   tok/s runs: {runs}")
    print("  (medians; CPU is the server process's, all threads, over the measured load)")
    print()
    in_step_cost(args, tmp)


def in_step_cost(args, tmp: Path):
    """The step loop's time inside the sink at StepEnd (where a frame is written), for the writer
    before (deflating in the step) and the writer now; and the writer's close (the compaction),
    per frame."""
    from bench_record_overhead import InStepDeflateTraceWriter
    from tracengine.engine.llm import LLM
    from tracengine.engine.sampling_params import SamplingParams
    from tracengine.trace import tracelog
    import torch
    torch.set_num_threads(1)
    llm = LLM("", max_model_len=512, max_num_seqs=32)
    requests = workload(args.num_prompts, math.inf, seed=2)
    prompts = [r.prompt for r in requests]
    sps = [SamplingParams(0.0, r.max_tokens, True) for r in requests]
    writers = {"before: deflated inside the step": InStepDeflateTraceWriter,
               "now: stored inside the step": tracelog.TraceWriter}
    print("  in the step loop (the same engine, in process, torch on one thread): time in the sink's StepEnd")
    results = {name: [] for name in writers}
    for r in range(args.repeats):
        for name in (list(writers) if r % 2 == 0 else list(reversed(writers))):
            original, tracelog.TraceWriter = tracelog.TraceWriter, writers[name]
            try:
                llm.start_recording(str(tmp / f"step-cost-{list(writers).index(name)}-{r}.trace"))
            finally:
                tracelog.TraceWriter = original
            writer = llm.writer
            spent, num_frames = [0], [0]

            class Clocked:
                enabled = True

                def emit(self, event, _emit=writer.emit):
                    if type(event) is StepEnd:
                        t = time.perf_counter_ns()
                        _emit(event)
                        spent[0] += time.perf_counter_ns() - t
                        num_frames[0] += 1
                    else:
                        _emit(event)
            llm.set_sink(Clocked())
            start = time.perf_counter_ns()
            for prompt, sp in zip(prompts, sps):
                llm.add_request(prompt, sp)
            while not llm.is_finished():
                llm.step()
            elapsed = time.perf_counter_ns() - start
            llm.writer = writer
            start = time.perf_counter_ns()
            llm.stop_recording()
            close_ns = time.perf_counter_ns() - start
            results[name].append((spent[0] / num_frames[0], elapsed / llm.num_steps, close_ns / num_frames[0]))
    for name, runs in results.items():
        per_frame = statistics.median(a for a, _, _ in runs)
        per_step = statistics.median(b for _, b, _ in runs)
        close = statistics.median(c for _, _, c in runs)
        print(f"  {name:<36} {per_frame / 1e3:7.1f} us per StepEnd, {per_frame / per_step:6.2%} of a "
              f"{per_step / 1e6:.2f} ms step; close {close / 1e3:5.1f} us per frame")
    llm.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--rates", default="4,16,inf")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        side_by_side(args, Path(tmp))
        if not args.skip_overhead:
            recording_overhead(args, Path(tmp))


if __name__ == "__main__":
    main()
