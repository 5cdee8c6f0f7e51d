"""Writes traces/format-v1.trace: a small trace of format version 1 holding
every event type, kept forever so that tests/test_tracelog.py proves newer
tracengines still read it. Run once per new format version (name the file
after it); never regenerate a released one.

    python scripts/make_format_trace.py [OUT]
"""
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracengine.config import Config  # noqa: E402
from tracengine.llm_engine import LLMEngine  # noqa: E402
from tracengine.replay.scripted import SyntheticRunner  # noqa: E402
from tracengine.sampling_params import SamplingParams  # noqa: E402
from tracengine.tracelog import FORMAT_VERSION, TraceReader, TraceWriter, make_header  # noqa: E402

EOS = 999


def main(out: Path) -> None:
    # 10 blocks of 4 tokens and a budget of 16: seq 0 (20 tokens) is chunked 16 + 4, seq 1
    # hits its 8-token prefix, seq 2 preempts itself, seq 3 stops on EOS, the others on length
    config = Config(num_kvcache_blocks=10, kvcache_block_size=4, max_num_batched_tokens=16,
                    max_num_seqs=4, max_model_len=64, eos=EOS)
    with TraceWriter(out, make_header(config)) as writer:
        engine = LLMEngine(config, SyntheticRunner(eos=EOS, eos_at={3: 2}), writer)
        prefix = list(range(500, 508))
        engine.add_request(prefix + list(range(20, 32)), SamplingParams(max_tokens=8))
        engine.step()
        engine.step()
        engine.add_request(prefix + list(range(40, 45)), SamplingParams(max_tokens=8))
        engine.add_request(list(range(60, 66)), SamplingParams(max_tokens=10))
        engine.add_request(list(range(70, 75)), SamplingParams(max_tokens=6))
        while not engine.is_finished():
            engine.step()
    with TraceReader(out) as reader:
        counts = collections.Counter(type(e).__name__ for e in reader.events())
        print(f"{out}: format version {FORMAT_VERSION}, {reader.num_frames} frames, {dict(counts)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "traces"
         / f"format-v{FORMAT_VERSION}.trace")
