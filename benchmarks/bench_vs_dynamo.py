"""tracengine simulate against NVIDIA Dynamo's offline replay, on the same Mooncake file.

Both run the same workload with the same settings (block size, 100,000 KV blocks, a budget
of 16,384 tokens, 256 sequences, prefix caching, chunked prefill) and fixed step times:
100 ms for a step with prefill tokens, 10 ms for a decode-only step (Dynamo's `fixed`
timing model; tracengine's linear step-time model with only those constants), tracengine
with the `mixed` policy (vLLM V1's, as Dynamo's vllm backend). Each run is a whole process
(tracengine: `python -m tracengine.cli simulate FILE`, as a user runs it; Dynamo:
`dynamo.replay.run_trace_replay`), the two alternating; the medians of wall time and of
peak RSS are compared, and the runs' figures are printed side by side (simulated duration,
TTFT/TPOT/e2e p50 and p99, prefix-cache hit rate, preemptions).

Dynamo is installed from its wheels into a virtual environment of its own (its other
dependencies are not needed for offline replay), whose python this script is given:

    python -m venv VENV
    VENV/bin/pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
    VENV/bin/pip install typing_extensions
    python benchmarks/bench_vs_dynamo.py --dynamo-python VENV/bin/python \\
        [--requests 1000] [--block-sizes 16,64,512] [--repeats 3] [--floor]
        [--offload [--offload-gbps 25,3.125]] [--tracengine-python TVENV/bin/python]

Dynamo's interpreter starts with nothing but its own packages; this script's may start with every
package of a development machine, whose .pth files (an editable install's finder, say) each run
at every start-up. `--tracengine-python` gives tracengine a venv of its own too, into which
`TVENV/bin/pip install torch==2.13.0 && TVENV/bin/pip install .` installs it as a user does; either
way it runs this checkout (on PYTHONPATH), compiled in place (`python setup.py build_ext --inplace`).

`--offload` compares a host KV tier instead: Dynamo's `native_host_offload` (num_host_blocks,
d2h and h2d bandwidth, kv_cache_bytes_per_token) and tracengine's CPU tier (kv_offloading_size in
GiB of the same bytes, kv_bytes_per_token, kv_offloading_bandwidth_gbps), 200,000 host blocks,
20,000 GPU blocks, block 16, 131,072 bytes a token, without a tier and at each bandwidth: the
figures side by side (means too) and the wall time with the tier against without it.

The workload is written here, with the statistics of Mooncake's public conversation trace
(mean prompt about 13,700 tokens in 512-token hash ids, mean output about 350 tokens,
Poisson arrivals, 1,000 requests over about 330 s, about a third of the hash ids repeated
from earlier requests: conversations whose next turn repeats the turn before)."""
import argparse
import compileall
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
HASH_ID_TOKENS = 512
SETTINGS = {"num_kvcache_blocks": 100_000, "max_num_batched_tokens": 16_384, "max_num_seqs": 256,
            "max_model_len": 131_072}
PREFILL_MS, DECODE_MS = 100.0, 10.0

DYNAMO = r"""
import json, sys
from dynamo.replay import run_trace_replay
path, block_size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
per_request = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None   # where to write each request's figures
num_blocks = int(sys.argv[5]) if len(sys.argv) > 5 else %(num_kvcache_blocks)d
# a host tier: its blocks, each direction's bandwidth (GB/s) and the KV bytes of a token
host_blocks, gbps, kv_bytes = (int(sys.argv[6]), float(sys.argv[7]), int(sys.argv[8])) if len(sys.argv) > 8 else (0, 0, 0)
num_workers = int(sys.argv[9]) if len(sys.argv) > 9 else 1    # workers behind round robin
engine = {"backend": "vllm", "block_size": block_size, "num_gpu_blocks": num_blocks,
    "max_model_len": %(max_model_len)d, "max_num_batched_tokens": %(max_num_batched_tokens)d,
    "max_num_seqs": %(max_num_seqs)d, "enable_prefix_caching": True, "enable_chunked_prefill": True,
    "timing_model": {"type": "fixed", "prefill_ms": %(prefill_ms)s, "decode_ms": %(decode_ms)s}}
if host_blocks:
    engine["native_host_offload"] = {"num_host_blocks": host_blocks, "d2h_bandwidth_gbps": gbps,
                                     "h2d_bandwidth_gbps": gbps}
    engine["kv_cache_bytes_per_token"] = kv_bytes
report = run_trace_replay([path], extra_engine_args={"engine": engine},
    num_workers=num_workers, replay_mode="offline", router_mode="round_robin", trace_format="mooncake",
    trace_block_size=%(hash_id_tokens)d, capture_per_request=per_request is not None)
summary = report.summary if hasattr(report, "summary") else report
with open(out, "w") as f:
    json.dump(summary, f, default=str)
if per_request:
    with open(per_request, "w") as f:
        json.dump([{**{k: r[k] for k in ("arrival_time_ms", "input_length", "output_length", "ttft_ms",
                                          "e2e_latency_ms", "readmission_count")},
                    "first_reused_input_tokens": r["admission_history"][0]["reused_input_tokens"]}
                   for r in report.per_request], f)
""" % {**SETTINGS, "prefill_ms": PREFILL_MS, "decode_ms": DECODE_MS, "hash_id_tokens": HASH_ID_TOKENS}


