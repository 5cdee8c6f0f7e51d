"""Replay speed on a long synthetic trace: fold, re-execution, seeking.

    python benchmarks/bench_replay.py [--steps 100000] [--trace PATH]

Generates a trace of about `--steps` engine steps with the SyntheticRunner
(no model), writes it with TraceWriter, then reads it back and measures the
fold (events/s), re-execution (events/s), and the time `Fold.state_at` takes
for the last step and for random steps, all in CPU time of this process. Goals on a 2-core machine: fold at
least 500,000 events/s, re-execution 200,000, any step under 100 ms. For
comparison, NVIDIA Dynamo's scheduler mocker replays 1,000 requests in about
1.3 s."""
import argparse
import os
import random
import sys
import tempfile
import time

from tracengine.engine.config import Config
from tracengine.trace.events import RequestAdded, StepEnd, TokenSample
from tracengine.trace.sinks import NULL_SINK
from tracengine.engine.llm_engine import LLMEngine
from tracengine.replay.fold import Fold
from tracengine.trace.views import iter_steps
from tracengine.replay.reexec import reexecute
from tracengine.sim.runners import SyntheticRunner
from tracengine.replay.reexec import RecordedRunner
from tracengine.engine.sampling_params import SamplingParams
from tracengine.trace.tracelog import TraceReader, TraceWriter, make_header

# CPU time of this process: on a small shared machine, other processes change
# the wall clock of a run by 2x from one run to the next, but hardly its CPU time.
clock = time.process_time


def generate(path: str, num_steps: int, num_blocks: int, seed: int = 0) -> tuple[int, float]:
    """A steady stream of requests (a shared system prompt on half of them)
    through a small cache, so chunking, blocking, preemption and prefix hits
    all occur; stops after `num_steps` steps. Returns (requests, seconds)."""
    config = Config(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=1024, kvcache_block_size=16,
                    num_kvcache_blocks=num_blocks, eos=0, seed=seed)
    rng = random.Random(seed)
    system = [rng.randrange(1, 32000) for _ in range(64)]
    writer = TraceWriter(path, make_header(config))
    engine = LLMEngine(config, SyntheticRunner(vocab_size=32000, seed=seed, eos=0), writer)
    num_requests = 0
    start = clock()
    while engine.num_steps < num_steps:
        # arrivals while fewer than 24 requests are in flight keep the cache under pressure
        num_in_flight = len(engine.scheduler.waiting) + len(engine.scheduler.running)
        while num_in_flight == 0 or (num_in_flight < 24 and rng.random() < 0.3):
            n = rng.randint(16, 320)
            prompt = system[:min(n, 64)] if rng.random() < 0.5 else []
            prompt += [rng.randrange(1, 32000) for _ in range(n - len(prompt))]
            engine.add_request(prompt, SamplingParams(0.0, rng.randint(8, 160), True))
            num_requests += 1
            num_in_flight += 1
        engine.step()
    writer.close()
    return num_requests, clock() - start


class DiscardingSink:
    """Builds every event, keeps none: what recording costs the engine, without the file."""
    enabled = True

    def emit(self, event):
        pass


def engine_alone(events, sink=NULL_SINK) -> float:
    """The same steps without comparing: the engine's own cost, with events built or not."""
    config = Config.from_dict(events[0].config)
    runner = RecordedRunner()
    engine = LLMEngine(config, runner, sink)
    start = clock()
    for group in iter_steps(events[1:]):
        runner.tokens = tokens = {}
        for e in group:
            if type(e) is TokenSample:
                tokens[e.seq_id] = e.token_id
            elif type(e) is RequestAdded:
                engine.add_request(e.prompt_token_ids, SamplingParams(e.temperature, e.max_tokens, e.ignore_eos),
                                   seq_id=e.seq_id)
        if type(group[-1]) is StepEnd:
            engine.step()
    return clock() - start


def best_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--trace", help="keep the generated trace here (default: a temporary file)")
    parser.add_argument("--seeks", type=int, default=200, help="random steps to seek to")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the best counts")
    parser.add_argument("--blocks", type=int, default=96, help="KV blocks of 16 tokens (default 96: under pressure)")
    args = parser.parse_args(argv)

    path = args.trace or os.path.join(tempfile.mkdtemp(), "bench.trace")
    num_requests, gen_s = generate(path, args.steps, args.blocks)
    size = os.path.getsize(path)

    t0 = clock()
    with TraceReader(path) as reader:
        events = list(reader.events())
    read_s = clock() - t0
    num_events = len(events) - 1
    num_steps = reader.num_frames - 1

    result = reexecute(events)
    if not result.ok:
        print(f"replay diverged at step {result.divergence.step}: {result.divergence.reason}", file=sys.stderr)
        return 1
    # best of --repeat runs: other processes on a small machine only ever add time
    fold_s = best_of(args.repeat, lambda: Fold(events))
    reexec_s = best_of(args.repeat, lambda: reexecute(events))
    alone_s = best_of(args.repeat, lambda: engine_alone(events))
    emitting_s = best_of(args.repeat, lambda: engine_alone(events, DiscardingSink()))
    fold = Fold(events)

    t0 = clock()
    last = fold.state_at(fold.num_steps - 1)
    last_ms = (clock() - t0) * 1e3
    rng = random.Random(1)
    seeks = []
    for _ in range(args.seeks):
        step = rng.randrange(fold.num_steps)
        t0 = clock()
        fold.state_at(step)
        seeks.append((clock() - t0) * 1e3)
    seeks.sort()
    worst = max(seeks)

    print(f"trace: {num_steps:,} steps, {num_requests:,} requests, {num_events:,} events, {size / 1e6:.1f} MB "
          f"(generated in {gen_s:.1f} s, read in {read_s:.2f} s = {num_events / read_s:,.0f} events/s)")
    print(f"{'':28} {'events/s':>12} {'goal':>10} {'ratio':>7}")
    for name, seconds, goal in (("fold", fold_s, 500_000), ("re-execution", reexec_s, 200_000)):
        rate = num_events / seconds
        print(f"{name:28} {rate:12,.0f} {goal:10,} {rate / goal:7.2f}x   ({seconds:.2f} s)")
    for name, seconds in (("engine, same steps, no sink", alone_s), ("engine, events built", emitting_s)):
        print(f"{name:28} {num_events / seconds:12,.0f} {'':10} {'':7}   ({seconds:.2f} s; re-execution "
              f"takes {reexec_s / seconds:.2f}x)")
    print(f"{'':28} {'ms':>12} {'goal':>10} {'ratio':>7}")
    for name, ms in (("state_at(last step)", last_ms), ("state_at(random) median", seeks[len(seeks) // 2]),
                     ("state_at(random) max", worst)):
        print(f"{name:28} {ms:12.2f} {100:10} {100 / ms:7.1f}x")
    print(f"last state: {len(last.waiting)} waiting, {len(last.running)} running, {len(last.seqs):,} sequences, "
          f"{last.num_free_blocks} free blocks")
    print(f"Dynamo mocker reference: 1,000 requests in ~1.3 s; re-execution here: "
          f"{num_requests / reexec_s:,.0f} requests/s ({1000 / (num_requests / reexec_s):.2f} s per 1,000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
