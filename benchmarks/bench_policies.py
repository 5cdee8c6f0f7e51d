"""The real engine under both built-in scheduling policies, side by side.

    python benchmarks/bench_policies.py [--rounds 3] [--rate 8] [--num-requests 32]

Two workloads on the embedded tiny Qwen3 (CPU unless a GPU is there):

- default: `tracengine generate`'s built-in mix (14 requests, all at once; 48
  blocks of 16, budget 256, 8 sequences);
- poisson: `--num-requests` synthetic requests (prompts of 32-384 tokens,
  16-64 output tokens) arriving as a Poisson process of `--rate` requests/s
  (vLLM's benchmark arrivals, workload/arrivals.py), 64 blocks of 16, budget 128.

For each, prefill_first and mixed run alternately `--rounds` times on one
engine per policy; the figures are `tracengine stats`' of each run (the median
over rounds): completion tokens/s (wall clock) and per CPU second of this
process (what a shared machine's load changes least), TTFT p50/p99, ITL
p50/p99, TPOT p50/p99 in ms and in steps, preemptions, and the steps of each
phase (prefill/decode/mixed). Sampling is seeded per request, so
both policies must produce the same tokens (checked)."""
import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tracengine import LLM, SamplingParams                        # noqa: E402
from tracengine.workload.arrivals import arrival_times             # noqa: E402
from tracengine.workload.sources import DEFAULT_CONFIG, default_workload  # noqa: E402

POLICIES = ("prefill_first", "mixed")


def default_mix():
    rng = random.Random(0)
    prompts, sps = default_workload(rng, lambda max_tokens, ignore_eos=False: SamplingParams(
        temperature=1.0, max_tokens=max_tokens, ignore_eos=ignore_eos))
    return DEFAULT_CONFIG, prompts, sps, None


def poisson(num_requests: int, rate: float):
    rng = random.Random(1)
    prompts = [[rng.randrange(1, 1000) for _ in range(rng.randint(32, 384))] for _ in range(num_requests)]
    sps = [SamplingParams(temperature=1.0, max_tokens=rng.randint(16, 64), ignore_eos=True, seed=i)
           for i in range(num_requests)]
    config = dict(kvcache_block_size=16, num_kvcache_blocks=64, max_num_batched_tokens=128, max_num_seqs=8)
    return config, prompts, sps, arrival_times(num_requests, rate, 1.0, seed=1)


def figures(s: dict, cpu_s: float) -> dict:
    lat, st = s["latency"], s["steps"]
    return {
        "tok/s": s["throughput"]["completion_tokens_per_s"],
        "tok/CPU-s": s["tokens"]["num_completion_tokens"] / cpu_s,
        "TTFT p50 ms": lat["ttft"]["seconds"]["p50"] * 1e3, "TTFT p99 ms": lat["ttft"]["seconds"]["p99"] * 1e3,
        "ITL p50 ms": lat["itl"]["seconds"]["p50"] * 1e3, "ITL p99 ms": lat["itl"]["seconds"]["p99"] * 1e3,
        "TPOT p50 ms": lat["tpot"]["seconds"]["p50"] * 1e3, "TPOT p99 ms": lat["tpot"]["seconds"]["p99"] * 1e3,
        "TTFT p50 steps": lat["ttft"]["steps"]["p50"], "TTFT p99 steps": lat["ttft"]["steps"]["p99"],
        "ITL p99 steps": lat["itl"]["steps"]["p99"],
        "TPOT p50 steps": lat["tpot"]["steps"]["p50"], "TPOT p99 steps": lat["tpot"]["steps"]["p99"],
        "preemptions": s["preemption"]["num_preemptions"],
        "steps p/d/m": f"{st['num_prefill_steps']}/{st['num_decode_steps']}/{st['num_mixed_steps']}",
    }


def bench(name, workload, rounds):
    config, prompts, sps, arrivals = workload
    engines = {policy: LLM("", scheduling_policy=policy, **config) for policy in POLICIES}
    runs = {policy: [] for policy in POLICIES}
    tokens = {}
    try:
        for _ in range(rounds):
            for policy in POLICIES:
                llm = engines[policy]
                llm.reset()
                cpu = time.process_time()
                outputs = llm.generate(prompts, sps, use_tqdm=False, summary=True, arrival_ns=[round(t * 1e9) for t in arrivals])
                cpu = time.process_time() - cpu
                tokens[policy] = [o["token_ids"] for o in outputs]
                runs[policy].append(figures(llm.last_run, cpu))
    finally:
        for llm in engines.values():
            llm.close()
    same = tokens["prefill_first"] == tokens["mixed"]
    print(f"\n{name}: {len(prompts)} requests, config {config}"
          + (f", Poisson arrivals over {arrivals[-1]:.2f} s" if arrivals else ", all at once")
          + f"; median of {rounds} rounds; tokens identical under both policies: {'yes' if same else 'NO'}")
    keys = list(runs["prefill_first"][0])
    print(f"{'':16}" + "".join(f"{policy:>15}" for policy in POLICIES) + f"{'mixed/first':>13}")
    for key in keys:
        values = []
        for policy in POLICIES:
            column = [r[key] for r in runs[policy]]
            values.append(statistics.median(column) if not isinstance(column[0], str) else column[0])
        ratio = f"{values[1] / values[0]:.2f}x" if not isinstance(values[0], str) and values[0] else ""
        print(f"{key:16}" + "".join(f"{v:>15.1f}" if not isinstance(v, str) else f"{v:>15}" for v in values)
              + f"{ratio:>13}")
    return same


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=8.0, help="Poisson requests/s (default 8)")
    parser.add_argument("--num-requests", type=int, default=32)
    args = parser.parse_args()
    ok = bench("default", default_mix(), args.rounds)
    ok &= bench("poisson", poisson(args.num_requests, args.rate), args.rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
