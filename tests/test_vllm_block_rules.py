"""vLLM 0.33's block rules (engine/vllm_block_manager.py), which the `mixed`
policy runs by default, and the config field that says which rules a run used
(old traces: nano-vllm's). The comparison with vLLM's own scheduler is in
tests/test_vllm.py; the plain reference in tests/test_scheduler_properties.py."""
import pytest

from tracengine.engine.block_hasher import compute_hashes
from tracengine.engine.free_block_queue import FreeKVCacheBlockQueue
from tracengine.engine.config import Config, recorded_block_rules
from tracengine.engine.request import Request
from tracengine.engine.sequence import Sequence
from tracengine.engine.vllm_block_manager import VllmBlockManager
from tracengine.errors import ConfigError
from tracengine.replay.diff import diff_traces
from tracengine.replay.reexec import reexecute
from tracengine.replay.whatif import whatif
from tracengine.sim.runners import run_workload
from tracengine.trace.events import BlockAllocate, BlockAppend, BlockHash, ScheduleDecision
from tracengine.trace.sinks import ListSink
from tracengine.trace.tracelog import open_trace
from pathlib import Path

from helpers import allocate_with_hits, blocks_needed

TRACES = Path(__file__).parent.parent / "traces"


def admit(manager: VllmBlockManager, seq: Sequence, num_new_tokens: int):
    num_cached_blocks, num_new_blocks = blocks_needed(manager, seq)
    assert num_new_blocks <= manager.num_free_blocks
    allocate_with_hits(manager, seq, num_cached_blocks, num_new_tokens)


def compute(seq: Sequence, num_tokens: int):
    """The step ran: `num_tokens` more of seq's tokens are computed."""
    seq.num_cached_tokens += num_tokens


def test_prepend_n_puts_blocks_at_the_head_in_order():
    queue = FreeKVCacheBlockQueue(6)
    taken = queue.popleft_n(4)
    queue.prepend_n([2, 0])
    queue.append_n([3])
    assert list(queue) == [2, 0, 4, 5, 3] and taken == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        queue.prepend_n([5])


def test_admission_allocates_the_first_chunk_and_registers_its_full_blocks_at_once():
    sink = ListSink()
    manager = VllmBlockManager(16, 4, sink)
    seq = Sequence(0, list(range(22)), 4)           # 6 blocks, the last partial
    admit(manager, seq, 10)                          # the first chunk: 10 tokens, 3 blocks
    assert seq.block_table == [0, 1, 2] and manager.num_free_blocks == 13
    hashes = compute_hashes(list(range(20)), 4)
    assert isinstance(sink.events[0], BlockAllocate) and sink.events[0].block_ids == [0, 1, 2]
    assert [(e.block_id, e.hash) for e in sink.events[1:]] == [(0, hashes[0]), (1, hashes[1])]
    # a sequence with the same prompt, admitted in the same step, hits the two registered blocks
    twin = Sequence(1, list(range(22)), 4)
    assert blocks_needed(manager, twin) == (2, 4)
    compute(seq, 10)
    sink.events.clear()
    assert manager.allocate_slots(seq, 12)           # the rest: 22 tokens, blocks 3 to 5
    assert seq.block_table == [0, 1, 2, 3, 4, 5]
    assert [type(e) for e in sink.events] == [BlockAppend] * 3 + [BlockHash] * 3
    assert [e.block_id for e in sink.events if type(e) is BlockHash] == [2, 3, 4]


def test_allocate_slots_refuses_when_the_free_blocks_do_not_cover_the_chunk():
    manager = VllmBlockManager(5, 4)
    seq = Sequence(0, list(range(20)), 4)
    admit(manager, seq, 8)                           # the whole sequence fits; 2 of its 5 blocks taken
    compute(seq, 8)
    other = Sequence(1, [99] * 8, 4)
    admit(manager, other, 8)                         # 1 free block left
    assert not manager.allocate_slots(seq, 8)        # needs 2
    assert seq.block_table == [0, 1] and manager.num_free_blocks == 1
    assert manager.allocate_slots(seq, 4)


