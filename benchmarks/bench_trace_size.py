"""Trace size: bytes per event in the trace file against the same events as
JSON Lines (`msgspec.json.encode(to_builtins(e))`, one per line, as
`tracengine events --json` prints them), with frames stored as they are and
deflated with the preset dictionary, side by side; and how fast events are
written and read either way (written deflated: stored frames, then the
writer's compaction at close, which is also timed alone, per frame). Workloads of 200 requests through LLMEngine +
SyntheticRunner, no model; traces given on the command line (a recorded
`tracengine generate --record run.trace`) are rewritten both ways too.

    python benchmarks/bench_trace_size.py [TRACE ...]
"""
import collections
import os
import random
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402

from tracengine.engine.config import Config  # noqa: E402
from tracengine.trace.events import EVENT_TYPES, StepEnd  # noqa: E402
from tracengine.trace.views import to_builtins
from tracengine.trace.sinks import ListSink
from tracengine.engine.llm_engine import LLMEngine  # noqa: E402
from tracengine.sim.runners import SyntheticRunner  # noqa: E402
from tracengine.engine.sampling_params import SamplingParams  # noqa: E402
from tracengine.trace.dictionary import DICTIONARY  # noqa: E402
from tracengine.trace.tracelog import TraceReader, TraceWriter, compact, make_header, open_trace
from tracengine.trace.frames import WINDOW_BITS, primed_deflater

EOS = 0
NUM_REQUESTS = 200
REPEATS = 5
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
    return [make_header(CONFIG), *sink.events]


def read_trace(path) -> list:
    with TraceReader(path) as reader:
        return list(reader.events())


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(events: list, tmp: str) -> dict:
    """Sizes and throughputs of both ways of storing frames; repetitions of
    the two alternate so that the machine's noise hits both alike."""
    header, body = events[0], events[1:]
    num_events = len(events)
    paths = {deflate: os.path.join(tmp, f"deflate-{deflate}.trace") for deflate in (False, True)}

    def write(deflate):
        with TraceWriter(paths[deflate], header, deflate=deflate) as writer:
            for event in body:
                writer.emit(event)

    best = collections.defaultdict(lambda: float("inf"))
    copy = os.path.join(tmp, "compacted.trace")
    for _ in range(REPEATS):
        for deflate in (False, True):
            best["write", deflate] = min(best["write", deflate], timed(lambda: write(deflate)))
            best["read", deflate] = min(best["read", deflate],
                                        timed(lambda: sum(1 for _ in open_trace(paths[deflate]))))
        shutil.copyfile(paths[False], copy)
        best["compact"] = min(best["compact"], timed(lambda: compact(copy)))   # the writer's close, alone

    encoder = msgspec.msgpack.Encoder()
    steps, frame = [], []
    for event in body:
        frame.append(event)
        if type(event) is StepEnd:
            steps.append(frame)
            frame = []
    frames = [encoder.encode(f) for f in steps]
    deflater = primed_deflater()
    inflater = zlib.decompressobj(-WINDOW_BITS, DICTIONARY)

    def deflate_all():
        out = []
        for f in frames:
            d = deflater.copy()
            out.append(d.compress(f) + d.flush())
        return out

    deflated = deflate_all()
    buffer = bytearray()
    for _ in range(REPEATS):
        best["encode"] = min(best["encode"], timed(lambda: [encoder.encode_into(f, buffer, 12) for f in steps]))
        best["deflate"] = min(best["deflate"], timed(deflate_all))
        best["inflate"] = min(best["inflate"], timed(lambda: [inflater.copy().decompress(d) for d in deflated]))
    json_encode = msgspec.json.Encoder().encode
    return dict(events=num_events, steps=len(frames),
                jsonl_bytes=sum(len(json_encode(to_builtins(e))) + 1 for e in events),
                stored_bytes=os.path.getsize(paths[False]), deflated_bytes=os.path.getsize(paths[True]),
                write_stored=num_events / best["write", False], write_deflated=num_events / best["write", True],
                read_stored=num_events / best["read", False], read_deflated=num_events / best["read", True],
                encode_us=1e6 * best["encode"] / len(frames), deflate_us=1e6 * best["deflate"] / len(frames),
                inflate_us=1e6 * best["inflate"] / len(frames), compact_us=1e6 * best["compact"] / len(frames))


def by_type(events: list) -> dict[str, tuple[int, int, int]]:
    encode, json_encode = msgspec.msgpack.Encoder().encode, msgspec.json.Encoder().encode
    count, packed, jsonl = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        name = type(e).__name__
        count[name] += 1
        packed[name] += len(encode(e))
        jsonl[name] += len(json_encode(to_builtins(e))) + 1
    return {name: (count[name], packed[name], jsonl[name]) for name in EVENT_TYPES if count[name]}


def main(traces: list[str]):
    print(f"{NUM_REQUESTS} requests per workload; {CONFIG.num_kvcache_blocks} KV blocks x {CONFIG.kvcache_block_size}, "
          f"budget {CONFIG.max_num_batched_tokens}, max {CONFIG.max_num_seqs} seqs; best of {REPEATS}\n")
    sources = {name: (lambda w=workload: run_workload(*w)) for name, workload in WORKLOADS.items()}
    sources.update({Path(t).name: (lambda t=t: read_trace(t)) for t in traces})
    results, first_events = {}, None
    with tempfile.TemporaryDirectory() as tmp:
        for name, load in sources.items():
            events = load()
            first_events = first_events or events
            results[name] = measure(events, tmp)

    print(f"{'trace':<14} {'steps':>6} {'events':>7} {'JSONL B/ev':>10} {'stored B/ev':>11} {'ratio':>6} "
          f"{'deflated B/ev':>13} {'ratio':>6}")
    for name, m in results.items():
        n = m["events"]
        print(f"{name:<14} {m['steps']:>6} {n:>7} {m['jsonl_bytes'] / n:>10.1f} {m['stored_bytes'] / n:>11.1f} "
              f"{m['jsonl_bytes'] / m['stored_bytes']:>5.1f}x {m['deflated_bytes'] / n:>13.1f} "
              f"{m['jsonl_bytes'] / m['deflated_bytes']:>5.1f}x")

    print(f"\n{'trace':<14} {'write ev/s stored':>17} {'deflated':>9} {'read ev/s stored':>16} {'deflated':>9}   "
          f"{'per frame: encode':>17} {'deflate':>8} {'inflate':>8} {'compact':>8}")
    for name, m in results.items():
        print(f"{name:<14} {m['write_stored']:>17,.0f} {m['write_deflated']:>9,.0f} {m['read_stored']:>16,.0f} "
              f"{m['read_deflated']:>9,.0f}   {m['encode_us']:>15.1f}us {m['deflate_us']:>6.1f}us "
              f"{m['inflate_us']:>6.1f}us {m['compact_us']:>6.1f}us")

    print(f"\nby event type ({next(iter(sources))}; msgpack without framing or deflate):")
    print(f"{'type':<18} {'events':>7} {'B/event':>8} {'JSONL B/event':>14} {'ratio':>6} {'share of trace':>15}")
    rows = by_type(first_events[1:])
    total = sum(packed for _, packed, _ in rows.values())
    for name, (count, packed, jsonl) in rows.items():
        print(f"{name:<18} {count:>7} {packed / count:>8.1f} {jsonl / count:>14.1f} {jsonl / packed:>5.1f}x "
              f"{100 * packed / total:>14.0f}%")


if __name__ == "__main__":
    main(sys.argv[1:])
