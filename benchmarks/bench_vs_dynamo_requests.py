"""tracengine simulate and NVIDIA Dynamo's offline replay compared request by request.

bench_vs_dynamo.py compares the two runs' percentiles; this script says where they come from.
The same Mooncake file (bench_vs_dynamo.conversation_workload, or --workload FILE) goes
through both with bench_vs_dynamo's settings and fixed step times; Dynamo with
`capture_per_request`, tracengine recorded (`simulate --record`). Set side by side per
request: TTFT, TPOT ((e2e - TTFT) / (tokens - 1), vLLM's), end-to-end latency, prompt tokens
found in the prefix cache (tracengine: its first allocation's cached blocks times the block
size; Dynamo: its first admission's `reused_input_tokens`) and preemptions (Dynamo: `readmission_count`); the
requests are matched by arrival time and lengths (the file's order; Dynamo names a request by
a random id). Printed per figure: how many requests agree exactly, how many are lower or
higher here, the largest differences and the requests that show them; then the percentiles
of both sides' per-request values taken the same way (tracengine's: linear between closest
ranks) beside Dynamo's own summary (which takes the closest rank), so that a difference of
method is not read as one of simulation.

    python benchmarks/bench_vs_dynamo_requests.py --dynamo-python VENV/bin/python \\
        [--requests 1000] [--block-sizes 16,64,512] [--num-kvcache-blocks N] [--workload FILE] [--show 5]

(Dynamo's venv: bench_vs_dynamo.py's docstring.)"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_vs_dynamo import (DYNAMO, ROOT, SETTINGS, conversation_workload, fixed_step_time,       # noqa: E402
                             tracengine_argv)
from tracengine.analysis.figures import summarize                                                   # noqa: E402
from tracengine.analysis.stats import stats                                               # noqa: E402
from tracengine.trace.events import BlockAllocate                                                    # noqa: E402
from tracengine.trace.reader import TraceReader                                                      # noqa: E402

FIGURES = ("ttft_ms", "tpot_ms", "e2e_ms", "reused_tokens", "preemptions")


def dynamo_requests(python: str, script: str, workload: str, block_size: int, num_blocks: int,
                    tmp: str) -> tuple[list[dict], dict]:
    """Its requests in the file's order, and its summary."""
    summary, per_request = os.path.join(tmp, "summary.json"), os.path.join(tmp, "per_request.json")
    subprocess.run([python, script, workload, str(block_size), summary, per_request, str(num_blocks)], check=True,
                   stdout=subprocess.DEVNULL)
    with open(per_request) as f:
        records = json.load(f)
    with open(summary) as f:
        summary = json.load(f)
    requests = [{"arrival_ms": r["arrival_time_ms"], "prompt": r["input_length"], "tokens": r["output_length"],
                 "ttft_ms": r["ttft_ms"], "e2e_ms": r["e2e_latency_ms"],
                 "tpot_ms": ((r["e2e_latency_ms"] - r["ttft_ms"]) / (r["output_length"] - 1)
                             if r["output_length"] > 1 else None),
                 "reused_tokens": r["first_reused_input_tokens"], "preemptions": r["readmission_count"]} for r in records]
    return sorted(requests, key=_order), summary


