"""Simulation speed: 1,000 requests of a Mooncake-format workload through the
real scheduler in simulated time, recorded, beside the 1.3 s NVIDIA Dynamo's
mocker publishes for 1,000 requests of Mooncake's conversation trace.

The workload is made here with that trace's statistics (Mooncake's
conversation trace: mean prompt about 13,700 tokens, mean output about 350,
arrivals over about 330 s, long shared prefixes): conversations whose turns
extend the turn before, each on one of a few system prompts, as hash ids of
512-token blocks. Step times: a roofline of a Qwen3-8B-shaped model on an
H200. Block size 16, 100,000 blocks. Timed recorded (as `simulate --record` writes),
and recorded with the events also folded live into the run's figures (what the
command does for the summary it prints), alternately.

Then the cost per simulated step at 1,000, 10,000 and 100,000 blocks, on the
same workload cut to a twentieth of its lengths (so that it fits 1,000
blocks): a step should cost the same whatever the size of the KV cache.

    python benchmarks/bench_simulate.py [--requests 1000] [--repeats 3]"""
import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tracengine.analysis.stats import stats                       # noqa: E402
from tracengine.analysis.timeline_sink import RequestTimelineSink       # noqa: E402
from tracengine.engine.config import Config                       # noqa: E402
from tracengine.sim.roofline import ModelShape, RooflineStepTime   # noqa: E402
from tracengine.sim.engine import simulate, simulation_header   # noqa: E402
from tracengine.trace.sinks import NULL_SINK  # noqa: E402
from tracengine.trace.tracelog import TraceWriter                 # noqa: E402
from tracengine.workload import read_workload                     # noqa: E402

DYNAMO_SECONDS = 1.3       # Dynamo mocker: 1,000 Mooncake requests (313.6 s of serving) in about 1.3 s
QWEN3_8B = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936, "torch_dtype": "bfloat16"}
BLOCK = 512


def mooncake_like(path: str, num_requests: int = 1000, seed: int = 0, duration_s: float = 330.0):
    """Write a Mooncake JSONL workload with the conversation trace's statistics."""
    rng = random.Random(seed)
    next_id = 0

    def new_blocks(n):
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    systems = [new_blocks(rng.randint(4, 12)) for _ in range(8)]     # system prompts of 2k-6k tokens
    conversations = []     # each: its hash ids so far
    t, lines, rate = 0.0, [], num_requests / duration_s
    for _ in range(num_requests):
        t += rng.expovariate(rate)
        if conversations and rng.random() < 0.75:   # a later turn: the whole conversation so far, plus the turn
            i = rng.randrange(len(conversations))
            history = conversations[i]
        else:
            history = list(rng.choice(systems))
            conversations.append(history)
            i = len(conversations) - 1
        hash_ids = history + new_blocks(rng.randint(1, 10))
        if len(hash_ids) > 60:                       # a conversation that outgrew the context starts over
            hash_ids = list(rng.choice(systems)) + new_blocks(rng.randint(6, 24))
        conversations[i] = hash_ids
        input_length = len(hash_ids) * BLOCK - rng.randrange(BLOCK)
        output_length = max(1, min(2000, round(rng.lognormvariate(5.68, 0.6))))
        lines.append(json.dumps({"timestamp": round(t * 1000), "input_length": input_length,
                                 "output_length": output_length, "hash_ids": hash_ids}))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def run(requests, num_blocks, record_dir=None, fold=False, build_events=True):
    """One simulation; `fold`: its events also folded live into the run's figures, as
    `tracengine simulate` does for the summary it prints; `build_events=False`: no event built."""
    config = Config(num_kvcache_blocks=num_blocks, kvcache_block_size=16,
                    max_model_len=max(len(r.prompt) + r.max_tokens for r in requests))
    step_time = RooflineStepTime.for_hardware(ModelShape.from_hf_config(QWEN3_8B, "Qwen3-8B"), "H200")
    header = simulation_header(config, step_time)
    path = None if record_dir is None else os.path.join(record_dir, f"sim-{num_blocks}.trace")
    if path is not None and os.path.exists(path):
        os.remove(path)      # a new file, as `simulate --record` writes one: the last run's is not truncated in the time
    wall, cpu = time.perf_counter(), time.process_time()
    if not build_events:
        simulate(config, requests, step_time, NULL_SINK, header)     # a sink that is off: no event built
        events = None
    elif record_dir is None:
        events = simulate(config, requests, step_time)
        path = None
    else:
        with TraceWriter(path, header, deflate=False) as writer:    # as `simulate --record` writes
            simulate(config, requests, step_time, RequestTimelineSink(header, writer) if fold else writer, header)
        events = path
    return time.perf_counter() - wall, time.process_time() - cpu, events


