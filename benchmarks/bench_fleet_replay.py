"""A fleet trace's re-execution against the simulation that wrote it, as whole processes.

The workload is benchmarks/bench_vs_dynamo.py's (Mooncake-format conversations, 512-token hash
ids), run by 4 replicas behind round robin: block 16, 25,000 blocks a replica, a budget of
16,384 tokens, `mixed`, fixed step times (100 ms with prompt tokens, 10 ms decode only). Each
size: `simulate --record` then `replay` of that trace, in turn, `--repeats` times; prints the
median wall seconds of each and their ratio (replay / simulate), and of `check` and `diff`
(the trace against itself). Re-execution follows the trace's own order, so its time should
grow with the trace's length as the simulation's does.

    python benchmarks/bench_fleet_replay.py [--requests 50,200,1000] [--repeats 3]"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from bench_vs_dynamo import conversation_workload, fixed_step_time      # noqa: E402

CLI = [sys.executable, "-m", "tracengine.cli"]


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="50,200,1000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'requests':>8}  {'simulate s':>10}  {'replay s':>8}  {'ratio':>5}  {'check s':>7}  {'diff s':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        step_time = os.path.join(tmp, "fixed.json")
        fixed_step_time(step_time)
        for num_requests in (int(n) for n in args.requests.split(",")):
            workload = os.path.join(tmp, f"conversation_{num_requests}.jsonl")
            trace = os.path.join(tmp, f"fleet_{num_requests}.trace")
            conversation_workload(workload, num_requests)
            simulate = [*CLI, "simulate", workload, "--step-time", step_time, "--quiet", "--scheduling-policy",
                        "mixed", "--block-size", "16", "--num-kvcache-blocks", "25000",
                        "--max-num-batched-tokens", "16384", "--replicas", "4", "--router", "round_robin",
                        "--record", trace, "--force"]
            times: dict[str, list[float]] = {"simulate": [], "replay": [], "check": [], "diff": []}
            for _ in range(args.repeats):       # in turn, so drift in the machine's speed hits both
                times["simulate"].append(wall(simulate))
                times["replay"].append(wall([*CLI, "replay", trace]))
                times["check"].append(wall([*CLI, "check", trace]))
                times["diff"].append(wall([*CLI, "diff", trace, trace]))
            med = {name: statistics.median(values) for name, values in times.items()}
            print(f"{num_requests:>8,}  {med['simulate']:>10.2f}  {med['replay']:>8.2f}  "
                  f"{med['replay'] / med['simulate']:>5.2f}  {med['check']:>7.2f}  {med['diff']:>6.2f}")


if __name__ == "__main__":
    main()
