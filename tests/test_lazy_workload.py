"""A workload file read as the simulation takes its requests (workload.formats.iter_workload,
sim.engine.run_timed with an iterator): the same run as the file read whole, with the run
holding only the requests that have arrived."""
import json
import random

import pytest

from tracengine.analysis.stats import stats
from tracengine.cli.main import main
from tracengine.engine.config import Config
from tracengine.errors import TracengineError
from tracengine.sim.engine import simulate
from tracengine.sim.steptime import LinearStepTime
from tracengine.trace.events import RequestAdded, StepEnd
from tracengine.trace.views import without_wall_clock
from tracengine.trace.tracelog import TraceReader
from tracengine.workload.formats import iter_workload, read_workload

FEATURES = ("const", "tokens", "seqs", "context", "attended")
PARTS = ("schedule_ns", "model_ns", "postprocess_ns")


def fixed_step_time(prefill_ms=100.0, decode_ms=10.0) -> dict:
    """A linear step-time model of two constants, as a step-time file holds it."""
    def phase(ms):
        return {part: [ms * 1e6 if part == "model_ns" and f == "const" else 0.0 for f in FEATURES] for part in PARTS}
    return {"kind": "linear", "features": list(FEATURES), "parts": list(PARTS), "gap_ns": 0, "wake_ns": 0,
            "coefficients": {"prefill": phase(prefill_ms), "decode": phase(decode_ms)}, "source": {"model": "fixed"}}


def write_mooncake(path, num_requests=40, seed=1):
    """Conversations whose turns repeat the hash ids of the turn before, Poisson arrivals (ms)."""
    rng, t, next_id, conversations, lines = random.Random(seed), 0.0, 0, [], []
    for _ in range(num_requests):
        t += rng.expovariate(1 / 300)
        if conversations and rng.random() < 0.4:
            i = rng.randrange(len(conversations))
            conversations[i] = hash_ids = conversations[i] + list(range(next_id, next_id + 2))
            next_id += 2
        else:
            hash_ids = list(range(next_id, next_id + rng.randint(1, 4)))
            next_id += len(hash_ids)
            conversations.append(hash_ids)
        lines.append(json.dumps({"timestamp": round(t), "input_length": len(hash_ids) * 512 - rng.randrange(512),
                                 "output_length": rng.randint(1, 40), "hash_ids": hash_ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_workload_read_lazily_gives_the_run_of_the_workload_read_whole(tmp_path):
    path = write_mooncake(tmp_path / "conversations.jsonl")
    config = Config(num_kvcache_blocks=3000, kvcache_block_size=16, max_num_batched_tokens=1024, max_num_seqs=8,
                    max_model_len=32768, scheduling_policy="mixed")
    step_time = LinearStepTime.from_dict(fixed_step_time())
    whole = simulate(config, read_workload(str(path), vocab_size=1000, hash_id_prompts=True), step_time)
    lazy = simulate(config, iter_workload(str(path), vocab_size=1000, hash_id_prompts=True), step_time)
    assert [without_wall_clock(e) for e in lazy[1:]] == [without_wall_clock(e) for e in whole[1:]]
    assert sum(type(e) is RequestAdded for e in lazy) == 40
    assert stats(lazy) == stats(whole)


def test_a_lazy_run_takes_each_request_when_it_arrives(tmp_path):
    """The run pulls a request from the file only when the simulated clock reaches it: by the
    time it takes the last one, it has run most of its steps (it never read the file first)."""
    from tracengine.trace.sinks import ListSink
    path = write_mooncake(tmp_path / "conversations.jsonl")
    config = Config(num_kvcache_blocks=3000, kvcache_block_size=16, max_num_batched_tokens=1024, max_num_seqs=8,
                    max_model_len=32768)
    sink, steps_when_taken = ListSink(), []

    def watched(requests):
        for r in requests:
            steps_when_taken.append(sum(type(e) is StepEnd for e in sink.events))
            yield r
    simulate(config, watched(iter_workload(str(path), vocab_size=1000, hash_id_prompts=True)),
             LinearStepTime.from_dict(fixed_step_time()), sink)
    num_steps = sum(type(e) is StepEnd for e in sink.events)
    assert steps_when_taken == sorted(steps_when_taken) and steps_when_taken[0] == 0
    assert steps_when_taken[-1] > num_steps // 2


def test_simulate_reads_its_workload_lazily_to_the_same_trace(tmp_path, capsys):
    """`tracengine simulate` with max_model_len given reads as it goes; without it, whole (the
    longest request sets max_model_len): given that length, the same trace."""
    path = write_mooncake(tmp_path / "conversations.jsonl")
    step_time = tmp_path / "fixed.json"
    step_time.write_text(json.dumps(fixed_step_time()))
    common = [str(path), "--step-time", str(step_time), "--quiet", "--num-kvcache-blocks", "3000",
              "--max-num-batched-tokens", "1024", "--scheduling-policy", "mixed"]
    assert main(["simulate", *common, "--record", str(tmp_path / "whole.trace")]) == 0
    with TraceReader(str(tmp_path / "whole.trace")) as reader:
        max_model_len = reader.header.config["max_model_len"]
        whole = list(reader.events())
    assert main(["simulate", *common, "--max-model-len", str(max_model_len),
                 "--record", str(tmp_path / "lazy.trace")]) == 0
    with TraceReader(str(tmp_path / "lazy.trace")) as reader:
        lazy = list(reader.events())
    assert [without_wall_clock(e) for e in lazy[1:]] == [without_wall_clock(e) for e in whole[1:]]
    out = capsys.readouterr().out
    assert out.count("simulated 40 requests") == 2


def test_a_bad_line_of_a_lazily_read_workload_is_a_one_line_error(tmp_path, capsys):
    path = write_mooncake(tmp_path / "conversations.jsonl", num_requests=10)
    path.write_text(path.read_text() + '{"timestamp": 1, "input_length": 5}\n')
    step_time = tmp_path / "fixed.json"
    step_time.write_text(json.dumps(fixed_step_time()))
    assert main(["simulate", str(path), "--step-time", str(step_time), "--quiet", "--num-kvcache-blocks", "3000",
                 "--max-model-len", "32768"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: ") and "conversations.jsonl:11" in err and err.count("\n") == 1
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(TracengineError, match="no requests"):
        list(iter_workload(str(tmp_path / "empty.jsonl"), "mooncake", vocab_size=1000))


def test_stats_of_a_recorded_simulation_are_the_simulations_own(tmp_path, capsys):
    """The figures simulate prints (folded live, lean) are `tracengine stats` of its trace, whose
    hash-id prompts' blocks are PromptBlocksHashed events (format 7)."""
    path = write_mooncake(tmp_path / "conversations.jsonl")
    step_time = tmp_path / "fixed.json"
    step_time.write_text(json.dumps(fixed_step_time()))
    trace = str(tmp_path / "sim.trace")
    assert main(["simulate", str(path), "--step-time", str(step_time), "--quiet", "--num-kvcache-blocks", "3000",
                 "--max-num-batched-tokens", "1024", "--max-model-len", "32768", "--record", trace]) == 0
    simulated = capsys.readouterr().out.splitlines()
    assert main(["stats", trace]) == 0
    recorded = capsys.readouterr().out.splitlines()
    assert simulated[2:-1] == recorded[1:] and simulated[1] == "simulated run" and recorded[0] == trace
    with TraceReader(trace) as reader:
        assert any(type(e).__name__ == "PromptBlocksHashed" for e in reader.events())