def pool_setup_s(num_blocks: int) -> float:
    """CPU seconds to build a scheduler's block pool of `num_blocks` (once per run), with the
    collector paused as the simulation pauses it."""
    import gc
    from tracengine.engine.block_manager import BlockManager
    gc.disable()
    t = time.process_time()
    BlockManager(num_blocks, 16)
    setup = time.process_time() - t
    gc.enable()
    return setup


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workload = os.path.join(tmp, "mooncake.jsonl")
        mooncake_like(workload, args.requests)
        t = time.perf_counter()
        requests = read_workload(workload, vocab_size=QWEN3_8B["vocab_size"], hash_id_prompts=True)   # as simulate reads it
        read_s = time.perf_counter() - t
        prompt = statistics.mean(len(r.prompt) for r in requests)
        output = statistics.mean(r.max_tokens for r in requests)
        print(f"workload: {len(requests)} requests, mean prompt {prompt:,.0f} tokens, mean output {output:,.0f}, "
              f"arrivals over {requests[-1].arrival_s:.0f} s (read in {read_s:.2f} s, not counted below)")
        walls, cpus, folded = [], [], []
        for _ in range(args.repeats):      # alternately: recorded, and recorded and folded as the command does
            wall, cpu, path = run(requests, 100_000, tmp)
            walls.append(wall)
            cpus.append(cpu)
            folded.append(run(requests, 100_000, tmp, fold=True)[1])
        s = stats(path)
        size = os.path.getsize(path)
        print(f"simulated {s['steps']['num_steps']:,} steps, {s['steps']['total_s']:.1f} s of serving, "
              f"{s['preemption']['num_preemptions']} preemptions, prefix-cache token hit rate "
              f"{s['prefix_cache']['token_hit_rate']:.1%}, trace {size / 1e6:.1f} MB")
        print(f"recorded, 100,000 blocks: wall {statistics.median(walls):.2f} s, CPU {statistics.median(cpus):.2f} s "
              f"(median of {args.repeats}; runs {', '.join(f'{w:.2f}' for w in walls)} s) "
              f"vs Dynamo mocker {DYNAMO_SECONDS} s: {statistics.median(walls) / DYNAMO_SECONDS:.2f}x its time")
        print(f"recorded and folded live, as `tracengine simulate --record` runs: CPU {statistics.median(folded):.2f} s "
              f"(runs {', '.join(f'{c:.2f}' for c in folded)} s)")
        wall, cpu, events = run(requests, 100_000)
        print(f"not recorded (events in memory), 100,000 blocks: wall {wall:.2f} s, CPU {cpu:.2f} s")
        del events
        floor = [run(requests, 100_000, build_events=False)[1] for _ in range(args.repeats)]
        print(f"no events at all (the scheduler, block manager and runner alone): CPU "
              f"{statistics.median(floor):.2f} s (runs {', '.join(f'{c:.2f}' for c in floor)} s)")

        short = read_workload(workload, vocab_size=QWEN3_8B["vocab_size"], length_scale=0.05, hash_id_prompts=True)
        print("cost per step, the workload at 1/20 of its lengths (recorded); the block pool's one-time "
              "construction apart:")
        for num_blocks in (1_000, 10_000, 100_000):
            runs = [run(short, num_blocks, tmp) for _ in range(args.repeats)]
            cpu = statistics.median(r[1] for r in runs)
            setup = statistics.median(pool_setup_s(num_blocks) for _ in range(args.repeats))
            num_steps = stats(runs[0][2])["steps"]["num_steps"]
            print(f"  {num_blocks:>7,} blocks: {num_steps:>6,} steps, CPU {cpu:.3f} s, of which the pool's "
                  f"construction {setup:.3f} s; {(cpu - setup) / num_steps * 1e6:,.1f} us per step")


if __name__ == "__main__":
    main()
