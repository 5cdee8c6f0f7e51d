"""Times two commands as whole processes, in turn (A B A B ...), and prints each one's CPU and
wall seconds and peak memory (min, median, max) and the ratio A/B taken pair by pair: pairing
keeps a ratio meaningful when a shared machine's speed drifts during the runs. Quote medians.

    python benchmarks/paired.py [-n RUNS] [--warmup N] --vs "COMMAND B" -- COMMAND A ...

COMMAND B is one string, split as a shell splits words; neither command gets a shell. What the
commands print is thrown away."""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time


def run_once(argv: list[str]) -> tuple[float, float, float]:
    """(cpu seconds, wall seconds, peak MiB) of one run of `argv`, its children waited for."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"paired.py: {shlex.join(argv)} exited with {code}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def line(name: str, values: list[float]) -> str:
    return f"{name:<12} {min(values):10.3f} {statistics.median(values):10.3f} {max(values):10.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--vs", required=True, help="command B, one string")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="command A (after --)")
    args = parser.parse_args()
    a = [word for word in args.command if word != "--"] if args.command[:1] == ["--"] else args.command
    b = shlex.split(args.vs)
    if not a or args.runs < 1:
        parser.error("give command A after -- and at least one run")
    for _ in range(args.warmup):
        run_once(a)
        run_once(b)
    runs_a, runs_b = [], []
    for _ in range(args.runs):
        runs_a.append(run_once(a))
        runs_b.append(run_once(b))
    print(f"A = {shlex.join(a)}\nB = {shlex.join(b)}\n{args.runs} runs each, in turn\n"
          f"{'':<12} {'min':>10} {'median':>10} {'max':>10}")
    for name, runs in (("A", runs_a), ("B", runs_b)):
        for i, what in enumerate(("cpu s", "wall s", "peak MiB")):
            print(line(f"{name} {what}", [r[i] for r in runs]))
    for i, what in enumerate(("cpu", "wall")):
        print(line(f"A/B {what}", [ra[i] / rb[i] for ra, rb in zip(runs_a, runs_b)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