def hash_id_allocator():
    """new_ids(n): n hash ids no earlier call gave (a workload's fresh blocks, numbered in order)."""
    next_id = 0

    def new_ids(n):
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))
    return new_ids


def conversation_workload(path: str, num_requests: int, seed: int = 0, duration_s: float = 330.0) -> dict:
    """Write a Mooncake JSONL workload with the conversation trace's statistics; returns them."""
    rng = random.Random(seed)
    new_ids = hash_id_allocator()

    conversations: list[list[int]] = []
    t, lines, rate = 0.0, [], 1000 / duration_s      # requests per second, as in the first 1,000
    num_ids = num_repeated = 0
    seen: set[int] = set()
    for _ in range(num_requests):
        t += rng.expovariate(rate)
        if conversations and rng.random() < 0.35:     # a next turn: the conversation so far and a new turn
            i = rng.randrange(max(0, len(conversations) - 50), len(conversations))
            hash_ids = conversations[i] + new_ids(rng.randint(1, 8))
            conversations[i] = hash_ids
        else:
            hash_ids = new_ids(max(1, round(rng.lognormvariate(3.05, 0.7))))
            conversations.append(hash_ids)
        hash_ids = hash_ids[:120]                     # at most 61,440 tokens
        input_length = len(hash_ids) * HASH_ID_TOKENS - rng.randrange(HASH_ID_TOKENS)
        output_length = max(1, min(2000, round(rng.lognormvariate(5.55, 0.75))))
        lines.append(json.dumps({"timestamp": round(t * 1000), "input_length": input_length,
                                 "output_length": output_length, "hash_ids": hash_ids}))
        num_ids += len(hash_ids)
        num_repeated += sum(1 for h in hash_ids if h in seen)
        seen.update(hash_ids)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    records = [json.loads(line) for line in lines]
    return {"requests": num_requests, "mean_input": statistics.mean(r["input_length"] for r in records),
            "mean_output": statistics.mean(r["output_length"] for r in records), "hash_ids": num_ids,
            "repeated": num_repeated / num_ids, "duration_s": records[-1]["timestamp"] / 1000}


FEATURES = ("const", "tokens", "seqs", "context", "attended")     # tracengine.sim.steptime's
PARTS = ("schedule_ns", "model_ns", "postprocess_ns")


def fixed_step_time(path: str):
    """Dynamo's `fixed` timing as tracengine's linear step-time model: constants only. Dynamo
    charges a step PREFILL_MS when its batch computes prompt tokens plus DECODE_MS when it
    decodes, so a step of both (vLLM V1 batches them) costs both: the model's `mixed` row."""

    def phase(ms):
        return {part: [ms * 1e6 if part == "model_ns" and f == "const" else 0.0 for f in FEATURES] for part in PARTS}
    with open(path, "w") as f:
        json.dump({"kind": "linear", "features": list(FEATURES), "parts": list(PARTS), "gap_ns": 0, "wake_ns": 0,
                   "coefficients": {"prefill": phase(PREFILL_MS), "decode": phase(DECODE_MS),
                                    "mixed": phase(PREFILL_MS + DECODE_MS)},
                   "source": {"model": "fixed"}}, f)


def tracengine_argv(workload: str, step_time: str, block_size: int, record: str | None = None,
                    num_kvcache_blocks: int | None = None, tier: dict | None = None, replicas: int = 1,
                    python: str = sys.executable) -> list[str]:
    """`tier`: the CPU tier's config fields (kv_offloading_size, kv_bytes_per_token, kv_offloading_bandwidth_gbps);
    `replicas`: more than one, a fleet of them behind round robin; `python`: the interpreter that runs it."""
    settings = {**SETTINGS, **({"num_kvcache_blocks": num_kvcache_blocks} if num_kvcache_blocks else {}), **(tier or {})}
    argv = [python, "-m", "tracengine.cli", "simulate", workload, "--step-time", step_time, "--quiet",
            "--scheduling-policy", "mixed", "--block-size", str(block_size),
            *(f"--{name.replace('_', '-')}={value}" for name, value in settings.items())]
    argv += ["--replicas", str(replicas), "--router", "round_robin"] if replicas > 1 else []
    return argv + (["--record", record, "--force"] if record else [])


