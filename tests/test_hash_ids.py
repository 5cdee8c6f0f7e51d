"""Requests known by their hash ids (engine/hash_id_prompt.py): scheduled from block hashes
made from the hash ids, never expanded into tokens, recorded as hash ids, read back exactly."""
import random

import msgspec
import pytest

from tracengine.cli import main
from tracengine.engine.block_hasher import compute_hashes
from tracengine.engine.config import Config
from tracengine.engine.hash_id_prompt import HashIdPrompt, hashed_blocks, request_prompt
from tracengine.engine.sequence import Sequence
from tracengine.replay.diff import diff_traces
from tracengine.replay.reexec import reexecute
from tracengine.replay.whatif import whatif
from tracengine.engine.request import Request
from tracengine.sim.runners import SyntheticRunner, run_workload
from tracengine.trace.events import PromptBlocksHashed, RequestAdded
from tracengine.trace.views import without_wall_clock
from tracengine.trace.tracelog import FORMAT_VERSION, TraceReader, write_trace


def conversation_prompts(rng, num_requests, block_tokens):
    """Prompts of hash ids that repeat and extend earlier ones (a conversation's turns), cut
    at any length inside their last hash id."""
    prompts, next_id = [], 0
    for _ in range(num_requests):
        if prompts and rng.random() < 0.7:
            base = rng.choice(prompts).hash_ids
            ids = base[:rng.randrange(1, len(base) + 1)]
        else:
            ids = []
        new = rng.randrange(0 if ids else 1, 4)
        ids = ids + list(range(next_id, next_id + new))
        next_id += new
        num_tokens = rng.randrange((len(ids) - 1) * block_tokens + 1, len(ids) * block_tokens + 1)
        prompts.append(HashIdPrompt(ids, num_tokens, block_tokens))
    return prompts


@pytest.mark.parametrize("block_size", [1, 4, 16, 6])
def test_a_prompts_block_hashes_are_those_of_the_tokens_it_stands_for(block_size):
    """By hash id (16 tokens each, a multiple of the block size) or, where blocks straddle
    hash ids (6), from the tokens: the chain of the twin's tokens either way."""
    rng = random.Random(block_size)
    for prompt in conversation_prompts(rng, 40, 16):
        twin = list(prompt)
        assert len(twin) == len(prompt) and twin[-1] == prompt[-1] and twin[3:9] == prompt[3:9]
        assert prompt.block_hashes(block_size) == compute_hashes(twin, block_size)
        seq = Sequence(0, prompt, block_size)
        assert seq.block_hashes == compute_hashes(twin, block_size) and not seq.has_tokens
        for token in range(2 * block_size + 1):        # decoded tokens after it: the twin's chain
            seq.append_token(token)
        assert seq.hash_full_blocks() == compute_hashes(twin + list(range(2 * block_size + 1)), block_size)


def test_a_hash_id_prompt_refuses_lengths_its_hash_ids_cannot_hold():
    with pytest.raises(ValueError, match="cannot hold a prompt of 33 tokens"):
        HashIdPrompt([1, 2], 33, 16)
    with pytest.raises(ValueError, match="cannot hold a prompt of 16 tokens"):
        HashIdPrompt([1, 2], 16, 16)        # its second hash id would name no token
    assert HashIdPrompt([5, 6], 20, 16)[16:20] == [96, 97, 98, 99]     # 6 * 16 + 0 ...


