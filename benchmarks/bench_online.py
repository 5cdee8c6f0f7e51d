"""Online serving curve: the real engine (the embedded tiny Qwen3 on the CPU)
on one Poisson workload at several request rates, from light load to past
saturation, as vLLM's serving benchmark draws it. Each rate is one recorded
run of the same requests (same prompts and output lengths, arrivals from the
gamma process of `tracengine generate --request-rate`); its figures are
`tracengine stats` of that trace: measured request throughput over the run,
TTFT p50/p99 and TPOT p50 from each request's arrival, preemptions, and
goodput under the SLOs given.

The rates default to multiples of the offline throughput measured first
(every request at t=0), so the curve has the same shape on a faster machine;
they go past it, since requests spread over time preempt less than a batch
that arrives at once and so can be served faster than it.

    python benchmarks/bench_online.py [--num-requests 64] [--rates 2,4,8,16] [--slo ttft=1s --slo tpot=50ms]
"""
import argparse
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracengine.analysis.stats import parse_slo, stats  # noqa: E402
from tracengine.engine.llm import LLM  # noqa: E402
from tracengine.engine.sampling_params import SamplingParams  # noqa: E402
from tracengine.workload import arrival_times  # noqa: E402
from tracengine.workload.sources import parse_range  # noqa: E402

# 48 blocks of 16 tokens hold about 5 of these requests at full length while up to 16 run:
# past saturation decode runs out of blocks and preempts.
CONFIG = dict(kvcache_block_size=16, num_kvcache_blocks=48, max_num_batched_tokens=1024, max_num_seqs=16, seed=0)
LOAD_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)


def build_workload(num_requests: int, input_len: str, output_len: str, vocab_size: int, seed: int):
    rng = random.Random(seed)
    (in_low, in_high), (out_low, out_high) = parse_range(input_len, "--input-len"), parse_range(output_len, "--output-len")
    prompts = [[rng.randrange(1, vocab_size) for _ in range(rng.randint(in_low, in_high))] for _ in range(num_requests)]
    params = [SamplingParams(temperature=0.0, max_tokens=rng.randint(out_low, out_high), ignore_eos=True)
              for _ in prompts]
    return prompts, params


def run(llm, prompts, params, times, path, slo) -> dict:
    start = time.perf_counter()
    llm.generate(prompts, params, record=path, use_tqdm=False, arrival_ns=[round(t * 1e9) for t in times])
    wall_s = time.perf_counter() - start
    s = stats(path, slo or None)
    lat = s["latency"]
    return {"wall_s": wall_s, "requests_per_s": s["throughput"]["requests_per_s"],
            "ttft_p50": lat["ttft"]["seconds"]["p50"], "ttft_p99": lat["ttft"]["seconds"]["p99"],
            "tpot_p50": lat["tpot"]["seconds"]["p50"], "queueing_p50": lat["queueing"]["seconds"]["p50"],
            "num_preemptions": s["preemption"]["num_preemptions"], "idle_s": s["steps"]["idle_s"],
            "total_s": s["steps"]["total_s"],
            "goodput": s["goodput"]["requests_per_s"] if s["goodput"] else None,
            "good_share": s["goodput"]["good_request_share"] if s["goodput"] else None}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--input-len", default="32:160")
    p.add_argument("--output-len", default="16:64")
    p.add_argument("--rates", help="comma-separated request rates (default: multiples of the measured offline throughput)")
    p.add_argument("--burstiness", type=float, default=1.0, help="1: Poisson (default)")
    p.add_argument("--slo", action="append", default=[], help="e.g. ttft=1s, tpot=50ms (default: those two)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, for a shared machine)")
    args = p.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    slo = dict(parse_slo(text) for text in (args.slo or ["ttft=1s", "tpot=50ms"]))

    llm = LLM(**CONFIG)
    prompts, params = build_workload(args.num_requests, args.input_len, args.output_len, llm.hf_config.vocab_size,
                                     args.seed)
    print(f"embedded tiny Qwen3 on {llm.runner.device}, {args.threads} torch thread(s); "
          f"{CONFIG['num_kvcache_blocks']} KV blocks x {CONFIG['kvcache_block_size']}, "
          f"max {CONFIG['max_num_seqs']} seqs, budget {CONFIG['max_num_batched_tokens']}")
    print(f"{args.num_requests} requests, prompts {args.input_len} tokens, outputs {args.output_len} "
          f"(ignore_eos, greedy), gamma arrivals burstiness {args.burstiness}, seed {args.seed}; "
          f"SLO {', '.join(f'{k} <= {v * 1e3:g} ms' for k, v in slo.items())}")
    with tempfile.TemporaryDirectory() as tmp:
        llm.generate(prompts[:8], params[:8], use_tqdm=False)            # warm-up, not measured
        results = []
        offline = run(llm, prompts, params, None, os.path.join(tmp, "inf.trace"), slo)
        if args.rates:
            rates = [float(r) for r in args.rates.split(",")]
        else:
            rates = [round(f * offline["requests_per_s"], 2) for f in LOAD_FRACTIONS]
        for rate in rates:
            times = arrival_times(args.num_requests, rate, args.burstiness, args.seed)
            results.append((rate, run(llm, prompts, params, times, os.path.join(tmp, f"{rate}.trace"), slo)))
        results.append((math.inf, offline))
    llm.close()

    print(f"\n{'rate':>7} {'load':>5} {'req/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} "
          f"{'queue p50':>9} {'preempt':>7} {'idle s':>7} {'run s':>6} {'goodput':>8} {'good':>5}")
    for rate, r in results:
        load = rate / offline["requests_per_s"]
        print(f"{rate:>7.2f} {load:>5.2f} {r['requests_per_s']:>7.2f} {r['ttft_p50'] * 1e3:>7.1f}ms "
              f"{r['ttft_p99'] * 1e3:>7.1f}ms {r['tpot_p50'] * 1e3:>7.2f}ms {r['queueing_p50'] * 1e3:>7.1f}ms "
              f"{r['num_preemptions']:>7} {r['idle_s']:>7.2f} {r['total_s']:>6.2f} {r['goodput']:>8.2f} "
              f"{r['good_share']:>5.0%}")
    print("\nrate: offered requests/s (inf: every request at t=0, the offline batch); load: rate / the offline "
          "req/s;\nreq/s: finished requests over the run (its start to the last step's end); TTFT, TPOT and "
          "queueing\nfrom each request's arrival; goodput: requests/s meeting every SLO; good: their share.")


if __name__ == "__main__":
    main()
