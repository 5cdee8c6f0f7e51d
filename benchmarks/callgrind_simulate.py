"""Instruction counts (callgrind) of the simulator's paths, with the code of
another commit and with this tree: steadier than CPU seconds on a shared
machine. Each figure is the difference of two runs of one workload, a big and
a small one, so start-up and reading the workload cancel out:

    mooncake   bench_simulate.py's recorded simulation of its first N requests (default 100)
               minus that of 1 request; in all
    decode     64 sequences of 16 prompt tokens decoding 500 tokens each, simulated and
               recorded, minus 1 token each; per decoded token
    prefill    the prompts of 300 of the Mooncake requests, not packed, through the BlockManager alone
               (lookup, allocate, hash, free; 12 live at a time) minus 1 prompt; per prompt block
    steploop   the engine's step loop (run_workload, events in memory), 8 and 1 sequences of
               100-token prompts decoding 200 tokens, 4 runs minus 1; per run

    python benchmarks/callgrind_simulate.py --before REV [--requests 100] [--only decode,prefill]

It needs valgrind, and runs the interpreter itself (sys.executable), not a shim."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
KINDS = ("mooncake", "decode", "prefill", "steploop")


def child(kind: str, size: int, workload: str, shape: dict):
    """One run of `kind` at `size`, in the tree on sys.path (this script's folder is not on it)."""
    import gc
    import inspect
    from tracengine.engine.config import Config
    from tracengine.sim.roofline import ModelShape, RooflineStepTime
    from tracengine.sim.engine import simulate, simulation_header
    from tracengine.trace.tracelog import TraceWriter
    step_time = RooflineStepTime.for_hardware(ModelShape.from_hf_config(shape, "Qwen3-8B"), "H200")
    out = os.path.join(tempfile.mkdtemp(), "sim.trace")
    if kind in ("mooncake", "prefill"):
        from tracengine.workload import read_workload
        requests = read_workload(workload, vocab_size=shape["vocab_size"])
    if kind == "mooncake":
        requests = requests[:size]
        config = Config(num_kvcache_blocks=100_000, kvcache_block_size=16,
                        max_model_len=max(len(r.prompt) + r.max_tokens for r in requests))
    elif kind == "decode":
        from tracengine.engine.request import Request
        requests = [Request(list(range(i, i + 16)), size, arrival_step=0, ignore_eos=True, seq_id=i, arrival_ns=0) for i in range(64)]
        config = Config(num_kvcache_blocks=100_000, kvcache_block_size=16, max_num_seqs=64, max_model_len=4096)
    if kind in ("mooncake", "decode"):
        header = simulation_header(config, step_time)
        gc.collect()
        with TraceWriter(out, header, deflate=False) as writer:
            simulate(config, requests, step_time, writer, header)
    elif kind == "prefill":
        from tracengine.engine.block_manager import BlockManager
        from tracengine.engine.sequence import Sequence
        from tracengine.trace.sinks import ListSink
        # No collection at all: one here would cost in proportion to the prompts made, and
        # differ between two trees by what else is alive, not by the block manager's work.
        gc.disable()
        seqs = [Sequence(i, list(r.prompt), 16) for i, r in enumerate(requests[:size])]   # not packed, as before
        del requests
        manager = BlockManager(100_000, 16, ListSink())
        live = []
        for seq in seqs:
            hits = manager.cached_block_ids(seq)
            # A tree before the hits were handed to allocate took their count.
            manager.allocate(seq, hits if "hits" in inspect.signature(manager.allocate).parameters else len(hits))
            seq.num_scheduled_tokens = seq.num_tokens - seq.num_cached_tokens
            manager.hash_blocks(seq)
            seq.num_cached_tokens, seq.num_scheduled_tokens = seq.num_tokens, 0
            live.append(seq)
            if len(live) > 12:
                manager.deallocate(live.pop(0))
    elif kind.startswith("steploop"):
        from tracengine.sim.runners import run_workload
        from tracengine.engine.request import Request
        num_seqs = int(kind[len("steploop"):])
        config = Config(num_kvcache_blocks=512, kvcache_block_size=16, max_num_seqs=8, max_model_len=1024)
        for _ in range(size):
            run_workload(config, [Request(list(range(i * 100, i * 100 + 100)), 200, arrival_step=0, ignore_eos=True)
                                  for i in range(num_seqs)])


def instructions(tree: str, kind: str, size: int, workload: str) -> int:
    from bench_simulate import QWEN3_8B
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable,
                               os.path.abspath(__file__), "child", kind, str(size), workload, json.dumps(QWEN3_8B)],
                              cwd=tree, env=dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1"),
                              capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode or not found:
        sys.exit(f"the {kind} run in {tree} failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def figures(tree: str, workload: str, requests: int, only, num_prefill_blocks: int) -> dict[str, float]:
    out = {}
    if "mooncake" in only:
        out[f"mooncake, {requests} requests (M instructions)"] = (
            instructions(tree, "mooncake", requests, workload) - instructions(tree, "mooncake", 1, workload)) / 1e6
    if "decode" in only:
        out["decode, per decoded token"] = (
            instructions(tree, "decode", 500, workload) - instructions(tree, "decode", 1, workload)) / (64 * 499)
    if "prefill" in only:
        out["prefill, per prompt block"] = (instructions(tree, "prefill", 300, workload)
                                            - instructions(tree, "prefill", 1, workload)) / num_prefill_blocks
    if "steploop" in only:
        for num_seqs in (8, 1):
            out[f"step loop, {num_seqs} sequence{'s' * (num_seqs > 1)} (M instructions a run)"] = (
                instructions(tree, f"steploop{num_seqs}", 4, workload)
                - instructions(tree, f"steploop{num_seqs}", 1, workload)) / 3 / 1e6
    return out


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the commit to compare this tree with")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--only", default=",".join(KINDS), help=f"some of {','.join(KINDS)}")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from bench_simulate import QWEN3_8B, mooncake_like
    from bench_simulate_compare import checkout
    from tracengine.workload import read_workload
    with tempfile.TemporaryDirectory() as tmp:
        before = checkout(args.before, tmp)
        workload = os.path.join(tmp, "mooncake.jsonl")
        mooncake_like(workload)        # bench_simulate's 1,000 requests, of which the first are run
        num_prefill_blocks = sum(len(r.prompt) // 16
                                 for r in read_workload(workload, vocab_size=QWEN3_8B["vocab_size"])[1:300])
        b, a = (figures(tree, workload, args.requests, only, num_prefill_blocks) for tree in (before, ROOT))
    print(f"{'':<48} {'before':>10} {'after':>10} {'after / before':>15}")
    for name in b:
        print(f"{name:<48} {b[name]:>10,.1f} {a[name]:>10,.1f} {a[name] / b[name]:>15.2f}")


if __name__ == "__main__":
    main()
