"""The routers compared on one workload: the table of docs/cluster.md.

A Mooncake-format workload made here with the conversation trace's statistics
(benchmarks/bench_simulate.py's mooncake_like: 1,000 requests, mean prompt about 13,900
tokens, conversations whose turns extend the turn before), its arrivals TIME_SCALE times
faster so that the replicas are loaded; a roofline of a Qwen3-8B-shaped model on an H200,
the `mixed` policy (vLLM V1), 16-token blocks, NUM_BLOCKS blocks a replica. Each router at 4
and 8 replicas: TTFT p50 and p99, the prefix cache's token hit rate, the request imbalance
(the busiest replica's requests over the mean) and the fleet's duration.

    python benchmarks/bench_routers.py [--requests 1000] [--replicas 4,8]"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_simulate import QWEN3_8B, mooncake_like                 # noqa: E402
from tracengine.fleet.stats import fleet_stats                  # noqa: E402
from tracengine.engine.config import Config                        # noqa: E402
from tracengine.fleet.engine import simulate_fleet         # noqa: E402
from tracengine.fleet.spec import FleetSpec
from tracengine.sim.roofline import ModelShape, RooflineStepTime   # noqa: E402
from tracengine.workload import read_workload                      # noqa: E402

TIME_SCALE, NUM_BLOCKS = 8.0, 40_000
ROUTERS = ("round_robin", "least_loaded", "prefix_aware", "random")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--replicas", default="4,8")
    args = parser.parse_args()
    step_time = RooflineStepTime.for_hardware(ModelShape.from_hf_config(QWEN3_8B, "Qwen3-8B"), "H200")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mooncake.jsonl")
        mooncake_like(path, args.requests)
        requests = read_workload(path, vocab_size=QWEN3_8B["vocab_size"], time_scale=TIME_SCALE)
    config = Config(num_kvcache_blocks=NUM_BLOCKS, kvcache_block_size=16, max_num_batched_tokens=8192,
                    max_num_seqs=256, scheduling_policy="mixed",
                    max_model_len=max(len(r.prompt) + r.max_tokens for r in requests))
    print(f"{len(requests)} requests over {requests[-1].arrival_s:.0f} s (arrivals {TIME_SCALE:g}x the "
          f"workload's), Qwen3-8B roofline on an H200, {NUM_BLOCKS:,} blocks of 16 a replica\n")
    print("| replicas | router | TTFT p50 ms | TTFT p99 ms | cache hit | imbalance | duration s | run s |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for n in map(int, args.replicas.split(",")):
        for router in ROUTERS:
            start = time.process_time()
            s = fleet_stats(simulate_fleet(config, requests, step_time, FleetSpec(n, router)))
            cpu = time.process_time() - start
            t = s["latency"]["ttft"]
            print(f"| {n} | {router} | {t['p50'] * 1e3:,.1f} | {t['p99'] * 1e3:,.1f} | {s['token_hit_rate']:.1%} | "
                  f"{s['request_imbalance']:.2f} | {s['duration_s']:,.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
