"""Trace size: bytes per event in the trace file against the same events as
JSON Lines (`msgspec.json.encode(to_builtins(e))`, one per line, as
`tracengine events --json` prints them), and how fast events are written and
read. Workloads of 200 requests through LLMEngine + SyntheticRunner, no model.

    python benchmarks/bench_trace_size.py
"""
import collections
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402

from tracengine.config import Config  # noqa: E402
from tracengine.events import EVENT_TYPES, ListSink, StepEnd, to_builtins  # noqa: E402
from tracengine.llm_engine import LLMEngine  # noqa: E402
from tracengine.replay.scripted import SyntheticRunner  # noqa: E402
from tracengine.sampling_params import SamplingParams  # noqa: E402
from tracengine.tracelog import TraceWriter, make_header, open_trace  # noqa: E402

EOS = 0
NUM_REQUESTS = 200
CONFIG = Config(kvcache_block_size=16, num_kvcache_blocks=160, max_num_batched_tokens=512, max_num_seqs=32,
                max_model_len=1024, eos=EOS)

# name: (prompt lengths, output lengths, vocabulary, share of requests with a 32-token shared prefix)
WORKLOADS = {
    "mix":       ((64, 256), (32, 128), 1000, 0.3),     # `generate --num-prompts 200` lengths
    "mix-qwen3": ((64, 256), (32, 128), 151936, 0.3),   # the same with Qwen3's vocabulary
    "chat":      ((16, 64), (64, 256), 1000, 0.5),      # short prompts, longer answers
}


def run_workload(prompt_lens, output_lens, vocab_size, shared, seed=0) -> list:
    rng = random.Random(seed)
    prefix = [rng.randrange(1, vocab_size) for _ in range(32)]
    sink = ListSink()
    engine = LLMEngine(CONFIG, SyntheticRunner(vocab_size=vocab_size, eos=EOS, seed=seed), sink)
    for _ in range(NUM_REQUESTS):
        prompt = [rng.randrange(1, vocab_size) for _ in range(rng.randint(*prompt_lens))]
        if rng.random() < shared:
            prompt = prefix + prompt
        engine.add_request(prompt, SamplingParams(temperature=1.0, max_tokens=rng.randint(*output_lens)))
    while not engine.is_finished():
        engine.step()
    return sink.events


def best_of(repeats, fn) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(events: list, path: str) -> dict:
    header = make_header(CONFIG)

    def write():
        with TraceWriter(path, header) as writer:
            for event in events:
                writer.emit(event)

    encoder = msgspec.msgpack.Encoder()
    frames, frame = [], []
    for event in events:
        frame.append(event)
        if type(event) is StepEnd:
            frames.append(frame)
            frame = []
    buffer = bytearray()

    def encode_only():
        for f in frames:
            encoder.encode_into(f, buffer, 12)

    write_s = best_of(5, write)
    encode_s = best_of(5, encode_only)
    read_s = best_of(3, lambda: sum(1 for _ in open_trace(path)))
    json_encode = msgspec.json.Encoder().encode
    num_events = len(events) + 1
    return dict(events=num_events, trace_bytes=os.path.getsize(path),
                jsonl_bytes=sum(len(json_encode(to_builtins(e))) + 1 for e in [header] + events),
                steps=len(frames), write_eps=num_events / write_s, encode_eps=len(events) / encode_s,
                read_eps=num_events / read_s)


def by_type(events: list) -> dict[str, tuple[int, int, int]]:
    encode, json_encode = msgspec.msgpack.Encoder().encode, msgspec.json.Encoder().encode
    count, packed, jsonl = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        name = type(e).__name__
        count[name] += 1
        packed[name] += len(encode(e))
        jsonl[name] += len(json_encode(to_builtins(e))) + 1
    return {name: (count[name], packed[name], jsonl[name]) for name in EVENT_TYPES if count[name]}


def main():
    print(f"{NUM_REQUESTS} requests per workload; {CONFIG.num_kvcache_blocks} KV blocks x {CONFIG.kvcache_block_size}, "
          f"budget {CONFIG.max_num_batched_tokens}, max {CONFIG.max_num_seqs} seqs\n")
    print(f"{'workload':<10} {'steps':>6} {'events':>7} {'trace B':>9} {'B/event':>8} {'JSONL B':>10} "
          f"{'B/event':>8} {'ratio':>6}  {'write ev/s':>10} {'encode ev/s':>11} {'read ev/s':>10}")
    first_events = None
    with tempfile.TemporaryDirectory() as tmp:
        for name, workload in WORKLOADS.items():
            events = run_workload(*workload)
            first_events = first_events or events
            m = measure(events, os.path.join(tmp, f"{name}.trace"))
            print(f"{name:<10} {m['steps']:>6} {m['events']:>7} {m['trace_bytes']:>9,} "
                  f"{m['trace_bytes'] / m['events']:>8.1f} {m['jsonl_bytes']:>10,} {m['jsonl_bytes'] / m['events']:>8.1f} "
                  f"{m['jsonl_bytes'] / m['trace_bytes']:>5.1f}x  {m['write_eps']:>10,.0f} {m['encode_eps']:>11,.0f} "
                  f"{m['read_eps']:>10,.0f}")
    print(f"\nby event type ({next(iter(WORKLOADS))}; msgpack without framing):")
    print(f"{'type':<18} {'events':>7} {'B/event':>8} {'JSONL B/event':>14} {'ratio':>6} {'share of trace':>15}")
    rows = by_type(first_events)
    total = sum(packed for _, packed, _ in rows.values())
    for name, (count, packed, jsonl) in rows.items():
        print(f"{name:<18} {count:>7} {packed / count:>8.1f} {jsonl / count:>14.1f} {jsonl / packed:>5.1f}x "
              f"{100 * packed / total:>14.0f}%")


if __name__ == "__main__":
    main()
