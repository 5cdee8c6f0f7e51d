"""`tracengine simulate` on Mooncake-format workloads of two sizes, whole processes: time per
request and peak memory at each size, and the recorded trace of the smaller one (its size,
its replay, its `stats` against the simulation's own figures).

The workloads are bench_vs_dynamo.py's (the conversation trace's statistics), with its fixed
step times and settings (block size 16, 100,000 blocks, budget 16,384, 256 sequences,
max_model_len 131,072: given, so the file is read as the run goes). Runs alternate between the
sizes (and, with --baseline, between this tree and another checkout's); medians.

    python benchmarks/bench_simulate_scale.py [--requests 1000,12000] [--repeats 3] [--baseline DIR]"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vs_dynamo import ROOT, conversation_workload, fixed_step_time, tracengine_argv   # noqa: E402


def run_in(tree: str, argv: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MB, CPU seconds) of argv run as a whole process in `tree`, with
    `tree` first on the path (`python -m` puts the working folder first: it must be the tree)."""
    env = {**os.environ, "PYTHONPATH": tree + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tree)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{argv[0]} failed in {tree}: {proc.stderr.read().decode()[-2000:]}")
    proc.stderr.close()
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", default="1000,12000", help="comma-separated workload sizes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", help="another checkout of tracengine, run alternately with this one")
    args = parser.parse_args()
    trees = {"this tree": ROOT, **({"baseline": os.path.abspath(args.baseline)} if args.baseline else {})}
    with tempfile.TemporaryDirectory() as tmp:
        step_time = os.path.join(tmp, "fixed.json")
        fixed_step_time(step_time)
        sizes = [int(n) for n in args.requests.split(",")]
        workloads = {}
        for n in sizes:
            workloads[n] = os.path.join(tmp, f"conversation_{n}.jsonl")
            conversation_workload(workloads[n], n)
        runs = {(tree, n): [] for tree in trees for n in sizes}
        for _ in range(args.repeats):          # alternating: sizes and trees, whole processes
            for n in sizes:
                for tree, path in trees.items():
                    runs[tree, n].append(run_in(path, tracengine_argv(workloads[n], step_time, 16)))
        print(f"tracengine simulate, block size 16 (median of {args.repeats}, alternating):")
        for (tree, n), r in runs.items():
            wall, rss, cpu = (statistics.median(run[k] for run in r) for k in range(3))
            print(f"  {tree:<10} {n:>6,} requests  wall {wall:7.2f} s  CPU {cpu:7.2f} s  peak RSS {rss:6.0f} MB  "
                  f"per request {wall / n * 1e3:.2f} ms wall, {cpu / n * 1e3:.2f} ms CPU")
        n = sizes[0]
        trace = os.path.join(tmp, "sim.trace")
        out = subprocess.run(tracengine_argv(workloads[n], step_time, 16, trace), capture_output=True, text=True,
                             check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}).stdout
        cli = [sys.executable, "-m", "tracengine.cli"]
        replay = subprocess.run([*cli, "replay", trace], capture_output=True, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": ROOT})
        stats = subprocess.run([*cli, "stats", trace], capture_output=True, text=True, check=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": ROOT}).stdout
        own = [line for line in out.splitlines()[2:] if not line.startswith("wrote")]
        same = own == [line for line in stats.splitlines()[1:]]
        print(f"recorded, {n:,} requests: {os.path.getsize(trace) / 1e6:.2f} MB; replay: "
              f"{replay.stdout.strip() or replay.stderr.strip()}; stats equal the simulation's own: {same}")


if __name__ == "__main__":
    main()
