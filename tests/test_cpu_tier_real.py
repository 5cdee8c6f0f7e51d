"""The CPU tier in a real run of the embedded model (runner/kv_host.py): its KV blocks are copied
to a host buffer and back, so the tokens are those of the run without the tier; the trace
replays exactly and its stats show the hits."""
import json
import random

import pytest

from tracengine.cli import main
from tracengine.errors import ConfigError
from tracengine.trace.events import CpuHit, CpuLoad, TokenSample
from tracengine.trace.tracelog import TraceReader

# one request at a time over a GPU cache of 12 blocks: a shared prefix is evicted from the GPU
# by the next prompts and found again in the CPU tier
GENERATE = ["generate", "--max-tokens", "4", "--temperature", "0", "--scheduling-policy", "mixed",
            "--num-kvcache-blocks", "12", "--max-num-seqs", "1", "--device", "cpu", "--quiet"]
TIER = ["--kv-offloading-size", "0.01", "--kv-offloading-bandwidth-gbps", "1"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    rng = random.Random(0)
    words = "the scheduler decides which request runs next while the prefix cache keeps shared blocks".split()
    prefixes = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(3)]
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{prefixes[i % 3]} {' '.join(rng.choices(words, k=1 + i % 7))}"})
                            + "\n" for i in range(12)))
    return str(path)


def tokens(path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for event in TraceReader(path).events():
        if type(event) is TokenSample and event.kept:
            out.setdefault(event.seq_id, []).append(event.token_id)
    return out


def test_a_real_run_copies_its_blocks_to_the_tier_and_back(tmp_path, prompts, capsys):
    without, with_tier = tmp_path / "without.trace", tmp_path / "tier.trace"
    assert main([*GENERATE, "--prompts-file", prompts, "--record", str(without)]) == 0
    assert main([*GENERATE, *TIER, "--prompts-file", prompts, "--record", str(with_tier)]) == 0
    events = list(TraceReader(str(with_tier)).events())
    assert sum(len(e.hashes) for e in events if type(e) is CpuHit) > 0
    assert any(type(e) is CpuLoad for e in events)
    assert tokens(str(with_tier)) == tokens(str(without))
    capsys.readouterr()
    assert main(["replay", str(with_tier)]) == 0
    assert "reproduced exactly" in capsys.readouterr().out
    assert main(["stats", str(with_tier), "--json"]) == 0
    cpu = json.loads(capsys.readouterr().out)["cpu_tier"]
    assert cpu["num_hit_blocks"] > 0 and cpu["bytes_to_gpu"] > 0


def test_without_the_copies_the_loaded_blocks_would_change_the_tokens(tmp_path, prompts, monkeypatch):
    """The check above means something: loads that bring back zeros instead give other tokens."""
    from tracengine.runner import kv_host

    def load_zeros(self, keys, block_ids):
        self.kv_cache[:, :, block_ids] = 0
    monkeypatch.setattr(kv_host.HostKVBuffer, "load", load_zeros)
    without, with_tier = tmp_path / "without.trace", tmp_path / "tier.trace"
    assert main([*GENERATE, "--prompts-file", prompts, "--record", str(without)]) == 0
    assert main([*GENERATE, *TIER, "--prompts-file", prompts, "--record", str(with_tier)]) == 0
    assert tokens(str(with_tier)) != tokens(str(without))


def test_the_tier_under_tensor_parallelism_is_refused_in_one_line():
    from tracengine.engine.llm import LLM
    with pytest.raises(ConfigError, match="tensor_parallel_size > 1"):
        LLM(kv_offloading_size=1.0, scheduling_policy="mixed", tensor_parallel_size=2, device="cpu")
