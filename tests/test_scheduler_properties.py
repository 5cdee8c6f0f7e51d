"""Invariants of the scheduler and the block manager on random workloads:
after every step the block pool is consistent, the fold equals the live
state, every request finishes, and the recorded run replays exactly."""
import random
from unittest import mock

import pytest
import xxhash
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tracengine.engine.block_hasher import compute_hash
from tracengine.engine import scheduler as scheduler_module
from tracengine.engine.block_manager import BlockManager
from tracengine.engine.reference_block_manager import ReferenceBlockManager
from tracengine.engine.reference_vllm_block_manager import ReferenceVllmBlockManager
from tracengine.engine.vllm_block_manager import VllmBlockManager
from tracengine.engine import policies as policies_module
from tracengine.engine.config import Config
from tracengine.engine.scheduler import Scheduler
from tracengine.trace.events import (BlockAllocate, Preempt, RequestAdded, ScheduleDecision, SeqFinish, TokenSample,
                                     prefill_flags)
from tracengine.trace.views import without_wall_clock
from tracengine.trace.sinks import ListSink
from tracengine.replay.fold import Fold
from tracengine.replay.state import live_state
from tracengine.replay.reexec import reexecute
from tracengine.sim.runners import SyntheticRunner, run_workload
from tracengine.engine.request import Request
from tracengine.testing import random_workload
from tracengine.trace.tracelog import make_header

EOS = 999