def test_a_freed_block_without_a_hash_is_reused_first_a_hashed_one_evicted_last():
    manager = VllmBlockManager(8, 4)
    seq = Sequence(0, list(range(10)), 4)            # blocks 0, 1 full (hashed), 2 partial
    admit(manager, seq, 10)
    manager.deallocate(seq)                          # tail first: 2 to the head; 1, 0 to the tail
    assert list(manager.free_block_ids) == [2, 3, 4, 5, 6, 7, 1, 0]


def test_the_first_block_registered_under_a_hash_is_found_until_it_is_handed_out():
    manager = VllmBlockManager(8, 4)
    a, b = Sequence(0, list(range(8)), 4), Sequence(1, list(range(8)), 4)
    admit(manager, a, 8)                             # blocks 0, 1, both registered
    admit(manager, b, 4)                             # hits block 0; computes its last block itself
    assert b.block_table == [0, 2]
    assert manager.hash_to_block_id[compute_hashes(list(range(8)), 4)[1]] == 1   # a's, not b's
    manager.deallocate(a)
    manager.deallocate(b)                            # free: 3..7, then 1, 2 (b's block registered second)
    c = Sequence(2, list(range(12)), 4)
    assert manager.cached_block_ids(c) == [0, 1]
    manager.pool.get_new_blocks(5)
    manager.prefix_cache.evict(manager.pool.get_new_blocks(1))   # block 1 handed out: block 2 is found now
    assert manager.cached_block_ids(c) == [0, 2]


def test_with_prefix_caching_off_nothing_hits_and_nothing_is_registered():
    sink = ListSink()
    manager = VllmBlockManager(8, 4, sink, enable_caching=False)
    a, b = Sequence(0, list(range(9)), 4), Sequence(1, list(range(9)), 4)
    admit(manager, a, 9)
    admit(manager, b, 9)
    assert b.num_cached_tokens == 0 and not manager.hash_to_block_id
    assert not any(type(e) is BlockHash for e in sink.events)


WORKLOAD = [Request(list(range(40)) + [i] * 30, 12, arrival_step=i, ignore_eos=True) for i in range(6)]


def test_mixed_runs_vllm_block_rules_and_the_trace_says_so():
    config = Config(num_kvcache_blocks=24, kvcache_block_size=8, max_num_batched_tokens=48, max_model_len=256)
    mixed = run_workload(config.replace(scheduling_policy="mixed"), WORKLOAD)
    assert mixed[0].config["block_rules"] == "vllm"
    assert run_workload(config, WORKLOAD)[0].config["block_rules"] == "nano-vllm"
    # a chunk after the first takes its blocks when it runs: BlockAppend while still in prefill
    later_chunks = {(e.step, s.seq_id) for e in mixed if type(e) is ScheduleDecision for s in e.seqs
                    if s.num_cached_tokens > 0 and s.num_tokens > 1}
    assert any(type(e) is BlockAppend and (e.step, e.seq_id) in later_chunks for e in mixed)
    assert reexecute(mixed).ok
    nano = run_workload(config.replace(scheduling_policy="mixed", block_rules="nano-vllm"), WORKLOAD)
    assert nano[0].config["block_rules"] == "nano-vllm" and reexecute(nano).ok
    assert [type(e) for e in nano] != [type(e) for e in mixed]


def test_block_rules_vllm_needs_the_mixed_policy():
    with pytest.raises(ConfigError, match="block_rules=vllm needs the mixed policy"):
        run_workload(Config(num_kvcache_blocks=24, block_rules="vllm"), WORKLOAD)
    with pytest.raises(ConfigError, match="block_rules must be"):
        Config(block_rules="v1")


def test_a_header_without_block_rules_ran_nano_vllms():
    assert recorded_block_rules({"scheduling_policy": "mixed"}) == "nano-vllm"
    assert recorded_block_rules({"scheduling_policy": "mixed", "block_rules": "auto"}) == "vllm"
    assert recorded_block_rules({"scheduling_policy": "prefill_first", "block_rules": "auto"}) == "nano-vllm"
    assert recorded_block_rules({"scheduling_policy": "pkg.mod:Mine", "block_rules": "auto"}) == "auto"
    events = list(open_trace(TRACES / "mixed.trace"))     # recorded under mixed before the field
    assert "block_rules" not in events[0].config
    assert Config.from_dict(events[0].config).block_rules == "nano-vllm"
    assert reexecute(events).ok
    # a what-if keeps the rules it was recorded with, unless it changes the policy
    assert whatif(events, {"max_num_seqs": 3}).events[0].config["block_rules"] == "nano-vllm"