def child_env(env_extra: dict | None = None) -> dict:
    """The environment of a tracengine child process: this checkout first on its path."""
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env_extra or {})}


def run_python(code: str, *argv: str, python: str = sys.executable) -> str:
    """What `python -c code argv...` prints, run in this checkout (by `python`, this interpreter unless given)."""
    return subprocess.run([python, "-c", code, *argv], env=child_env(), cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def timed(argv: list[str], env_extra: dict | None = None) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MB, CPU seconds) of a whole process. This process stays small
    (it imports no tracengine): a child's peak RSS counts what it was forked with."""
    env = child_env(env_extra)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{argv[0]} failed: {proc.stderr.read().decode()[-2000:]}")
    proc.stderr.close()
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


FIGURES = r"""
import json, sys
from tracengine.analysis.stats import stats
s = stats(sys.argv[1])
lat = s["latency"]
print(json.dumps({"duration_ms": s["steps"]["total_s"] * 1e3,
                  **{f"{name}_{q}_ms": lat[name]["seconds"][q] * 1e3 for name in ("ttft", "tpot", "e2e")
                     for q in ("mean", "p50", "p99")},
                  "cache_hit_rate": s["prefix_cache"]["token_hit_rate"],
                  "preemptions": s["preemption"]["num_preemptions"]}))
"""


# `--floor`: the same simulate command with its event sink switched off, so that no event is built
# and nothing is folded (the printed figures are then empty): what the scheduler, block manager
# and synthetic runner cost alone, the floor under any cost of the events and the stats.
FLOOR = r"""
import sys
from tracengine.analysis.timeline_sink import RequestTimelineSink
from tracengine.cli.main import main
RequestTimelineSink.enabled = False
sys.exit(main(sys.argv[1:]))
"""


PURE = {"TRACENGINE_PURE_PYTHON": "1"}      # the Python core in a compiled install (tracengine/compiled.py)


def same_events(trace: str, other: str) -> str:
    """Whether two traces hold the same events, the header (its wall-clock time) aside."""
    code = ("import sys; from tracengine.trace.reader import open_trace; "
            "a, b = (list(open_trace(p))[1:] for p in sys.argv[1:]); "
            "print(f'the same ({len(a):,} events)' if a == b else 'DIFFERENT')")
    return run_python(code, trace, other).strip()


# A fleet's trace: the same figures over the whole fleet (fleet/stats.py), the hit rate of its tokens
FLEET_FIGURES = r"""
import json, sys
from tracengine.fleet.stats import fleet_stats
s = fleet_stats(sys.argv[1])
lat = s["latency"]
print(json.dumps({"duration_ms": s["duration_s"] * 1e3,
                  **{f"{name}_{q}_ms": getattr(lat[name], q) * 1e3
                     for name in ("ttft", "tpot", "e2e") for q in ("mean", "p50", "p99")},
                  "cache_hit_rate": s["token_hit_rate"],
                  "preemptions": sum(r["stats"]["preemption"]["num_preemptions"] for r in s["replicas"])}))
"""


def tracengine_figures(trace: str, fleet: bool = False) -> dict:
    return json.loads(run_python(FLEET_FIGURES if fleet else FIGURES, trace))


def dynamo_figures(summary: dict) -> dict:
    return {"duration_ms": summary["duration_ms"],
            **{f"{name}_{q}_ms": summary[f"{'median' if q == 'p50' else q}_{key}_ms"]
               for name, key in (("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2e_latency"))
               for q in ("mean", "p50", "p99")},
            "cache_hit_rate": summary["prefix_cache_reused_ratio"], "preemptions": summary.get("num_preemptions", "-")}


# `--offload`: both with a host tier of OFFLOAD's size, as the comparison sets it (Dynamo's
# num_host_blocks, tracengine's kv_offloading_size in GiB of the same bytes), at each bandwidth
OFFLOAD = {"num_gpu_blocks": 20_000, "num_host_blocks": 200_000, "kv_bytes_per_token": 131_072}