def blocks_needed(request: Request, config: Config) -> int:
    longest = min(len(request.prompt) + request.max_tokens, config.max_model_len)
    return -(-longest // config.kvcache_block_size)


def check_block_invariants(scheduler):
    bm = scheduler.block_manager
    num_blocks = len(bm.blocks)
    free = list(bm.free_block_ids)
    # the blocks some live block table holds (counted here, not read from the manager)
    live = [*scheduler.waiting, *scheduler.running]
    occurrences = [0] * num_blocks
    for seq in live:
        for block_id in seq.block_table:
            occurrences[block_id] += 1
    used = {block_id for block_id, n in enumerate(occurrences) if n}
    # free and used partition the pool
    assert len(free) == len(set(free))
    assert set(free).isdisjoint(used)
    assert set(free) | used == set(range(num_blocks))
    # ref counts are >= 0 and count the block tables that hold the block
    assert [b.ref_count for b in bm.blocks] == occurrences
    assert all((b.ref_count > 0) == (b.block_id in used) for b in bm.blocks)
    # every hash entry points at a block holding a full block of tokens under that hash
    for h, block_id in bm.hash_to_block_id.items():
        block = bm.blocks[block_id]
        assert block.hash == h and len(block.token_ids) == bm.block_size
    # with prefix caching off nothing is registered; with it on each computed full block of a live
    # sequence holds its tokens, hashed as a chain
    assert bm.enable_caching or not bm.hash_to_block_id
    for seq in live if bm.enable_caching else ():
        parent = -1
        for i in range(min(seq.num_cached_tokens, seq.num_tokens) // bm.block_size):
            block = bm.blocks[seq.block_table[i]]
            assert block.token_ids == seq.block(i)
            assert block.hash == compute_hash(seq.block(i), parent)
            parent = block.hash


def check_fold_equals_live(fold, engine, fifo: bool = True):
    state = fold.state_at(engine.num_steps - 1)
    live = live_state(engine.scheduler, engine.num_steps - 1)
    assert state.running == live.running
    # a policy that reorders waiting leaves no event of it: the fold keeps arrival order
    assert state.waiting == live.waiting if fifo else sorted(state.waiting) == sorted(live.waiting)
    assert state.ref_counts == live.ref_counts and state.hashes == live.hashes
    assert state.free_block_ids == live.free_block_ids
    assert state.hash_to_block_id == live.hash_to_block_id
    for seq_id, seq in live.seqs.items():
        folded = state.seqs[seq_id]
        assert (folded.status, folded.num_tokens, folded.num_cached_tokens, folded.block_table,
                folded.num_preemptions) == (seq.status, seq.num_tokens, seq.num_cached_tokens, seq.block_table,
                                            seq.num_preemptions)


def run_checked(config: Config, requests: list[Request], eos_at: dict[int, int], keyframe_interval: int,
                policy=None):
    """Run with every check after every step; returns the recorded events."""
    sink = ListSink()
    fold = None
    num_folded = 0

    def on_step(engine):
        nonlocal num_folded, fold
        if fold is None:     # the engine's config names the policy and the block rules it resolved
            fold = Fold([make_header(engine.config)], keyframe_interval=keyframe_interval)
        check_block_invariants(engine.scheduler)
        fold.append(sink.events[num_folded:])      # follow mode: the step's events just arrived
        num_folded = len(sink.events)
        check_fold_equals_live(fold, engine, fifo=policy is None or policy.order_waiting is Scheduler.order_waiting)

    max_steps = 50 * sum(len(r.prompt) + r.max_tokens for r in requests) + 100
    events = run_workload(config, requests, SyntheticRunner(eos=EOS, eos_at=eos_at), sink=sink,
                          max_steps=max_steps, on_step=on_step, policy=policy)
    assert sum(type(e) is SeqFinish for e in events) == len(requests)     # every request finished
    return events


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    vocab = draw(st.integers(2, 50))               # a small vocabulary makes prefixes collide often
    prefix = draw(st.lists(st.integers(0, vocab), min_size=0, max_size=3 * block_size))
    requests = []
    for _ in range(draw(st.integers(1, 8))):
        shared = prefix[:draw(st.integers(0, len(prefix)))]
        own = draw(st.lists(st.integers(0, vocab), min_size=0 if shared else 1, max_size=24))
        requests.append(Request(shared + own, draw(st.integers(1, 10)), arrival_step=draw(st.integers(0, 8)), ignore_eos=draw(st.booleans())))
    eos_at = draw(st.dictionaries(st.integers(0, len(requests) - 1), st.integers(0, 9), max_size=3))
    config = Config(kvcache_block_size=block_size, max_num_batched_tokens=draw(st.integers(1, 48)),
                    max_num_seqs=draw(st.integers(1, 6)), max_model_len=draw(st.integers(24, 64)),
                    num_kvcache_blocks=1, eos=EOS)
    requests = [r for r in requests if len(r.prompt) <= config.max_model_len]
    # just enough blocks for the largest request, plus a few: preemption is common
    most = max([blocks_needed(r, config) for r in requests], default=1)
    config = config.replace(num_kvcache_blocks=most + draw(st.integers(0, 6)))
    return config, requests, eos_at


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(1, 6))
def test_invariants_hold_after_every_step_and_the_run_replays(workload, keyframe_interval):
    config, requests, eos_at = workload
    assume(requests)
    events = run_checked(config, requests, eos_at, keyframe_interval)
    event("preempted" if any(type(e) is Preempt for e in events) else "no preemption")
    event("prefix-cache hit" if any(type(e) is BlockAllocate and e.num_cached_blocks for e in events) else "no hit")
    result = reexecute(events)
    assert result.ok, result.divergence
    assert result.num_events == len(events) - 1


@pytest.mark.patches_core
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.booleans(), st.sampled_from(["prefill_first", "mixed"]), st.sampled_from([True, True, False]))
def test_the_block_manager_gives_the_events_of_the_plain_reference(workload, colliding, policy, caching):
    """The same run, event for event, with the engine's BlockManager (a pool with an O(1)
    free queue, batched, tokens compared in bulk) and with ReferenceBlockManager (nano-vllm's
    plain form), and under `mixed` with VllmBlockManager and ReferenceVllmBlockManager (vLLM's
    block rules); `colliding`: with a digest of eight values, so that equal hashes say nothing
    of equal tokens and the token comparison decides; `caching`: prefix caching on or off."""
    config, requests, eos_at = workload
    assume(requests)
    config = config.replace(scheduling_policy=policy, enable_prefix_caching=caching)
    real = xxhash.xxh64_intdigest
    with mock.patch.object(xxhash, "xxh64_intdigest", (lambda data: real(data) & 7) if colliding else real):
        runs = []
        for manager, vllm_manager in ((BlockManager, VllmBlockManager),
                                      (ReferenceBlockManager, ReferenceVllmBlockManager)):
            with mock.patch.object(scheduler_module, "BlockManager", manager), \
                    mock.patch.object(policies_module, "VllmBlockManager", vllm_manager):
                runs.append(run_workload(config, requests, SyntheticRunner(eos=EOS, eos_at=eos_at)))
    assert [without_wall_clock(e) for e in runs[0][1:]] == [without_wall_clock(e) for e in runs[1][1:]]
    event("prefix-cache hit" if any(type(e) is BlockAllocate and e.num_cached_blocks for e in runs[0]) else "no hit")


