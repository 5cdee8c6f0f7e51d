"""tracengine simulate against NVIDIA Dynamo's agentic replay, on one agentic Mooncake file both read.

The script writes a made-up multi-turn workload in Dynamo's agentic Mooncake format (schema
`dynamo.agentic_mooncake`, version 2; no line of it comes from a published trace): sessions
(Dynamo's plays) of 2 to 6 turns, the first turns' arrivals Poisson, each later turn sent a think
time (`delay_ms`) after the turn before finished, its prompt the whole conversation so far: one
of three shared system prompts, then every earlier turn's input and output, then its own input,
in hash ids of 512 tokens (the blocks the turn before filled keep their ids; the rest are new, as a
recorded trace names them). tracengine reads the file (workload/agentic_mooncake.py: a play is a
session, a dependency a `depends_on`, `delay_ms` the think time); Dynamo's `run_trace_replay`
reads it with `trace_format="agentic_mooncake"`. Both run bench_vs_dynamo.py's settings (vLLM V1
scheduling, tracengine's `mixed`; 100,000 KV blocks, budget 16,384, 256 sequences, prefix
caching, chunked prefill) and its fixed step times (100 ms for a step with prompt tokens, plus
10 ms when it decodes). Each run is a whole process, the two alternating; printed: the wall times
and their ratio, the simulated duration, TTFT and end-to-end latency (mean, p50, p99; both sides'
per-request values ranked by tracengine's percentile), session durations (tracengine's per-session
`duration_s`, Dynamo's trajectory: its play's first arrival to its last finish), the prefix-cache
hit rate, and per request how many agree exactly (requests matched by their request_id).

    python -m venv VENV
    VENV/bin/pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
    VENV/bin/pip install typing_extensions
    python benchmarks/bench_sessions_vs_dynamo.py --dynamo-python VENV/bin/python \\
        [--sessions 200] [--rate 1.5] [--block-size 16] [--num-kvcache-blocks N] [--repeats 3]"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_vs_dynamo import (DECODE_MS, PREFILL_MS, ROOT, SETTINGS, fixed_step_time, hash_id_allocator, timed,     # noqa: E402
                             tracengine_argv)
from tracengine.analysis.figures import summarize                                               # noqa: E402
from tracengine.analysis.stats import stats                                                     # noqa: E402
from tracengine.workload.formats import read_workload                                           # noqa: E402

HASH_ID_TOKENS = 512
SCHEMA = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": HASH_ID_TOKENS, "hash_id_scope": "local",
          "source": {"format": "tracengine-bench", "digest": "made-up-sessions-v1"}}

DYNAMO = r"""
import json, sys, time
from dynamo.replay import run_trace_replay
path, block_size, num_blocks, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
report = run_trace_replay([path], extra_engine_args={"engine": {
    "backend": "vllm", "block_size": block_size, "num_gpu_blocks": num_blocks,
    "max_model_len": %(max_model_len)d, "max_num_batched_tokens": %(max_num_batched_tokens)d,
    "max_num_seqs": %(max_num_seqs)d, "enable_prefix_caching": True, "enable_chunked_prefill": True,
    "timing_model": {"type": "fixed", "prefill_ms": %(prefill_ms)s, "decode_ms": %(decode_ms)s}}},
    num_workers=1, replay_mode="offline", router_mode="round_robin", trace_format="agentic_mooncake",
    execution_model="made-up", capture_per_request=out != "-")
if out != "-":
    with open(out, "w") as f:
        json.dump({"summary": {k: v for k, v in report.summary.items() if isinstance(v, (int, float, str))},
                   "requests": [{k: r[k] for k in ("request_id", "play_id", "arrival_time_ms", "ttft_ms",
                                                  "e2e_latency_ms", "terminal_time_ms", "input_length",
                                                  "output_length", "readmission_count", "terminal_status")}
                                | {"reused": sum(a["reused_input_tokens"] for a in r["admission_history"])}
                                for r in report.per_request]}, f)