def test_a_whatif_to_mixed_runs_mixed_with_its_own_block_rules():
    config = Config(num_kvcache_blocks=24, kvcache_block_size=8, max_num_batched_tokens=48, max_model_len=256)
    first = run_workload(config, WORKLOAD)
    result = whatif(first, {"scheduling_policy": "mixed"})
    assert result.events[0].config["block_rules"] == "vllm"
    mixed = run_workload(config.replace(scheduling_policy="mixed"), WORKLOAD)
    assert diff_traces(result.events, mixed).identical


@pytest.mark.parametrize("changes", [dict(scheduling_policy="mixed"),
                                     dict(scheduling_policy="mixed", enable_prefix_caching=False),
                                     dict(enable_prefix_caching=False),
                                     dict(scheduling_policy="mixed", block_rules="nano-vllm")],
                         ids=["mixed", "mixed-no-cache", "prefill_first-no-cache", "mixed-nano-vllm"])
def test_a_pd_fleets_replicas_fold_to_their_live_block_pools_under_each_rule(changes):
    # a KV transfer lands through the prefix cache: with it off none lands, and the fold agrees
    from test_fleet import CONFIG, workload
    from test_fleet_transfers import run_live, same_pool
    from tracengine.fleet.stats import replica_streams
    from tracengine.replay.fold import Fold
    from tracengine.fleet.spec import FleetSpec
    from tracengine.trace.events import KVTransfer
    config = CONFIG.replace(num_kvcache_blocks=30, max_num_seqs=3, **changes)
    events, states = run_live(config, FleetSpec(num_prefill_replicas=1, num_decode_replicas=2), workload(24, 1))
    landed = [e.num_blocks for e in events if type(e) is KVTransfer]
    assert landed and (any(landed) == config.enable_prefix_caching)
    _, streams = replica_streams(events, transfers=True)
    for replica in (0, 1, 2):
        fold = Fold(streams[replica])
        assert fold.num_steps == len(states[replica]) > 0
        assert all(same_pool(fold.state_at(live.step), live) for live in states[replica])


def write_mixed_trace(path) -> list:
    """A mixed run under vLLM's block rules where chunks and decodes run out of blocks, at `path`."""
    from tracengine.trace.events import Preempt
    from tracengine.trace.tracelog import TraceWriter
    config = Config(num_kvcache_blocks=14, kvcache_block_size=8, max_num_batched_tokens=32, max_model_len=256,
                    scheduling_policy="mixed")
    events = run_workload(config, WORKLOAD)
    assert any(type(e) is Preempt for e in events)
    with TraceWriter(path, events[0]) as writer:
        for e in events[1:]:
            writer.emit(e)
    return events


def test_check_replay_state_and_stats_read_a_mixed_trace_under_vllms_rules(tmp_path, capsys):
    from tracengine.cli.main import main
    path = tmp_path / "mixed.trace"
    write_mixed_trace(path)
    assert main(["check", str(path)]) == 0 and "whole" in capsys.readouterr().out
    assert main(["replay", str(path)]) == 0 and "reproduced exactly" in capsys.readouterr().out
    assert main(["replay", str(path), "--state", "6"]) == 0 and "state after step 6" in capsys.readouterr().out
    assert main(["stats", str(path)]) == 0 and "preemptions" in capsys.readouterr().out


async def test_the_tui_shows_what_the_fold_says_on_a_mixed_trace_under_vllms_rules(tmp_path):
    from test_tui import assert_panels_match, opened, steps_with
    from tracengine.replay.fold import Fold
    from tracengine.trace.events import Preempt
    path = tmp_path / "mixed.trace"
    write_mixed_trace(path)
    fold = Fold.from_trace(path)
    steps = sorted({0, fold.num_steps - 1, *steps_with(fold, Preempt)[:3], *steps_with(fold, BlockAppend)[:3]})
    app, running = opened(path)
    async with running as pilot:
        await app.workers.wait_for_complete()
        for step in steps:
            app.go(step)
            await pilot.pause()
            assert_panels_match(app, fold, step)
