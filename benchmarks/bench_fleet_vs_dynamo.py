"""A fleet in simulated time beside NVIDIA Dynamo's replay (its mocker, AISimulate), on the
same Mooncake-format workload with fixed step times (docs/cluster.md).

The workload is made here with the conversation trace's statistics (benchmarks/bench_simulate.py's
mooncake_like: 1,000 requests, mean prompt about 13,900 tokens, long shared prefixes). Both
sides: vLLM V1's scheduling (tracengine's `mixed` policy), 64-token blocks, 16,384 blocks a
replica, a budget of 8,192 tokens and 256 sequences a step, and steps priced as Dynamo's fixed
timing model prices them (PREFILL_MS for prompt tokens, plus DECODE_MS for decodes: a vLLM V1
step of both costs both; DynamoFixedTime), no gap between steps. Compared, each on the
whole fleet: the duration (first arrival to last token) and TTFT, TPOT and end-to-end p50,
p90 and p99, in three setups:

  1. --replicas 4 --router round_robin    | num_workers=4, router_mode="round_robin"
  2. --prefill-replicas 2 --decode-replicas 2, transfers of no cost
                                           | num_prefill_workers=2, num_decode_workers=2
  3. --replicas 4 --router prefix_aware   | num_workers=4, router_mode="kv_router"
     (and the prefix-cache hit rate: another cost function is allowed)

Dynamo runs in a virtual environment of its own (its wheels pin other versions):

    python -m venv VENV && VENV/bin/pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1 \\
        && VENV/bin/pip install typing_extensions
    python benchmarks/bench_fleet_vs_dynamo.py --dynamo-python VENV/bin/python [--requests 1000]"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_simulate import mooncake_like                          # noqa: E402
from tracengine.fleet.stats import fleet_stats                  # noqa: E402
from tracengine.analysis.figures import summarize                    # noqa: E402
from tracengine.engine.config import Config                        # noqa: E402
from tracengine.fleet.engine import simulate_fleet         # noqa: E402
from tracengine.fleet.spec import FleetSpec
from tracengine.sim.runners import SyntheticRunner                 # noqa: E402
from tracengine.workload import read_workload                      # noqa: E402

PREFILL_MS, DECODE_MS = 20.0, 5.0
NUM_BLOCKS, BLOCK_SIZE, BUDGET, MAX_SEQS = 16_384, 64, 8192, 256

DYNAMO = """
import json, sys, time
from dynamo.replay import run_trace_replay
path, setup = sys.argv[1], json.loads(sys.argv[2])
engine = {"engine": {"num_gpu_blocks": %d, "block_size": %d, "max_num_seqs": %d, "max_num_batched_tokens": %d,
                     "timing_model": {"type": "fixed", "prefill_ms": %r, "decode_ms": %r}}}
kwargs = dict(trace_block_size=512, router_mode=setup["router_mode"])
if setup.get("disaggregated"):
    kwargs.update(num_prefill_workers=2, num_decode_workers=2,
                  prefill_engine_args=json.dumps({"engine": dict(engine["engine"], worker_type="prefill")}),
                  decode_engine_args=json.dumps({"engine": dict(engine["engine"], worker_type="decode")}))
else:
    kwargs.update(num_workers=4, extra_engine_args=json.dumps(engine))