def test_a_hundred_seeded_random_workloads_replay():
    num_preempted = 0
    for seed in range(100):
        rng = random.Random(seed)
        config = Config(kvcache_block_size=rng.choice([1, 2, 4, 8]), max_num_batched_tokens=rng.randint(4, 64),
                        max_num_seqs=rng.randint(1, 8), max_model_len=128, num_kvcache_blocks=1, eos=EOS)
        requests = random_workload(rng, rng.randint(1, 12), max_prompt_len=40, max_output_len=16,
                                   block_size=config.kvcache_block_size)
        most = max(blocks_needed(r, config) for r in requests)
        config = config.replace(num_kvcache_blocks=most + rng.randint(0, 8))
        events = run_workload(config, requests, SyntheticRunner(eos=EOS, eos_at={0: rng.randint(0, 4)}))
        assert sum(type(e) is SeqFinish for e in events) == len(requests)
        result = reexecute(events)
        assert result.ok, (seed, result.divergence)
        num_preempted += any(type(e) is Preempt for e in events)
    assert num_preempted >= 20      # the block counts do force preemption


def check_mixed_decisions(events, config: Config):
    """The mixed policy's limits, step by step: the budget, max_num_seqs, one token per
    decode, a phase that says what the batch holds, at most one prefill left partial."""
    num_tokens = {}
    for e in events[1:]:
        if type(e) is RequestAdded:
            num_tokens[e.seq_id] = len(e.prompt_token_ids)
        elif type(e) is TokenSample and e.kept:
            num_tokens[e.seq_id] += 1
        elif type(e) is ScheduleDecision:
            assert 0 < e.num_batched_tokens == sum(s.num_tokens for s in e.seqs) <= config.max_num_batched_tokens
            assert 0 < len(e.seqs) <= config.max_num_seqs and e.num_running <= config.max_num_seqs
            prefill = prefill_flags(e)
            assert e.phase == ("mixed" if any(prefill) and not all(prefill) else "prefill" if all(prefill)
                               else "decode")
            assert all(s.num_tokens == 1 and s.num_cached_tokens == num_tokens[s.seq_id] - 1
                       for s, p in zip(e.seqs, prefill) if not p)
            partial = [s for s, p in zip(e.seqs, prefill) if p and s.num_cached_tokens + s.num_tokens
                       < num_tokens[s.seq_id]]
            assert len(partial) <= 1 and (not partial or partial[0] is e.seqs[-1])   # the last one, cut


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(1, 6), st.sampled_from(["auto", "nano-vllm"]), st.sampled_from([True, True, False]))
def test_mixed_invariants_hold_after_every_step_and_the_run_replays(workload, keyframe_interval, rules, caching):
    """Under vLLM's block rules (auto) and nano-vllm's (mixed traces recorded before them), with
    prefix caching on or off."""
    config, requests, eos_at = workload
    assume(requests)
    config = config.replace(scheduling_policy="mixed", block_rules=rules, enable_prefix_caching=caching)
    events = run_checked(config, requests, eos_at, keyframe_interval)    # blocks, ref counts, all finish
    event("mixed batch" if any(type(e) is ScheduleDecision and e.phase == "mixed" for e in events) else "no mix")
    event("preempted" if any(type(e) is Preempt for e in events) else "no preemption")
    check_mixed_decisions(events, config)
    result = reexecute(events)
    assert result.ok, result.divergence
    assert result.num_events == len(events) - 1


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(["ShortestFirst", "AtMostTwoRunning", "MixedPreemptingHead"]))
def test_user_policies_keep_the_invariants_and_replay_with_their_class(workload, name):
    """The hooks reorder waiting, refuse admission and pick another victim: the pool stays
    consistent, the fold follows, every request finishes, the run replays with the class."""
    import user_policies
    config, requests, eos_at = workload
    assume(requests)
    policy = getattr(user_policies, name)
    events = run_checked(config, requests, eos_at, 3, policy=policy)
    assert events[0].config["scheduling_policy"] == f"user_policies:{name}"
    result = reexecute(events, policy)
    assert result.ok, result.divergence