def workload(prompts, rng):
    return [Request(p, rng.randrange(1, 40), ignore_eos=True, seq_id=i, arrival_step=i // 3)
            for i, p in enumerate(prompts)]


def scheduling(events):
    """The events but RequestAdded's prompt fields (token ids for one, hash ids for the other), a
    hash-id prompt's PromptBlocksHashed as the BlockHash events it stands for (a token prompt's)."""
    out = []
    for e in events[1:]:
        if type(e) is RequestAdded:
            e = msgspec.structs.replace(e, prompt_token_ids=[], prompt_hash_ids=[], num_hash_id_prompt_tokens=0,
                                        hash_id_block_tokens=0)
        out += map(without_wall_clock, hashed_blocks(e) if type(e) is PromptBlocksHashed else [e])
    return out


@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
@pytest.mark.parametrize("block_size, num_blocks", [(4, 400), (16, 100), (16, 14), (6, 300)])
def test_hash_id_requests_and_their_token_twins_give_the_same_events_and_hashes(policy, block_size, num_blocks):
    """The same decisions, block ids and BlockHash values, with prefix-cache hits and (14
    blocks) preemptions; the twins' prefix cache compares tokens, the hash-id one hashes only."""
    rng = random.Random(block_size + num_blocks)
    prompts = conversation_prompts(rng, 30, 16)
    config = Config(num_kvcache_blocks=num_blocks, kvcache_block_size=block_size, max_num_batched_tokens=48,
                    max_num_seqs=6, max_model_len=256, scheduling_policy=policy)
    by_hash_ids = run_workload(config, workload(prompts, random.Random(0)), SyntheticRunner(eos=-1))
    by_tokens = run_workload(config, workload([list(p) for p in prompts], random.Random(0)), SyntheticRunner(eos=-1))
    assert scheduling(by_hash_ids) == scheduling(by_tokens)
    kinds = {type(e).__name__ for e in by_hash_ids}
    assert "PromptBlocksHashed" in kinds and ("Preempt" in kinds) == (num_blocks == 14)
    assert "BlockHash" in kinds     # a block filled by decoded tokens: hashed from them, recorded
    assert "PromptBlocksHashed" not in {type(e).__name__ for e in by_tokens}
    assert any(getattr(e, "num_cached_blocks", 0) for e in by_hash_ids)       # hits
    added = [e for e in by_hash_ids if type(e) is RequestAdded]
    assert all(e.prompt_token_ids == [] and request_prompt(e) == p for e, p in zip(added, prompts))


def test_a_trace_of_hash_id_requests_replays_diffs_and_whatifs_exactly(tmp_path):
    rng = random.Random(3)
    prompts = conversation_prompts(rng, 30, 16)
    config = Config(num_kvcache_blocks=60, kvcache_block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
                    max_model_len=256)
    events = run_workload(config, workload(prompts, rng), SyntheticRunner(eos=-1))
    path = tmp_path / "hash_ids.trace"
    write_trace(str(path), events)
    with TraceReader(str(path)) as reader:
        read = list(reader.events())
        assert reader.version == FORMAT_VERSION
    assert read[1:] == events[1:]
    assert reexecute(read).ok
    assert diff_traces(read, events).identical
    same = whatif(read, {})
    assert scheduling(same.events) == scheduling(read)
    assert main(["replay", str(path)]) == 0 and main(["diff", str(path), str(path)]) == 0
    assert main(["stats", str(path)]) == 0


@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
def test_the_lean_live_fold_gives_the_figures_of_the_whole_one(policy):
    """simulate folds its run live keeping only what stats() reads: the same figures as the
    fold of every event (per request too), with preemptions, hits and mixed steps."""
    from tracengine.analysis.stats import stats
    from tracengine.analysis.timeline import RequestTimeline
    rng = random.Random(5)
    config = Config(num_kvcache_blocks=14, kvcache_block_size=16, max_num_batched_tokens=48, max_num_seqs=6,
                    max_model_len=256, scheduling_policy=policy)
    events = run_workload(config, workload(conversation_prompts(rng, 30, 16), rng), SyntheticRunner(eos=-1))
    whole, lean = RequestTimeline(events[0]), RequestTimeline(events[0], lean=True)
    for e in events[1:]:
        whole.add(e)
        lean.add(e)
    assert stats(lean) == stats(whole) == stats(events)
    assert stats(lean)["preemption"]["num_preemptions"] and stats(lean)["prefix_cache"]["num_hit_blocks"]
    assert all(not r.scheduled for r in lean.requests.values())
    assert not lean.steps and len(whole.steps) == lean.num_steps     # lean: the steps' sums, not the steps


def test_a_disaggregated_fleet_hands_a_hash_id_prompt_to_its_decode_side_and_replays(tmp_path, capsys):
    """simulate reads Mooncake prompts as hash ids; a prefill replica hands each to a decode
    replica as the tokens it stands for (the same block hashes: the transferred blocks hit)."""
    from pathlib import Path
    data = Path(__file__).parent / "data"
    out = str(tmp_path / "pd.trace")
    assert main(["simulate", str(data / "mooncake_sample.jsonl"), "--step-time", str(data / "fixed_steptime.json"),
                 "--length-scale", "0.1", "--block-size", "4", "--num-kvcache-blocks", "80", "--prefill-replicas", "1",
                 "--decode-replicas", "1", "--max-tokens", "8", "--quiet", "--record", out]) == 0
    with TraceReader(out) as reader:
        added = [e for e in reader.events() if type(e) is RequestAdded]
    assert any(e.prompt_hash_ids for e in added) and any(e.prompt_token_ids for e in added)   # prefill, decode
    assert main(["replay", out]) == 0
    capsys.readouterr()


def test_format_7_records_a_hash_id_prompts_blocks_as_their_hash_ids_and_reads_back_the_same_hashes():
    """traces/hash_ids_v7.trace is hash_ids.trace's run recorded in format 7: each chunk of a
    prompt's blocks is one PromptBlocksHashed (hashes not stored), which readers expand into the
    BlockHash events format 4 recorded, chunks that start inside a hash id included."""
    from pathlib import Path
    from tracengine.replay.fold import Fold
    traces = Path(__file__).parent.parent / "traces"
    with TraceReader(str(traces / "hash_ids.trace")) as old, TraceReader(str(traces / "hash_ids_v7.trace")) as new:
        old_events, new_events = list(old.events()), list(new.events())
        assert (old.version, new.version) == (4, 7)
    chunks = [e for e in new_events if type(e) is PromptBlocksHashed]
    assert chunks and any(e.first_block * e.block_size % e.hash_id_block_tokens for e in chunks)
    assert scheduling(new_events) == scheduling(old_events)
    assert diff_traces(old_events, new_events).identical
    last = len([e for e in old_events if type(e).__name__ == "StepEnd"]) - 1
    assert Fold(new_events).state_at(last).hash_to_block_id == Fold(old_events).state_at(last).hash_to_block_id
    assert reexecute(new_events).ok and reexecute(old_events).ok      # replay of the older format too


@pytest.mark.parametrize("damage", [{"hash_ids": []}, {"hash_id_block_tokens": 0}, {"block_size": 8},
                                    {"hash_ids": [2**62]}])
def test_a_prompt_blocks_event_its_hash_ids_cannot_stand_for_does_not_follow(damage):
    """`check` (EventCheck) refuses a PromptBlocksHashed whose hash ids cannot hold its blocks, or
    whose block size is not the pool's, naming it, rather than failing on it."""
    from pathlib import Path
    from tracengine.errors import TraceError
    from tracengine.replay.event_check import EventCheck
    from tracengine.trace.views import iter_steps
    with TraceReader(str(Path(__file__).parent.parent / "traces" / "hash_ids_v7.trace")) as reader:
        events = list(reader.events())
    check = EventCheck(events[0])
    first = next(e for e in events if type(e) is PromptBlocksHashed)
    with pytest.raises(TraceError, match="PromptBlocksHashed, does not follow"):
        for step in iter_steps(events[1:]):
            check.frame([msgspec.structs.replace(e, **damage) if e is first else e for e in step])