def tracengine_requests(workload: str, step_time: str, block_size: int, num_blocks: int,
                        tmp: str) -> tuple[list[dict], float]:
    """Its requests in the file's order, and the simulated duration in ms."""
    trace = os.path.join(tmp, "sim.trace")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run(tracengine_argv(workload, step_time, block_size, trace, num_blocks), check=True, env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cached_blocks: dict[int, int] = {}
    with TraceReader(trace) as reader:
        for event in reader.events():
            if type(event) is BlockAllocate:
                cached_blocks.setdefault(event.seq_id, event.num_cached_blocks)   # its first allocation's
    s = stats(trace)
    requests = [{"arrival_ms": r["arrival_s"] * 1e3, "prompt": r["num_prompt_tokens"],
                 "tokens": r["num_completion_tokens"], "ttft_ms": r["ttft_s"] * 1e3, "e2e_ms": r["e2e_s"] * 1e3,
                 "tpot_ms": r["tpot_s"] * 1e3 if r["tpot_s"] is not None else None,
                 "reused_tokens": cached_blocks.get(r["seq_id"], 0) * block_size, "preemptions": r["num_preemptions"],
                 "seq_id": r["seq_id"]}
                for r in s["per_request"]]
    return sorted(requests, key=_order), s["steps"]["total_s"] * 1e3


def _order(r: dict) -> tuple:
    return round(r["arrival_ms"], 3), r["prompt"], r["tokens"]


def compare(ours: list[dict], theirs: list[dict], summary: dict, show: int):
    if [_order(r) for r in ours] != [_order(r) for r in theirs]:
        raise SystemExit("the two runs' requests differ in arrival or lengths: not the same workload")
    print(f"  {'figure':<14} {'equal':>6} {'lower':>6} {'higher':>6} {'min diff':>10} {'max diff':>10}  (here - Dynamo)")
    for name in FIGURES:
        pairs = [(a, b) for a, b in zip(ours, theirs) if a[name] is not None and b[name] is not None]
        diffs = [a[name] - b[name] for a, b in pairs]
        equal = sum(abs(d) < 1e-6 for d in diffs)
        lower = sum(d <= -1e-6 for d in diffs)
        print(f"  {name:<14} {equal:>6} {lower:>6} {len(diffs) - equal - lower:>6} {min(diffs):>10.3f} "
              f"{max(diffs):>10.3f}")
        worst = sorted((p for p, d in zip(pairs, diffs) if abs(d) >= 1e-6), key=lambda p: -abs(p[0][name] - p[1][name]))
        for a, b in worst[:show]:
            print(f"      seq {a['seq_id']:>5}: arrival {a['arrival_ms']:,.0f} ms, prompt {a['prompt']:,}, "
                  f"{a['tokens']} tokens: {a[name]:,.3f} here, {b[name]:,.3f} in Dynamo")
    print(f"  {'percentile':<14} {'here':>12} {'Dynamo':>12} {'Dynamo summary':>15}  (per-request values, one method)")
    keys = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2e_ms": "e2e_latency"}
    for name, key in keys.items():
        here = summarize([r[name] for r in ours if r[name] is not None])
        there = summarize([r[name] for r in theirs if r[name] is not None])
        for p in ("p50", "p90", "p99"):
            own = summary[f"{'median' if p == 'p50' else p}_{key}_ms"]
            print(f"  {name[:-3] + ' ' + p:<14} {here[p]:>12,.3f} {there[p]:>12,.3f} {own:>15,.3f}")
    num_reused = {side: sum(r["reused_tokens"] for r in rs) for side, rs in (("here", ours), ("Dynamo", theirs))}
    num_prompt = sum(r["prompt"] for r in ours)
    print(f"  prompt tokens found cached at first admission: {num_reused['here'] / num_prompt:.4%} here, "
          f"{num_reused['Dynamo'] / num_prompt:.4%} in Dynamo (its summary: "
          f"{summary['first_admission_prefix_cache_reused_ratio']:.4%})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dynamo-python", required=True, help="the python of a venv with ai-dynamo 1.6.1")
    parser.add_argument("--requests", type=int, default=1000, help="the written workload's size (default 1000)")
    parser.add_argument("--workload", help="a Mooncake JSONL file to use instead of writing one")
    parser.add_argument("--block-sizes", default="16", help="comma-separated KV block sizes (default 16)")
    parser.add_argument("--show", type=int, default=5, help="requests shown per differing figure (default 5)")
    parser.add_argument("--num-kvcache-blocks", type=int, default=SETTINGS["num_kvcache_blocks"],
                        help=f"KV blocks on both sides (default {SETTINGS['num_kvcache_blocks']:,}; fewer: memory pressure)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        step_time, script = os.path.join(tmp, "fixed.json"), os.path.join(tmp, "dynamo_replay.py")
        fixed_step_time(step_time)
        with open(script, "w") as f:
            f.write(DYNAMO)
        workload = args.workload
        if workload is None:
            workload = os.path.join(tmp, f"conversation_{args.requests}.jsonl")
            conversation_workload(workload, args.requests)
        for block_size in map(int, args.block_sizes.split(",")):
            theirs, summary = dynamo_requests(args.dynamo_python, script, workload, block_size,
                                              args.num_kvcache_blocks, tmp)
            ours, duration_ms = tracengine_requests(workload, step_time, block_size, args.num_kvcache_blocks, tmp)
            print(f"\nblock size {block_size}, {args.num_kvcache_blocks:,} blocks, {len(ours):,} requests, simulated duration "
                  f"{duration_ms:,.1f} ms here, {summary['duration_ms']:,.1f} ms in Dynamo")
            compare(ours, theirs, summary, args.show)


if __name__ == "__main__":
    main()