def compare(label: str, runs: dict, figures: dict, num_requests: int):
    """Print the runs' medians and their figures side by side."""
    med = {side: [statistics.median(run[k] for run in r) for k in range(3)] for side, r in runs.items()}
    print(f"\n{label} (median of {len(runs['dynamo'])}, alternating):")
    for side in runs:
        print(f"  {side:<11}  wall {med[side][0]:6.2f} s   CPU {med[side][2]:6.2f} s   peak RSS "
              f"{med[side][1]:7.1f} MB   (wall of the runs {', '.join(f'{run[0]:.2f}' for run in runs[side])} s)")
    print(f"  tracengine / dynamo: wall {med['tracengine'][0] / med['dynamo'][0]:.2f}x, "
          f"CPU {med['tracengine'][2] / med['dynamo'][2]:.2f}x, peak RSS {med['tracengine'][1] / med['dynamo'][1]:.2f}x; "
          f"tracengine per request {med['tracengine'][0] / num_requests * 1e3:.2f} ms")
    print(f"  {'figure':<16} {'tracengine':>12} {'dynamo':>12} {'difference':>11}")
    for name, ours_value in figures["tracengine"].items():
        theirs = figures["dynamo"][name]
        diff = f"{(ours_value - theirs) / theirs:+.2%}" if isinstance(theirs, (int, float)) and theirs else ""
        print(f"  {name:<16} {ours_value:>12,.3f} {theirs if isinstance(theirs, str) else f'{theirs:,.3f}':>12}"
              f" {diff:>11}")
    return med