""" % {**SETTINGS, "prefill_ms": PREFILL_MS, "decode_ms": DECODE_MS}


def agentic_workload(path: str, num_sessions: int, rate: float, seed: int = 0) -> dict:
    """Write the sessions as Dynamo's agentic Mooncake rows (a header, then a row per turn, the
    turns of sessions interleaved in the order they were first sent); returns their statistics."""
    rng = random.Random(seed)
    new_ids = hash_id_allocator()

    systems = [new_ids(rng.randint(2, 6)) for _ in range(3)]     # shared system prompts, whole blocks
    rows, t = [], 0.0
    for s in range(num_sessions):
        t += rng.expovariate(rate) * 1000 if s else 0.0
        hash_ids = list(rng.choice(systems))
        length, output, previous = len(hash_ids) * HASH_ID_TOKENS, 0, None
        for turn in range(rng.randint(2, 6)):
            new = max(20, min(4000, round(rng.lognormvariate(5.8, 0.9))))      # this turn's own input
            whole = length // HASH_ID_TOKENS            # the blocks the conversation so far filled keep their ids
            length += output + new
            hash_ids = hash_ids[:whole] + new_ids(-(-length // HASH_ID_TOKENS) - whole)
            output = max(10, min(800, round(rng.lognormvariate(5.0, 0.7))))
            request_id = f"s{s}-t{turn}"
            rows.append({"request_id": request_id, "play_id": f"s{s}", "session_id": f"s{s}", "model": "made-up",
                         "input_length": length, "output_length": output, "hash_ids": list(hash_ids),
                         "not_before_ms": round(t) if turn == 0 else 0,
                         "dependencies": [] if turn == 0 else [
                             {"request_id": previous, "trigger": "completion", "relation": "sequence",
                              "delay_ms": round(rng.expovariate(1 / 3000))}]})
            previous = request_id
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(row) for row in [SCHEMA, *rows]) + "\n")
    return {"sessions": num_sessions, "turns": len(rows), "mean_input": statistics.mean(r["input_length"] for r in rows),
            "mean_output": statistics.mean(r["output_length"] for r in rows), "first_span_s": t / 1000}


def ours(workload: str, step_time: str, block_size: int, num_blocks: int, tmp: str) -> dict:
    """tracengine's figures, from a recorded run (not timed): per request by request_id, per session."""
    trace = os.path.join(tmp, "sim.trace")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run(tracengine_argv(workload, step_time, block_size, trace, num_blocks), check=True, env=env,
                   cwd=ROOT, stdout=subprocess.DEVNULL)
    requests = read_workload(workload, vocab_size=151_936)
    with open(workload) as f:
        request_id = [json.loads(line).get("request_id") for line in f]       # by line: the header is line 1
    s = stats(trace)
    per_request = {request_id[int(requests[r["seq_id"]].source.rpartition(":")[2]) - 1]:
                   {"ttft_ms": r["ttft_s"] * 1e3, "e2e_ms": r["e2e_s"] * 1e3, "arrival_ms": r["arrival_s"] * 1e3}
                   for r in s["per_request"]}
    return {"duration_ms": s["steps"]["total_s"] * 1e3, "requests": per_request,
            "sessions": {r["session_id"]: r["duration_s"] * 1e3 for r in s["sessions"]["per_session"]},
            "hit_rate": s["prefix_cache"]["token_hit_rate"], "cached_tokens": s["prefix_cache"]["num_hit_tokens"],
            "preemptions": s["preemption"]["num_preemptions"]}


def theirs(python: str, script: str, workload: str, block_size: int, num_blocks: int, tmp: str) -> dict:
    out = os.path.join(tmp, "dynamo.json")
    subprocess.run([python, script, workload, str(block_size), str(num_blocks), out], check=True,
                   stdout=subprocess.DEVNULL)
    with open(out) as f:
        result = json.load(f)
    per_request = {r["request_id"]: {"ttft_ms": r["ttft_ms"], "e2e_ms": r["e2e_latency_ms"],
                                     "arrival_ms": r["arrival_time_ms"]} for r in result["requests"]}
    plays: dict[str, list[float]] = {}
    for r in result["requests"]:
        span = plays.setdefault(r["play_id"], [math.inf, -math.inf])
        span[0], span[1] = min(span[0], r["arrival_time_ms"]), max(span[1], r["terminal_time_ms"])
    s = result["summary"]
    return {"duration_ms": s["duration_ms"], "requests": per_request,
            "sessions": {play: end - start for play, (start, end) in plays.items()},
            "hit_rate": s["prefix_cache_reused_ratio"], "cached_tokens": sum(r["reused"] for r in result["requests"]),
            "preemptions": sum(r["readmission_count"] for r in result["requests"]),
            "trajectory_mean_ms": s.get("mean_trajectory_e2e_latency_ms")}


