"""Writes tracengine/trace/dictionary.py: the preset dictionary that deflated
trace frames are primed with (see tracengine/trace/frames.py).

The dictionary is the byte strings that recur across frames: the msgpack
shape of each event type, the phase and stop-reason strings, the StepEnd and
ScheduleDecision layouts, the header's config keys. It is chosen greedily from
the frames of a few synthetic runs (no model; fixed seeds; wall-clock fields
replaced by canned values), so the output is the same on every machine: each
round takes the segment whose k-byte substrings occur in the most frames and
are not yet covered; the best segments go last, nearest the data.

The dictionary is part of the trace format: a trace deflated with one cannot be
read with another. Once a format version is released its dictionary never
changes; a better one needs a new format version.

    python scripts/make_trace_dictionary.py [OUT]
"""
import base64
import collections
import heapq
import random
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402
import xxhash  # noqa: E402

from tracengine.version import __version__  # noqa: E402
from tracengine.engine.config import Config  # noqa: E402
from tracengine.trace.events import ModelInfo, RequestAdded, StepEnd, TraceHeader  # noqa: E402
from tracengine.engine.llm_engine import LLMEngine  # noqa: E402
from tracengine.sim.runners import SyntheticRunner  # noqa: E402
from tracengine.engine.sampling_params import SamplingParams  # noqa: E402

SEED = 20240601
DICTIONARY_BYTES = 7680   # under the 8 KiB deflate window, less its 262-byte lookahead
K = 4                     # substring length that counts as "recurring"
SEGMENT = 24              # bytes per chosen segment
STRIDE = 8                # candidate segments start every STRIDE bytes of a frame

# block size, blocks, token budget, max seqs, vocabulary, requests, prompt and output lengths,
# share of prompts after a shared prefix, share ignoring EOS
RUNS = [
    (16, 48, 256, 8, 1024, 40, (20, 200), (24, 96), 0.6, 0.8),          # like the default run
    (16, 96, 512, 16, 32000, 100, (16, 320), (8, 160), 0.5, 0.5),
    (16, 160, 512, 32, 1000, 100, (16, 64), (64, 256), 0.5, 0.2),       # chat-like
    (16, 160, 512, 32, 151936, 60, (64, 256), (32, 128), 0.3, 0.5),
    (4, 32, 64, 8, 1000, 40, (4, 60), (4, 40), 0.3, 0.5),               # tiny blocks, many preemptions
    (32, 256, 2048, 64, 50000, 80, (100, 900), (16, 64), 0.4, 0.5),     # large batches
]

MODELS = [(ModelInfo("embedded", "float32", "Qwen3ForCausalLM"), "cpu"),
          (ModelInfo("synthetic", "none", "none"), "cpu"),
          (ModelInfo("Qwen3-0.6B", "bfloat16", "Qwen3ForCausalLM"), "cuda:0")]


class CannedClock:
    """A sink that keeps frames, with plausible wall-clock values from a seeded
    generator in place of the real ones, so the frames are the same on every run."""
    enabled = True

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.frames: list[list] = [[]]

    def emit(self, event) -> None:
        rng = self.rng
        if type(event) is StepEnd:
            event = msgspec.structs.replace(event, schedule_ns=rng.randint(20_000, 400_000),
                                            model_ns=rng.randint(2_000_000, 90_000_000),
                                            postprocess_ns=rng.randint(10_000, 300_000))
        elif type(event) is RequestAdded:
            event = msgspec.structs.replace(event, created_at=1.7e9 + rng.random() * 1e8)
        self.frames[-1].append(event)
        if type(event) is StepEnd:
            self.frames.append([])


def training_frames() -> list[bytes]:
    """Each run's header frame and step frames, encoded as the writer encodes them."""
    encoder = msgspec.msgpack.Encoder()
    rng = random.Random(SEED)
    frames = []
    for block_size, num_blocks, budget, max_seqs, vocab, num_requests, prompt_lens, output_lens, shared, no_eos in RUNS:
        config = Config(kvcache_block_size=block_size, num_kvcache_blocks=num_blocks, max_num_batched_tokens=budget,
                        max_num_seqs=max_seqs, max_model_len=2048, eos=0, seed=rng.randrange(1000))
        sink = CannedClock(rng)
        engine = LLMEngine(config, SyntheticRunner(vocab_size=vocab, eos=0, seed=config.seed), sink)
        prefix = [rng.randrange(1, vocab) for _ in range(2 * block_size)]
        num_pending = num_requests
        while num_pending or not engine.is_finished():
            while num_pending and (engine.is_finished() or rng.random() < 0.2):
                prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(*prompt_lens))]
                if rng.random() < shared:
                    prompt = prefix + prompt
                engine.add_request(prompt, SamplingParams(rng.choice([0.0, 0.7, 1.0]), rng.randint(*output_lens),
                                                          rng.random() < no_eos))
                num_pending -= 1
            engine.step()
        model, device = MODELS[len(frames) % len(MODELS)]
        header = TraceHeader(1, __version__, config.to_dict(), model, device, "2.13.0", config.seed,
                             1.7e9 + rng.random() * 1e8)
        frames.append(encoder.encode([header]))
        frames.extend(encoder.encode(events) for events in sink.frames if events)
    return frames


def build_dictionary(frames: list[bytes], size: int = DICTIONARY_BYTES) -> bytes:
    """Greedy cover: segments ranked by how many frames hold each of their
    k-byte substrings, counting each substring once over the whole dictionary."""
    frame_counts = collections.Counter()
    for frame in frames:
        frame_counts.update(dict.fromkeys((frame[i:i + K] for i in range(len(frame) - K + 1)), 1))
    candidates = list(dict.fromkeys(frame[i:i + SEGMENT] for frame in frames
                                    for i in range(0, max(1, len(frame) - SEGMENT + 1), STRIDE)))

    def score(segment: bytes) -> int:
        return sum(frame_counts.get(segment[i:i + K], 0) for i in range(len(segment) - K + 1))

    heap = [(-score(c), i) for i, c in enumerate(candidates)]
    heapq.heapify(heap)
    chosen, num_bytes = [], 0
    while heap and num_bytes < size:
        negative, i = heapq.heappop(heap)
        segment = candidates[i]
        current = score(segment)
        if current != -negative:        # its substrings were covered since it was scored
            if current > 0:
                heapq.heappush(heap, (-current, i))
            continue
        chosen.append(segment)
        num_bytes += len(segment)
        for j in range(len(segment) - K + 1):
            frame_counts.pop(segment[j:j + K], None)
    return b"".join(reversed(chosen))[-size:]


MODULE = '''"""The preset dictionary of deflated trace frames, format version 1.

Written by scripts/make_trace_dictionary.py. It is part of the trace format:
traces deflated with it read only with it, so it never changes once its
format version is released (tests pin its digest)."""
import base64

DICTIONARY = base64.b64decode(
{body})
DICTIONARY_XXH64 = {digest:#018x}
'''


def main(out: Path) -> None:
    frames = training_frames()
    dictionary = build_dictionary(frames)
    encoded = base64.b64encode(dictionary).decode()
    body = "\n".join(f'    b"{line}"' for line in textwrap.wrap(encoded, 100))
    digest = xxhash.xxh64_intdigest(dictionary)
    out.write_text(MODULE.format(body=body, digest=digest))
    print(f"{out}: {len(dictionary)} bytes from {len(frames)} frames ({sum(map(len, frames)):,} bytes), "
          f"xxh64 {digest:#018x}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "tracengine"
         / "trace" / "dictionary.py")