def offload_comparison(args, tmp: str, script: str, workload: str, step_time: str, num_requests: int):
    """Dynamo's native host offload beside tracengine's CPU tier, without the tier and at each
    bandwidth; then each side's wall time with the tier against without it."""
    block_size, gpu, host, kv_bytes = 16, OFFLOAD["num_gpu_blocks"], OFFLOAD["num_host_blocks"], \
        OFFLOAD["kv_bytes_per_token"]
    gib = host * block_size * kv_bytes / (1 << 30)       # a 16-token block of 2 MiB is page-aligned already
    walls = {}
    for gbps in [0.0, *map(float, args.offload_gbps.split(","))]:
        summary_path = os.path.join(tmp, "summary.json")
        dynamo = [args.dynamo_python, script, workload, str(block_size), summary_path, "", str(gpu),
                  *([str(host), str(gbps), str(kv_bytes)] if gbps else [])]
        tier = {"kv_offloading_size": gib, "kv_bytes_per_token": kv_bytes, "kv_offloading_bandwidth_gbps": gbps} \
            if gbps else None
        ours = tracengine_argv(workload, step_time, block_size, num_kvcache_blocks=gpu, tier=tier)
        runs = {"tracengine": [], "dynamo": []}
        for _ in range(args.repeats):
            runs["dynamo"].append(timed(dynamo))
            runs["tracengine"].append(timed(ours))
        trace = os.path.join(tmp, "sim.trace")
        timed(tracengine_argv(workload, step_time, block_size, trace, gpu, tier))
        with open(summary_path) as f:
            figures = {"tracengine": tracengine_figures(trace), "dynamo": dynamo_figures(json.load(f))}
        label = (f"host tier of {host:,} blocks ({gib:g} GiB) at {gbps:g} GB/s each way" if gbps
                 else "no host tier") + f", {gpu:,} GPU blocks, {num_requests:,} requests"
        walls[gbps] = compare(label, runs, figures, num_requests)
    for gbps, med in walls.items():
        if gbps:
            print(f"\nwall with the tier at {gbps:g} GB/s / without it: tracengine "
                  f"{med['tracengine'][0] / walls[0.0]['tracengine'][0]:.2f}x, "
                  f"dynamo {med['dynamo'][0] / walls[0.0]['dynamo'][0]:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dynamo-python", required=True, help="the python of a venv with ai-dynamo 1.6.1 (above)")
    parser.add_argument("--requests", default="1000", help="comma-separated workload sizes (default 1000)")
    parser.add_argument("--block-sizes", default="16", help="comma-separated KV block sizes (default 16)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--offload", action="store_true",
                        help="compare a host KV tier instead (Dynamo's native_host_offload, tracengine's "
                             "kv_offloading_size): 200,000 host blocks, 20,000 GPU blocks, block 16")
    parser.add_argument("--offload-gbps", default="25,3.125", help="--offload's bandwidths, GB/s each way")
    parser.add_argument("--floor", action="store_true",
                        help="also time tracengine with its event sink off (no events, no stats), in turn with the others")
    parser.add_argument("--replicas", type=int, default=1,
                        help="more than one: a fleet of them behind round robin (Dynamo: as many workers, round robin)")
    parser.add_argument("--tracengine-python", default=sys.executable,
                        help="the python that runs tracengine (default this one): a venv of its own, as Dynamo's (above)")
    parser.add_argument("--pure", action="store_true",
                        help="also time tracengine's pure-Python core (TRACENGINE_PURE_PYTHON=1), in turn with the "
                             "others, and check that its events are the compiled core's")
    args = parser.parse_args()
    # Both sides start from compiled bytecode, as an install leaves it (pip compiles Dynamo's wheels); a
    # checkout under PYTHONDONTWRITEBYTECODE=1 would otherwise compile tracengine's modules in every run.
    compileall.compile_dir(os.path.join(ROOT, "tracengine"), quiet=1)
    print(run_python("from tracengine.cli.main import main; main(['--version'])",
                     python=args.tracengine_python).splitlines()[-1])
    with tempfile.TemporaryDirectory() as tmp:
        step_time = os.path.join(tmp, "fixed.json")
        fixed_step_time(step_time)
        script = os.path.join(tmp, "dynamo_replay.py")
        with open(script, "w") as f:
            f.write(DYNAMO)
        for num_requests in map(int, args.requests.split(",")):
            workload = os.path.join(tmp, f"conversation_{num_requests}.jsonl")
            w = conversation_workload(workload, num_requests)
            print(f"workload: {w['requests']:,} requests, mean prompt {w['mean_input']:,.0f} tokens, mean output "
                  f"{w['mean_output']:,.0f}, {w['hash_ids']:,} hash ids ({w['repeated']:.0%} repeated), arrivals over "
                  f"{w['duration_s']:,.0f} s")
            if args.offload:
                offload_comparison(args, tmp, script, workload, step_time, num_requests)
                continue
            for block_size in map(int, args.block_sizes.split(",")):
                summary_path = os.path.join(tmp, "summary.json")
                dynamo = [args.dynamo_python, script, workload, str(block_size), summary_path,
                          *(["", str(SETTINGS["num_kvcache_blocks"]), "0", "0", "0", str(args.replicas)]
                            if args.replicas > 1 else [])]
                ours = tracengine_argv(workload, step_time, block_size, replicas=args.replicas,
                                       python=args.tracengine_python)
                floor = [args.tracengine_python, "-c", FLOOR, *ours[3:]]      # ours without `-m tracengine.cli`
                runs = {"tracengine": [], "dynamo": [], **({"no events": []} if args.floor else {}),
                        **({"pure python": []} if args.pure else {})}
                for _ in range(args.repeats):          # alternating, whole processes
                    runs["dynamo"].append(timed(dynamo))
                    runs["tracengine"].append(timed(ours))
                    if args.floor:
                        runs["no events"].append(timed(floor))
                    if args.pure:
                        runs["pure python"].append(timed(ours, PURE))
                trace = os.path.join(tmp, "sim.trace")
                timed(tracengine_argv(workload, step_time, block_size, trace, replicas=args.replicas))  # its figures
                if args.pure:
                    pure_trace = os.path.join(tmp, "pure.trace")
                    timed(tracengine_argv(workload, step_time, block_size, pure_trace, replicas=args.replicas), PURE)
                    print(f"  pure Python's events: {same_events(trace, pure_trace)}")
                with open(summary_path) as f:
                    figures = {"tracengine": tracengine_figures(trace, args.replicas > 1),
                               "dynamo": dynamo_figures(json.load(f))}
                fleet = f", {args.replicas} replicas behind round robin" if args.replicas > 1 else ""
                med = compare(f"block size {block_size}, {num_requests:,} requests{fleet}", runs, figures, num_requests)
                if args.pure:
                    print(f"  pure Python / dynamo: wall {med['pure python'][0] / med['dynamo'][0]:.2f}x, CPU "
                          f"{med['pure python'][2] / med['dynamo'][2]:.2f}x; pure Python / compiled core: wall "
                          f"{med['pure python'][0] / med['tracengine'][0]:.2f}x, CPU "
                          f"{med['pure python'][2] / med['tracengine'][2]:.2f}x")
                if args.floor:
                    print(f"  tracengine with no events / dynamo: wall {med['no events'][0] / med['dynamo'][0]:.2f}x, "
                          f"CPU {med['no events'][2] / med['dynamo'][2]:.2f}x")


if __name__ == "__main__":
    main()
