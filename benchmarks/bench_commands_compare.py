"""The simulation's commands as a user runs them, whole processes timed in wall
seconds, with the code of another commit and with this tree, side by side: for
each command the two trees alternate (before, after, after, before, ...), and
the medians are compared. What the process does besides the run itself counts
here (reading the workload or trace, the summary, the collector, the exit).

The inputs are made here: bench_simulate.py's 1,000 Mooncake-like requests
(block size 16, 100,000 blocks, a roofline of a Qwen3-8B shape on an H200)
and that simulation's recorded trace (76.6 MB), and an Azure-format CSV of
1,000 requests with lengths only.

    python benchmarks/bench_commands_compare.py --before REV [--repeats 3]"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_simulate import QWEN3_8B, mooncake_like         # noqa: E402
from bench_simulate_compare import checkout                 # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def azure_like(path: str, num_requests: int = 1000, seed: int = 1):
    """An Azure LLM-inference-trace CSV: arrivals at 3 a second, 200-4,000 context tokens, 20-400 generated."""
    rng = random.Random(seed)
    t = datetime(2024, 3, 2, 9, 0, 0)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for _ in range(num_requests):
        t += timedelta(seconds=rng.expovariate(3.0))
        lines.append(f"{t.isoformat(sep=' ')},{rng.randint(200, 4000)},{rng.randint(20, 400)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def commands(tmp: str) -> dict[str, list[str]]:
    mooncake, azure, config = (os.path.join(tmp, name) for name in ("mooncake.jsonl", "azure.csv", "config.json"))
    trace, out = os.path.join(tmp, "sim.trace"), os.path.join(tmp, "out")
    roofline = ["--roofline", config, "--hardware", "h200"]
    return {
        "simulate --record (1,000 Mooncake requests)":
            ["simulate", mooncake, *roofline, "--set", "num_kvcache_blocks=100000", "--record", out, "--quiet"],
        "replay --set, a what-if in simulated time (its trace)":
            ["replay", trace, "--set", "num_kvcache_blocks=50000"],
        "export --perfetto (its trace)": ["export", trace, "--perfetto", out],
        "stats (its trace)": ["stats", trace],
        "simulate --sweep, 4 variants on 2 workers (1,000 Azure requests)":
            ["simulate", azure, *roofline, "--sweep", "num_kvcache_blocks=20000,40000,80000,160000", "--jobs", "2"],
    }


def run_command(tree: str, argv: list[str], out: str) -> float:
    if os.path.exists(out):
        os.remove(out)     # each run writes a new file, as a user's would
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
    wall = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tracengine.cli", *argv], cwd=tree, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - wall
    if done.returncode:
        sys.exit(f"`tracengine {' '.join(argv)}` in {tree} failed:\n{done.stderr}")
    return wall


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the commit to compare this tree with")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = checkout(args.before, tmp)
        mooncake_like(os.path.join(tmp, "mooncake.jsonl"))
        azure_like(os.path.join(tmp, "azure.csv"))
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(QWEN3_8B, f)
        cmds = commands(tmp)
        out = os.path.join(tmp, "out")
        # the trace the commands read: this tree's recording of the Mooncake simulation
        run_command(ROOT, [*cmds["simulate --record (1,000 Mooncake requests)"][:-3], "--record",
                           os.path.join(tmp, "sim.trace"), "--quiet"], out)
        print(f"{'command':<66} {'before':>8} {'after':>8} {'after / before':>15}")
        for name, argv in cmds.items():
            times = {"before": [], "after": []}
            for i in range(args.repeats):
                order = (("before", before), ("after", ROOT))
                for side, tree in order if i % 2 == 0 else order[::-1]:
                    times[side].append(run_command(tree, argv, out))
            b, a = statistics.median(times["before"]), statistics.median(times["after"])
            print(f"{name:<66} {b:>7.2f}s {a:>7.2f}s {a / b:>15.2f}")
        print(f"(wall seconds, median of {args.repeats} runs each, the two sides alternating)")


if __name__ == "__main__":
    main()