start = time.perf_counter()
report = run_trace_replay(path, capture_per_request=True, **kwargs)
wall_s = time.perf_counter() - start
requests = [{k: r[k] for k in ("ttft_ms", "e2e_latency_ms", "output_length")} for r in report.per_request]
print(json.dumps({"wall_s": wall_s, "summary": report.summary, "requests": requests}))
""" % (NUM_BLOCKS, BLOCK_SIZE, MAX_SEQS, BUDGET, PREFILL_MS, DECODE_MS)

SETUPS = [("4 replicas, round robin", FleetSpec(4, "round_robin"), {"router_mode": "round_robin"}),
          ("2 prefill + 2 decode, free transfers",
           FleetSpec(num_prefill_replicas=2, num_decode_replicas=2, router="round_robin"),
           {"router_mode": "round_robin", "disaggregated": True}),
          ("4 replicas, prefix_aware | kv_router", FleetSpec(4, "prefix_aware"), {"router_mode": "kv_router"})]


class DynamoFixedTime:
    """Steps priced as Dynamo's fixed timing model prices them: PREFILL_MS for a step that
    computes prompt tokens, plus DECODE_MS when it also decodes (so a vLLM V1 step of both costs
    both). A step-time model sees a batch's shape, not which of its sequences decode, so this one
    is also each replica's runner, around SyntheticRunner: it looks at the batch first. A
    sequence computing just its last token decodes (a disaggregated decode side's first step
    too, as Dynamo's decode worker's)."""
    kind = "fixed"
    gap_ns = wake_ns = 0

    def __init__(self):
        self.num_prefill = self.num_decode = 0

    def runner(self, index: int):
        return _Watched(self, SyntheticRunner(eos=-1, seed=0))

    def predict(self, is_prefill, *shape, mixed=False):
        ms = (PREFILL_MS if self.num_prefill else 0.0) + (DECODE_MS if self.num_decode else 0.0)
        return 0, round(ms * 1e6), 0


class _Watched:
    def __init__(self, pricing: DynamoFixedTime, runner):
        self.pricing, self.inner = pricing, runner

    def run(self, seqs, is_prefill):
        decode = sum(s.num_scheduled_tokens == 1 and s.num_cached_tokens + 1 == s.num_tokens for s in seqs)
        self.pricing.num_decode, self.pricing.num_prefill = decode, len(seqs) - decode
        return self.inner.run(seqs, is_prefill)

    def exit(self):
        pass


def ours(requests, spec: FleetSpec) -> tuple[dict, float]:
    config = Config(num_kvcache_blocks=NUM_BLOCKS, kvcache_block_size=BLOCK_SIZE, max_num_batched_tokens=BUDGET,
                    max_num_seqs=MAX_SEQS, scheduling_policy="mixed",
                    max_model_len=max(len(r.prompt) + r.max_tokens for r in requests))
    start = time.process_time()
    pricing = DynamoFixedTime()
    events = simulate_fleet(config, requests, pricing, spec, make_runner=pricing.runner)
    s = fleet_stats(events)
    cpu = time.process_time() - start
    figures = {"duration_ms": s["duration_s"] * 1e3, "token_hit_rate": s["token_hit_rate"]}
    for name in ("ttft", "tpot", "e2e"):
        for p in ("p50", "p90", "p99"):
            figures[f"{name}_{p}_ms"] = s["latency"][name][p] * 1e3
    return figures, cpu


def theirs(python: str, path: str, setup: dict) -> tuple[dict, float]:
    out = subprocess.run([python, "-c", DYNAMO, path, json.dumps(setup)], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    s = result["summary"]
    figures = {"duration_ms": s["duration_ms"], "token_hit_rate": s["prefix_cache_reused_ratio"]}
    # percentiles of its per-request figures by tracengine's percentile (linear between closest
    # ranks), so that the two sides differ in what they simulated, not in how they rank
    values = {"ttft": [r["ttft_ms"] for r in result["requests"]],
              "tpot": [(r["e2e_latency_ms"] - r["ttft_ms"]) / (r["output_length"] - 1)
                       for r in result["requests"] if r["output_length"] > 1],
              "e2e": [r["e2e_latency_ms"] for r in result["requests"]]}
    for name, v in values.items():
        summary = summarize(v)
        for p in ("p50", "p90", "p99"):
            figures[f"{name}_{p}_ms"] = summary[p]
    return figures, result["wall_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dynamo-python", required=True, help="the python of a venv with ai-dynamo 1.6.1")
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mooncake.jsonl")
        mooncake_like(path, args.requests)
        requests = read_workload(path, vocab_size=151_936)
        print(f"{len(requests)} requests; fixed steps: {PREFILL_MS:g} ms with prefill tokens, {DECODE_MS:g} ms decode; "
              f"{NUM_BLOCKS:,} blocks of {BLOCK_SIZE}, budget {BUDGET}, {MAX_SEQS} seqs, vLLM V1 scheduling")
        for title, spec, setup in SETUPS:
            a, a_s = ours(requests, spec)
            b, b_s = theirs(args.dynamo_python, path, setup)
            print(f"\n{title}: tracengine {a_s:.2f} s CPU, Dynamo {b_s:.2f} s wall")
            print(f"  {'figure':<16}{'tracengine':>12}{'Dynamo':>12}{'ratio':>9}")
            for key in a:
                x, y = a[key], b[key]
                ratio = f"{x / y:.4f}" if y else "-"
                fmt = "{:.1%}" if key == "token_hit_rate" else "{:,.2f}"
                print(f"  {key:<16}{fmt.format(x):>12}{fmt.format(y):>12}{ratio:>9}")


if __name__ == "__main__":
    main()
