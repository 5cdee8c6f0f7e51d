"""The scheduling of canned workloads, pinned as readable step tables in
tests/snapshots/, and the facts each table shows asserted directly.

Update a table with `pytest tests/test_snapshots.py --snapshot-update` only
after reading its diff; the commit says why the scheduling changed."""
from pathlib import Path

import pytest

from tracengine.trace.events import BlockAllocate, Preempt, ScheduleDecision, SeqFinish, TokenSample
from tracengine.analysis.render import render_steps
from tracengine.sim.runners import run_workload

from tracengine.testing import CANNED_WORKLOADS, canned_workload

SNAPSHOT_DIR = Path(__file__).parent / "snapshots"


def run(name):
    config, requests, runner = canned_workload(name)
    return run_workload(config, requests, runner)


def of_type(events, cls):
    return [e for e in events if type(e) is cls]


def scheduled(decision):
    return [(s.seq_id, s.num_tokens) for s in decision.seqs]


@pytest.mark.parametrize("name", CANNED_WORKLOADS)
def test_step_table(snapshot, name):
    snapshot.snapshot_dir = SNAPSHOT_DIR
    snapshot.assert_match(render_steps(run(name)), f"{name}.txt")


def test_worked_example():
    decisions = of_type(run("worked_example"), ScheduleDecision)
    # step 0: only 20 of s0's 25 tokens fit the budget of 20
    assert decisions[0].phase == "prefill"
    assert scheduled(decisions[0]) == [(0, 20)]
    assert decisions[0].stop_reason == "budget_exhausted"
    # step 1: s0's last 25 - 20 = 5, then s1's 8 and s2's 6: 19 of 20
    assert decisions[1].phase == "prefill"
    assert scheduled(decisions[1]) == [(0, 5), (1, 8), (2, 6)]
    assert decisions[1].seqs[0].num_cached_tokens == 20
    assert decisions[1].num_batched_tokens == 19
    assert decisions[1].stop_reason == "waiting_empty"
    # then decode, one token each, until max_tokens=3 (the prefill gave the first)
    assert [d.phase for d in decisions[2:]] == ["decode", "decode"]
    assert all(scheduled(d) == [(0, 1), (1, 1), (2, 1)] for d in decisions[2:])


def test_worked_example_drops_the_middle_chunk_sample():
    samples = of_type(run("worked_example"), TokenSample)
    assert [(s.step, s.seq_id, s.kept) for s in samples[:2]] == [(0, 0, False), (1, 0, True)]


def test_head_of_line_blocking():
    events = run("head_of_line")
    decisions = of_type(events, ScheduleDecision)
    # s1 (24 tokens = 6 blocks) does not fit while s0 holds 5 + 1 of 10; s2 (1 block) would, but waits
    blocked = [d for d in decisions if d.blocked_seq_id == 1]
    assert [d.step for d in blocked] == [1, 2, 3, 4, 5, 6, 7]
    assert all(d.phase == "decode" and scheduled(d) == [(0, 1)] for d in blocked)
    assert blocked[0].num_blocks_needed == 6
    first_prefill_of_s2 = next(d for d in decisions if 2 in dict(scheduled(d)))
    assert first_prefill_of_s2.step == 8 and scheduled(first_prefill_of_s2) == [(1, 24), (2, 4)]
    assert of_type(events, SeqFinish)[0].step == 7


def test_preemption_of_the_running_tail():
    preempts = of_type(run("preemption_tail"), Preempt)
    # step 1: s0 takes the last free block; s1 needs one: the tail s3 gives way
    assert [(p.step, p.seq_id, p.by_seq_id, p.num_computed_tokens) for p in preempts] == [
        (1, 3, 1, 8),      # s3 had computed its 8 prompt tokens
        (5, 2, 0, 12)]     # s2: 8 prompt + 4 decoded tokens
    assert preempts[0].freed_block_ids == [7, 6]


def test_self_preemption():
    events = run("self_preemption")
    preempt, = of_type(events, Preempt)
    assert (preempt.step, preempt.seq_id, preempt.by_seq_id) == (1, 1, 1)
    decision = of_type(events, ScheduleDecision)[1]
    assert scheduled(decision) == [(0, 1)] and decision.stop_reason == "running_empty"


def test_recomputation_hits_the_prefix_cache():
    events = run("recompute_prefix_hit")
    preempt, = of_type(events, Preempt)
    assert (preempt.seq_id, preempt.num_computed_tokens) == (2, 20)
    realloc = [a for a in of_type(events, BlockAllocate) if a.seq_id == 2][1]
    # 3 of s2's 5 prompt blocks are still cached: 21 - 3 * 4 = 9 tokens to compute
    assert realloc.num_cached_blocks == 3 and realloc.block_ids[:3] == [3, 4, 5]
    decision = of_type(events, ScheduleDecision)[realloc.step]
    assert scheduled(decision) == [(2, 9)] and decision.seqs[0].num_cached_tokens == 12


def test_shared_prefix():
    allocs = {a.seq_id: a for a in of_type(run("shared_prefix"), BlockAllocate)}
    assert allocs[0].num_cached_blocks == 0
    # s1 shares s0's 2 prefix blocks while s0 is running; s2 finds them in the free list later
    assert allocs[1].num_cached_blocks == 2 and allocs[1].block_ids[:2] == allocs[0].block_ids[:2]
    assert allocs[2].num_cached_blocks == 2 and allocs[2].block_ids[:2] == allocs[0].block_ids[:2]


def test_max_tokens_one_finishes_in_its_prefill_step():
    finishes = of_type(run("max_tokens_one"), SeqFinish)
    assert [(f.step, f.seq_id, f.reason, f.num_completion_tokens) for f in finishes] == [
        (0, 0, "length", 1), (0, 1, "length", 1), (1, 2, "length", 2)]


def test_eos_versus_length():
    finishes = of_type(run("eos_vs_length"), SeqFinish)
    assert sorted((f.seq_id, f.step, f.reason, f.num_completion_tokens) for f in finishes) == [
        (0, 2, "eos", 3),      # eos as its third token
        (1, 0, "eos", 1),      # eos from the prefill
        (2, 2, "length", 3),   # ignore_eos: its eos at completion 1 does not stop it
        (3, 2, "length", 3)]
