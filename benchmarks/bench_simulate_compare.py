"""`bench_simulate.py`'s recorded run (1,000 Mooncake-like requests, block size
16, 100,000 blocks, the trace written as `simulate --record` writes it) with
the code of another commit and with this tree, side by side: the runs
alternate (before, after, before, ...) in fresh processes, each timing one
simulation in CPU seconds; the medians are compared, and the median of each
pair's ratio. Every run's decisions are hashed (its events but the header, the prompts and the
block hash values, which differ between token-id and hash-id prompts): before and after must
decide the same. The prompts are read as `simulate` reads them (hash ids where the tree has
them), or, with --prompts tokens, as token ids in both trees.

    python benchmarks/bench_simulate_compare.py --before REV [--repeats 5] [--requests 1000] [--prompts tokens]"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_simulate import mooncake_like       # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# Run in the tree under test, with only the API both sides have.
CHILD = r"""
import gc, sys, time, msgspec, xxhash
from tracengine.engine.config import Config
try:
    from tracengine.sim.roofline import ModelShape, RooflineStepTime
    from tracengine.sim.engine import simulate, simulation_header
except ImportError:      # a tree from before tracengine.sim
    from tracengine.replay.roofline import ModelShape, RooflineStepTime
    from tracengine.replay.simulate import simulate, simulation_header
from tracengine.trace.tracelog import TraceReader, TraceWriter
from tracengine.workload import read_workload
workload, trace, shape, prompts = sys.argv[1], sys.argv[2], eval(sys.argv[3]), sys.argv[4]
try:     # as `simulate` reads them: a tree that has hash-id prompts takes them
    requests = read_workload(workload, vocab_size=shape["vocab_size"], hash_id_prompts=prompts == "command")
except TypeError:
    requests = read_workload(workload, vocab_size=shape["vocab_size"])
config = Config(num_kvcache_blocks=100_000, kvcache_block_size=16,
                max_model_len=max(len(r.prompt) + r.max_tokens for r in requests))
step_time = RooflineStepTime.for_hardware(ModelShape.from_hf_config(shape, "Qwen3-8B"), "H200")
header = simulation_header(config, step_time)
gc.collect()
cpu = time.process_time()
with TraceWriter(trace, header, deflate=False) as writer:
    simulate(config, requests, step_time, writer, header)
cpu = time.process_time() - cpu
# The decisions, by the fields every format has: neither the header (its created_at) nor the
# prompts and hashes (which differ between token ids and hash ids), nor fields a later format
# appended (their defaults would make equal decisions hash apart).
DECIDED = {"ScheduleDecision": ("step", "phase", "num_batched_tokens", "stop_reason"),
           "Preempt": ("step", "seq_id", "by_seq_id"), "BlockAllocate": ("step", "seq_id", "block_ids", "num_cached_blocks"),
           "BlockAppend": ("step", "seq_id", "block_id"), "BlockFree": ("step", "seq_id", "block_ids"),
           "TokenSample": ("step", "seq_id", "token_id", "kept"), "SeqFinish": ("step", "seq_id", "reason"),
           "StepEnd": ("step", "num_free_blocks")}
digest = xxhash.xxh64()
with TraceReader(trace) as reader:
    for e in reader.events():
        fields = DECIDED.get(type(e).__name__)
        if fields is not None:
            seqs = [(s.seq_id, s.num_tokens, s.num_cached_tokens) for s in getattr(e, "seqs", ())]
            digest.update(msgspec.msgpack.encode([type(e).__name__, seqs, *(getattr(e, f) for f in fields)]))
print(cpu, digest.hexdigest())
"""


def checkout(commit: str, tmp: str) -> str:
    """The tree of `commit`, extracted into a new folder under `tmp`."""
    tree = os.path.join(tmp, "before")
    os.mkdir(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def run_one(tree: str, workload: str, trace: str, shape: dict, prompts: str) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", CHILD, workload, trace, repr(shape), prompts], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the run in {tree} failed:\n{done.stderr}")
    cpu, digest = done.stdout.split()
    return float(cpu), digest


def main():
    from bench_simulate import QWEN3_8B
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the commit to compare this tree with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--prompts", choices=("command", "tokens"), default="command",
                        help="Mooncake prompts as `simulate` reads them (hash ids, where a tree has them; "
                             "default) or as token ids in both trees")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = checkout(args.before, tmp)
        workload = os.path.join(tmp, "mooncake.jsonl")
        mooncake_like(workload, args.requests)
        times = {"before": [], "after": []}
        digests = set()
        for _ in range(args.repeats):
            for name, tree in (("before", before), ("after", ROOT)):
                trace = os.path.join(tmp, f"{name}.trace")
                cpu, digest = run_one(tree, workload, trace, QWEN3_8B, args.prompts)
                os.remove(trace)     # a new file each run, as `simulate --record` writes: no truncation timed
                times[name].append(cpu)
                digests.add(digest)
        b, a = statistics.median(times["before"]), statistics.median(times["after"])
        for name in ("before", "after"):
            print(f"{name:>6}: CPU {statistics.median(times[name]):.2f} s (median of {args.repeats}; runs "
                  f"{', '.join(f'{t:.2f}' for t in times[name])} s)")
        # each pair ran back to back, under much the same load: their ratio is the steadier figure
        paired = statistics.median(x / y for x, y in zip(times["after"], times["before"]))
        print(f"after / before: {a / b:.2f} of the medians, {paired:.2f} the median of the {args.repeats} pairs; the events "
              f"{'are identical' if len(digests) == 1 else 'DIFFER'} ({len(digests)} distinct trace hashes)")


if __name__ == "__main__":
    main()
