"""A sweep on the local executor and on Ray, side by side: 16 variants (max_num_seqs x
max_num_batched_tokens) of `simulate` on the 1,000-request Mooncake-format workload made
here (bench_simulate.mooncake_like, never a public trace), a roofline of a Qwen3-8B-shaped
model on an H200, 100,000 blocks of 16 tokens. Both run two workers (this machine's cores).

Alternating, per repeat: the local executor (forked processes, which inherit the workload
the driver read); then Ray on a cluster started for the repeat (its start timed apart):
"cold" (new workers: each gets the workload's bytes and reads them once) and "warm" (the same
workers again, the workload already read). The cache is off. Then what shipping the workload
costs, once per node: its bytes put in the object store, and in a worker that has not seen
it, fetched, written to the node's file, and read.

    python benchmarks/bench_sweep_ray.py [--repeats 3] [--jobs 2]"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_simulate import QWEN3_8B, mooncake_like                                  # noqa: E402
from tracengine.process.collector import collector_paused                                    # noqa: E402
from tracengine.sim.executors import LocalExecutor, RayExecutor, run_variants        # noqa: E402
from tracengine.sim.roofline import ModelShape, RooflineStepTime                     # noqa: E402
from tracengine.sim.spec import (SIMULATE, PreparedSources, Source, SweepSpec,  # noqa: E402
                                 Variant, read_sent_source, read_source, workload_source)
from tracengine.workload.sources import WorkloadSpec                                 # noqa: E402
from tracengine.sim.sweep import parse_sweep                                         # noqa: E402

SWEEP = ["max_num_seqs=128,256,512,1024", "max_num_batched_tokens=4096,8192,16384,32768"]


def ship_probe(source: Source, data_ref: list) -> dict:
    """In a Ray worker: the seconds to fetch the source's bytes, and to read them (written to a
    file of its own and parsed, as a worker that was sent a source reads it)."""
    import ray
    start = time.perf_counter()
    data = ray.get(data_ref[0])
    fetched = time.perf_counter()
    read_sent_source(source, data)
    return {"fetch_s": fetched - start, "read_s": time.perf_counter() - fetched}


def main():
    with collector_paused():     # as the batch commands run (cli/main.py)
        sweep_both()


def sweep_both():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    import ray
    with tempfile.TemporaryDirectory() as tmp:
        workload = os.path.join(tmp, "mooncake.jsonl")
        mooncake_like(workload, 1000)
        config = os.path.join(tmp, "config.json")
        with open(config, "w") as f:
            json.dump(QWEN3_8B, f)
        source = workload_source(WorkloadSpec(workload=workload), QWEN3_8B["vocab_size"])
        step_time = RooflineStepTime.for_hardware(ModelShape.from_file(config), "H200")
        spec = SweepSpec(SIMULATE, source.digest, {"num_kvcache_blocks": 100_000, "kvcache_block_size": 16},
                         step_time.to_dict(), {"ttft": 2.0, "tpot": 0.1})
        variants = [Variant(v) for v in parse_sweep(SWEEP)]
        start = time.perf_counter()
        requests = read_source(source, workload)
        read_s = time.perf_counter() - start
        size_mb = os.path.getsize(workload) / 1e6
        print(f"{len(variants)} variants of {len(requests):,} requests ({size_mb:.2f} MB of Mooncake JSONL, read in "
              f"{read_s:.2f} s) on {args.jobs} workers; {args.repeats} repeats, alternating")
        times = {"local": [], "ray cold": [], "ray warm": [], "ray start": []}
        ship = []
        reference = None
        for _ in range(args.repeats):
            prepared = PreparedSources()
            prepared.add(source, requests)
            start = time.perf_counter()
            rows = run_variants(spec, source, variants, LocalExecutor(args.jobs), prepared).rows
            times["local"].append(time.perf_counter() - start)
            reference = reference or rows
            assert rows == reference
            start = time.perf_counter()
            ray.init(address="local", num_cpus=args.jobs, include_dashboard=False, log_to_driver=False)
            times["ray start"].append(time.perf_counter() - start)
            with RayExecutor() as executor:
                for name in ("ray cold", "ray warm"):
                    start = time.perf_counter()
                    rows = run_variants(spec, source, variants, executor, prepared).rows
                    times[name].append(time.perf_counter() - start)
                    assert rows == reference, "Ray's rows differ from the local executor's"
                # shipping: the bytes into the object store (once per run), out of it (once per node)
                start = time.perf_counter()
                ref = ray.put(source.read_bytes())
                put_s = time.perf_counter() - start
                probe = ray.get(ray.remote(ship_probe).options(num_cpus=1).remote(source, [ref]))
                ship.append({"put_s": put_s, **probe})
            ray.shutdown()
        local = statistics.median(times["local"])
        print("executor     median s   all (s)                 vs local")
        for name, values in times.items():
            ratio = f"{statistics.median(values) / local:.2f}x" if name != "ray start" else "(not in the sweep)"
            print(f"{name:<11}  {statistics.median(values):8.2f}   "
                  f"{', '.join(f'{v:.2f}' for v in values):<22}  {ratio}")
        print(f"per variant, local: {local / len(variants) * args.jobs:.2f} s of a worker")
        print("shipping the workload once per node (median s): " +
              ", ".join(f"{key[:-2]} {statistics.median(s[key] for s in ship):.3f}"
                        for key in ("put_s", "fetch_s", "read_s")))
        print("rows: Ray's equal the local executor's, row for row, in every repeat")


if __name__ == "__main__":
    main()