def side_by_side(a: dict, b: dict):
    print(f"  {'figure':<20} {'tracengine':>13} {'Dynamo':>13} {'difference':>11}")

    def line(name, x, y, fmt="{:,.1f}"):
        diff = f"{(x - y) / y:+.3%}" if y else ""
        print(f"  {name:<20} {fmt.format(x):>13} {fmt.format(y):>13} {diff:>11}")
    line("duration ms", a["duration_ms"], b["duration_ms"])
    for name in ("ttft_ms", "e2e_ms"):
        here = summarize([r[name] for r in a["requests"].values()])
        there = summarize([r[name] for r in b["requests"].values()])
        for p in ("mean", "p50", "p99"):
            line(f"{name[:-3]} {p} ms", here[p], there[p])
    here, there = summarize(list(a["sessions"].values())), summarize(list(b["sessions"].values()))
    for p in ("mean", "p50", "p99"):
        line(f"session {p} ms", here[p], there[p])
    # cached prompt tokens found at every admission, a readmission's too: the same count on both sides;
    # the rates divide it differently where requests were preempted (tracengine: by the tokens of every
    # admission; Dynamo: by each request's prompt once, with its last admission's cached tokens)
    line("cached tokens", a["cached_tokens"], b["cached_tokens"], "{:,}")
    line("cache hit rate", a["hit_rate"], b["hit_rate"], "{:.4%}")
    line("preemptions", a["preemptions"], b["preemptions"], "{:,}")
    if a["requests"].keys() != b["requests"].keys():
        raise SystemExit("the two runs' requests differ: not the same workload")
    for name in ("arrival_ms", "ttft_ms", "e2e_ms"):
        diffs = [a["requests"][k][name] - b["requests"][k][name] for k in a["requests"]]
        equal = sum(abs(d) < 1e-6 for d in diffs)
        print(f"  {name[:-3]:<8} per request: {equal:,} of {len(diffs):,} equal, differences "
              f"{min(diffs):+,.3f} to {max(diffs):+,.3f} ms")
    diffs = [a["sessions"][k] - b["sessions"][k] for k in a["sessions"]]
    print(f"  session  durations: {sum(abs(d) < 1e-6 for d in diffs):,} of {len(diffs):,} equal, differences "
          f"{min(diffs):+,.3f} to {max(diffs):+,.3f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dynamo-python", required=True, help="the python of a venv with ai-dynamo 1.6.1 (above)")
    parser.add_argument("--sessions", type=int, default=200, help="sessions in the written workload (default 200)")
    parser.add_argument("--rate", type=float, default=1.5, help="sessions started per second (default 1.5)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-kvcache-blocks", type=int, default=SETTINGS["num_kvcache_blocks"],
                        help=f"KV blocks on both sides (default {SETTINGS['num_kvcache_blocks']:,})")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workload", help="write the workload here (kept) rather than in a temporary folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        step_time, script = os.path.join(tmp, "fixed.json"), os.path.join(tmp, "dynamo_agentic.py")
        fixed_step_time(step_time)
        with open(script, "w") as f:
            f.write(DYNAMO)
        workload = args.workload or os.path.join(tmp, "sessions.jsonl")
        w = agentic_workload(workload, args.sessions, args.rate)
        print(f"workload: {w['sessions']:,} sessions, {w['turns']:,} turns, mean prompt {w['mean_input']:,.0f} tokens "
              f"(its history included), mean output {w['mean_output']:,.0f}; first turns over {w['first_span_s']:,.0f} s")
        argv = {"tracengine": tracengine_argv(workload, step_time, args.block_size, None, args.num_kvcache_blocks),
                "dynamo": [args.dynamo_python, script, workload, str(args.block_size), str(args.num_kvcache_blocks),
                           "-"]}
        runs = {side: [] for side in argv}
        for _ in range(args.repeats):          # alternating, whole processes
            for side in ("dynamo", "tracengine"):
                runs[side].append(timed(argv[side]))
        med = {side: [statistics.median(run[k] for run in r) for k in range(3)] for side, r in runs.items()}
        print(f"\nblock size {args.block_size}, {args.num_kvcache_blocks:,} blocks (median of {args.repeats}, "
              f"alternating):")
        for side in runs:
            print(f"  {side:<10}  wall {med[side][0]:6.2f} s   CPU {med[side][2]:6.2f} s   peak RSS "
                  f"{med[side][1]:7.1f} MB   (wall of the runs {', '.join(f'{run[0]:.2f}' for run in runs[side])} s)")
        print(f"  tracengine / dynamo: wall {med['tracengine'][0] / med['dynamo'][0]:.2f}x, "
              f"CPU {med['tracengine'][2] / med['dynamo'][2]:.2f}x")
        a = ours(workload, step_time, args.block_size, args.num_kvcache_blocks, tmp)
        b = theirs(args.dynamo_python, script, workload, args.block_size, args.num_kvcache_blocks, tmp)
        side_by_side(a, b)
        if b["trajectory_mean_ms"] is not None:
            print(f"  (Dynamo's summary: mean trajectory e2e {b['trajectory_mean_ms']:,.1f} ms)")


if __name__ == "__main__":
    main()
