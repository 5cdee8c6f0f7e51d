"""The CPU tier of KV offloading (engine/cpu_tier.py): its config, vLLM's rules (a computed
prompt block stored once, asynchronously; LRU eviction; lookup past the GPU hits; a hit loaded
while its request waits), its transfers in simulated time, its events in re-execution, the
fold, check and stats, the what-if that adds it, and a property test against the plain
reference (engine/reference_cpu_tier.py)."""
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tracengine.cli.main import main
from tracengine.engine import policies as policies_module
from tracengine.engine.config import Config
from tracengine.engine.cpu_tier import CpuTier
from tracengine.engine.reference_cpu_tier import ReferenceCpuTier
from tracengine.engine.request import Request
from tracengine.engine.sequence import Sequence
from tracengine.errors import ConfigError
from tracengine.replay.fold import Fold
from tracengine.replay.reexec import reexecute
from tracengine.replay.state import live_state
from tracengine.sim.engine import run_timed
from tracengine.sim.runners import SyntheticRunner, run_workload
from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime
from tracengine.trace.events import BlockAllocate, CpuHit, CpuLoad, CpuStore, ScheduleDecision, SeqFinish, StepEnd
from tracengine.trace.sinks import ListSink
from tracengine.trace.views import without_wall_clock
from tracengine.trace.tracelog import make_header, write_trace

EOS = 999
PAGE = 4096


def tier_gib(num_blocks: int) -> float:
    """The kv_offloading_size that holds `num_blocks` blocks of at most a 4 KiB page each."""
    return num_blocks * PAGE / (1 << 30)


def tier_config(num_cpu_blocks: int = 8, gbps: float = 0.0, **changes) -> Config:
    values = dict(kvcache_block_size=4, num_kvcache_blocks=6, max_num_batched_tokens=64, max_num_seqs=4,
                  max_model_len=64, scheduling_policy="mixed", eos=EOS, kv_offloading_size=tier_gib(num_cpu_blocks),
                  kv_bytes_per_token=1024, kv_offloading_bandwidth_gbps=gbps)
    return Config(**{**values, **changes})


# -- config -----------------------------------------------------------------------------------

def test_the_tier_holds_its_bytes_over_a_blocks_rounded_to_a_page():
    # 390.625 GiB of 16-token blocks of 131,072 bytes a token (2 MiB each): 200,000 blocks, as vLLM sizes them
    assert Config(kv_offloading_size=390.625, kv_bytes_per_token=131072).num_cpu_blocks == 200_000
    assert tier_config(8).num_cpu_blocks == 8          # 4 x 1,024 bytes: one page a block
    assert Config().num_cpu_blocks == 0                # no tier


@pytest.mark.parametrize("changes, message", [
    (dict(kv_offloading_size=-1.0), "kv_offloading_size must be a finite number >= 0"),
    (dict(kv_bytes_per_token=-5), "kv_bytes_per_token must be a finite number >= 0"),
    (dict(kv_offloading_bandwidth_gbps=float("inf")), "kv_offloading_bandwidth_gbps must be a finite number"),
    (dict(kv_offloading_size=1e-9, kv_bytes_per_token=100), "holds no KV block of 16 tokens"),
])
def test_impossible_tier_values_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        Config(**changes)


def test_a_tier_without_bytes_per_token_or_under_prefill_first_is_refused():
    with pytest.raises(ConfigError, match="needs kv_bytes_per_token"):
        policies_module.MixedScheduler(tier_config().replace(kv_bytes_per_token=0))
    with pytest.raises(ConfigError, match="needs vLLM's block rules"):
        run_workload(tier_config(scheduling_policy="prefill_first"), [Request([1, 2, 3], 2)])


def test_the_command_line_refuses_a_negative_tier_in_one_line(tmp_path, capsys):
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"prompt_token_ids": [1, 2, 3], "max_tokens": 2, "arrival_s": 0}\n')
    code = main(["simulate", str(workload), "--step-time", "tests/data/fixed_steptime.json",
                 "--set", "num_kvcache_blocks=8", "--kv-offloading-size", "-2"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("tracengine: error: kv_offloading_size must be") and err.count("\n") == 1


# -- the rules, step by step ----------------------------------------------------------------------

def scripted(config: Config, requests: list[Request]):
    sink = ListSink()
    events = run_workload(config, requests, SyntheticRunner(eos=EOS), sink=sink)
    return events


def test_a_prompt_evicted_from_the_gpu_is_loaded_from_the_cpu_tier_while_its_request_waits():
    # A: 12 tokens, 3 full blocks of 4, stored when computed; B (16 other tokens and 4 more: 5 blocks)
    # takes the 3 fresh blocks of 6, then A's freed blocks tail first: 2 and 1. A's prompt again (C)
    # finds block 0 on the GPU and the other two in the CPU tier only
    a = list(range(1, 13))
    requests = [Request(a, 1), Request(list(range(100, 116)), 4, arrival_step=3),
                Request(a + [50], 2, arrival_step=12)]
    events = scripted(tier_config(), requests)
    stores = [e for e in events if type(e) is CpuStore]
    assert [(e.seq_id, e.first_block, len(e.hashes)) for e in stores[:2]] == [(0, 0, 3), (1, 0, 4)]
    hits = [e for e in events if type(e) is CpuHit]
    assert [(e.seq_id, e.first_block, e.hashes) for e in hits] == [(2, 1, stores[0].hashes[1:])]
    allocate = next(e for e in events if type(e) is BlockAllocate and e.seq_id == 2)
    assert allocate.num_cached_blocks == 1 and len(allocate.block_ids) == 3     # the GPU hit, then 2 to load into
    load = next(e for e in events if type(e) is CpuLoad)
    # it loaded 2 blocks and computes the 13th token only; the load ended at the next step
    assert (load.seq_id, load.num_blocks, load.num_cached_tokens, load.step) == (2, 2, 12, hits[0].step + 1)
    decision = next(e for e in events if type(e) is ScheduleDecision and e.step == load.step)
    assert [(s.seq_id, s.num_tokens, s.num_cached_tokens) for s in decision.seqs if s.seq_id == 2] == [(2, 1, 12)]
    # in the step of its hit it was set aside: scheduled nothing, and still counted as waiting
    hit_decision = next(e for e in events if type(e) is ScheduleDecision and e.step == hits[0].step)
    assert 2 not in [s.seq_id for s in hit_decision.seqs] and hit_decision.num_waiting == 1
    # nothing is stored twice: C's blocks were in the tier
    assert not [e for e in stores if e.seq_id == 2]
    assert sum(type(e) is SeqFinish for e in events) == 3


def test_without_a_tier_the_same_run_recomputes():
    a = list(range(1, 13))
    requests = [Request(a, 1), Request(list(range(100, 116)), 4, arrival_step=3),
                Request(a + [50], 2, arrival_step=12)]
    events = scripted(tier_config().replace(kv_offloading_size=0.0), requests)
    assert not [e for e in events if type(e) in (CpuStore, CpuHit, CpuLoad)]
    decision = next(e for e in events if type(e) is ScheduleDecision and any(s.seq_id == 2 for s in e.seqs))
    assert [(s.num_tokens, s.num_cached_tokens) for s in decision.seqs if s.seq_id == 2] == [(9, 4)]   # 13 - 4


def make_seq(seq_id: int, tokens: list[int], num_computed: int, block_size: int = 4) -> Sequence:
    seq = Sequence(seq_id, tokens, block_size)
    seq.block_table = list(range(seq.num_blocks))
    seq.num_scheduled_tokens = num_computed
    return seq


def test_lru_evicts_a_requests_tail_before_its_head_and_a_finished_request_after_a_live_one():
    sink = ListSink()
    tier = CpuTier(4, 4, 4096, 0.0, sink)
    a = make_seq(0, list(range(1, 9)), 8)             # 2 blocks
    b = make_seq(1, list(range(20, 28)), 8)           # 2 blocks
    tier.offer_stores([a, b])
    tier.begin_step(1, 0)                              # the copies start ...
    tier.begin_step(2, 0)                              # ... and, taking no time, have ended
    tier.request_finished(0)                           # a finished: its blocks ranked anew, the head last
    tier.offer_stores([])
    c = make_seq(2, list(range(40, 48)), 8)
    tier.offer_stores([c])
    # b is live and older than a's new ranks: b goes first, its tail before its head
    assert sink.events[-1].evicted == b.block_hashes[::-1]
    d = make_seq(3, list(range(60, 64)), 4)
    tier.begin_step(3, 0)
    tier.begin_step(4, 0)
    tier.offer_stores([d])
    assert sink.events[-1].evicted == [a.block_hashes[1]]       # then a's tail


def test_a_block_being_written_makes_a_lookup_wait_and_a_store_that_cannot_evict_is_offered_again():
    tier = CpuTier(2, 4, 4096, 1.0)
    a = make_seq(0, list(range(1, 13)), 8)            # 2 of its 3 blocks computed
    tier.offer_stores([a])
    again = Sequence(1, list(range(1, 13)), 4)
    assert tier.lookup(again, 0) is None               # written, not readable yet: it waits
    tier.begin_step(1, 1_000)                          # 2 blocks x 4,096 bytes at 1 GB/s: 8,192 ns
    assert tier.next_done_ns() == 1_000 + 8_192
    tier.begin_step(2, 9_192)
    assert tier.lookup(again, 0) == 2
    again.block_table = [0, 1, 2]
    tier.start_load(again, 0, 2)                       # a load reads both blocks: neither can be evicted
    a.num_scheduled_tokens = 12                        # a's third block: no room
    tier.offer_stores([a])
    assert tier.next_offered[0] == 2 and not tier.queued_stores
    tier.begin_step(3, 20_000)                         # the load has ended (at 9,192 + 8,192)
    tier.offer_stores([a])                             # offered again: it evicts the least recent
    assert tier.next_offered[0] == 3 and tier.queued_stores == [(0, [a.block_hashes[2]], [2])]   # its GPU block 2


def test_a_step_that_reuses_a_gpu_block_still_being_stored_waits_for_the_store():
    tier = CpuTier(8, 4, 4096, 1.0)                    # a block in 4,096 ns
    a = make_seq(0, list(range(1, 13)), 12)            # GPU blocks 0, 1, 2
    tier.offer_stores([a])
    tier.begin_step(1, 1_000)                          # the copy runs from 1,000 to 13,288
    tier.reuse([7])                                    # a block no store reads: no wait
    assert tier.flush_wait_ns() == 0
    tier.reuse([1])                                    # a's second block handed out again
    assert tier.flush_wait_ns() == 13_288 - 1_000
    tier.begin_step(2, 20_000)
    tier.reuse([2])                                    # its store has ended
    assert tier.flush_wait_ns() == 0
    b = make_seq(1, list(range(30, 38)), 8)
    tier.offer_stores([b])
    tier.begin_step(3, 30_000)
    tier.preempted(1)                                  # a preempted sequence's stores are waited for
    assert tier.flush_wait_ns() == 2 * 4_096


def test_loads_share_their_link_in_simulated_time():
    tier = CpuTier(8, 4, 4096, 2.0)                    # 2 bytes a ns: a block in 2,048 ns
    seqs = [make_seq(i, list(range(10 * i, 10 * i + 8)), 8) for i in range(2)]
    tier.offer_stores(seqs)
    tier.begin_step(1, 0)
    assert [t[0] for t in sorted(tier.transfers)] == [4096, 8192]    # the second store waits for the first
    tier.begin_step(2, 10_000)
    loads = [Sequence(i + 10, list(range(10 * i, 10 * i + 8)) + [7], 4) for i in range(2)]
    for seq in loads:
        seq.block_table = [0, 1, 2]
        tier.start_load(seq, 0, tier.lookup(seq, 0))
    assert sorted(t[0] for t in tier.transfers) == [14_096, 18_192]


# -- simulated time, re-execution, the fold, stats, the what-if ------------------------------------

def fixed_steps(ms: float) -> dict:
    """A phase's row of a linear step-time model: a constant time, in its model part."""
    return {part: [ms * 1e6 if part == "model_ns" else 0.0] + [0.0] * (len(FEATURES) - 1) for part in PARTS}


STEP_TIME = LinearStepTime.from_dict({"kind": "linear", "features": list(FEATURES), "parts": list(PARTS),
                                      "gap_ns": 0, "wake_ns": 0,
                                      "coefficients": {"prefill": fixed_steps(1.0), "decode": fixed_steps(0.1),
                                                       "mixed": fixed_steps(1.1)}})


def shared_prefix_requests(n: int = 12) -> list[Request]:
    prefixes = [list(range(100 * p, 100 * p + 24)) for p in range(4)]
    return [Request(prefixes[i % 4] + [1000 + i], 3, arrival_ns=i * 2_000_000) for i in range(n)]


def simulated(config: Config, requests=None):
    return run_timed(config, requests or shared_prefix_requests(), STEP_TIME)


def test_a_load_takes_its_bytes_over_the_bandwidth_and_its_request_waits_for_it():
    config = tier_config(32, gbps=0.01, num_kvcache_blocks=8)     # 4,096 bytes at 10 MB/s: 409.6 us a block
    events = simulated(config)
    hits = [e for e in events if type(e) is CpuHit]
    assert hits and all(e.done_ns - e.start_ns == len(e.hashes) * 409_600 for e in hits)
    starts, t = {}, 0
    for e in events:
        if type(e) is StepEnd:
            starts[e.step] = t + e.gap_ns
            t = starts[e.step] + e.schedule_ns + e.model_ns + e.postprocess_ns
    for load in (e for e in events if type(e) is CpuLoad):
        hit = next(h for h in hits if h.seq_id == load.seq_id)
        assert starts[load.step] >= hit.done_ns          # scheduled only once its load has ended
    assert reexecute(events).ok


def test_a_tier_run_replays_checks_folds_and_reports_its_hits(tmp_path, capsys):
    config = tier_config(32, gbps=0.01, num_kvcache_blocks=8)
    events = simulated(config)
    path = tmp_path / "tier.trace"
    write_trace(path, events)
    assert main(["replay", str(path)]) == 0
    assert main(["check", str(path)]) == 0
    fold = Fold(events)
    last = fold.state_at(fold.num_steps - 1)
    stored = {h for e in events if type(e) is CpuStore for h in e.hashes}
    evicted = {h for e in events if type(e) is CpuStore for h in e.evicted}
    assert last.cpu.num_blocks == len(last.cpu.block_hashes) <= 32
    assert set(last.cpu.block_hashes) <= stored and len(stored) - len(evicted) <= last.cpu.num_blocks
    capsys.readouterr()
    assert main(["stats", str(path), "--json"]) == 0
    import json
    s = json.loads(capsys.readouterr().out)
    cpu = s["cpu_tier"]
    assert cpu["num_hit_blocks"] == sum(len(e.hashes) for e in events if type(e) is CpuHit) > 0
    assert cpu["bytes_to_cpu"] == cpu["num_stored_blocks"] * 4 * 1024
    # token hits count both tiers
    assert s["prefix_cache"]["num_hit_tokens"] == (s["prefix_cache"]["num_hit_blocks"] + cpu["num_hit_blocks"]) * 4
    assert cpu["load_wait_s"]["count"] == cpu["num_loads"]


def test_the_what_if_that_adds_the_tier_is_the_simulation_with_it(tmp_path, capsys):
    without = simulated(tier_config(32, gbps=0.01, num_kvcache_blocks=8).replace(kv_offloading_size=0.0))
    with_tier = simulated(tier_config(32, gbps=0.01, num_kvcache_blocks=8))
    recorded, simulated_path, whatif = tmp_path / "no_tier.trace", tmp_path / "tier.trace", tmp_path / "w.trace"
    write_trace(recorded, without)
    write_trace(simulated_path, with_tier)
    steps = tmp_path / "steps.json"
    steps.write_text(__import__("json").dumps(STEP_TIME.to_dict()))
    assert main(["replay", str(recorded), "--set", f"kv_offloading_size={tier_gib(32)}", "--set",
                 "kv_offloading_bandwidth_gbps=0.01", "--step-time", str(steps), "--record", str(whatif)]) == 0
    capsys.readouterr()
    assert main(["diff", str(whatif), str(simulated_path)]) == 0
    assert "no scheduling difference" in capsys.readouterr().out
    removed = tmp_path / "removed.trace"
    assert main(["replay", str(simulated_path), "--set", "kv_offloading_size=0", "--step-time", str(steps),
                 "--record", str(removed)]) == 0
    capsys.readouterr()
    assert main(["diff", str(removed), str(recorded)]) == 0
    assert "no scheduling difference" in capsys.readouterr().out


# -- the property: the tier's rules against the plain reference ------------------------------------

@st.composite
def tier_workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4]))
    prefixes = [draw(st.lists(st.integers(0, 30), min_size=block_size, max_size=4 * block_size)) for _ in range(3)]
    requests = []
    for _ in range(draw(st.integers(1, 12))):
        shared = draw(st.sampled_from(prefixes))
        own = draw(st.lists(st.integers(0, 30), min_size=0 if shared else 1, max_size=12))
        requests.append(Request(shared + own, draw(st.integers(1, 6)), arrival_step=draw(st.integers(0, 30)),
                                ignore_eos=True))
    longest = max(len(r.prompt) + r.max_tokens for r in requests)
    config = tier_config(draw(st.integers(1, 12)), kvcache_block_size=block_size, max_model_len=longest,
                         max_num_batched_tokens=draw(st.integers(1, 32)), max_num_seqs=draw(st.integers(1, 4)),
                         num_kvcache_blocks=-(-longest // block_size) + draw(st.integers(0, 3)),
                         kv_bytes_per_token=draw(st.sampled_from([1, 1024])))
    return config, requests


class TierChecks:
    """After every step: the tier within its size, every GPU block held or free, and the fold's
    tiers (both) the live ones."""

    def __init__(self, sink: ListSink):
        self.sink, self.fold, self.num_folded = sink, None, 0

    def __call__(self, engine):
        check_tier_invariants(engine)
        if self.fold is None:
            self.fold = Fold([make_header(engine.config)])
        self.fold.append(self.sink.events[self.num_folded:])
        self.num_folded = len(self.sink.events)
        state = self.fold.state_at(engine.num_steps - 1)
        live = live_state(engine.scheduler, engine.num_steps - 1)
        assert state.cpu.num_blocks == live.cpu.num_blocks
        assert sorted(state.cpu.block_hashes) == sorted(live.cpu.block_hashes)
        assert state.cpu.loading == live.cpu.loading
        assert state.ref_counts == live.ref_counts and state.free_block_ids == live.free_block_ids


def check_tier_invariants(engine):
    scheduler = engine.scheduler
    tier = scheduler.cpu_tier
    assert len(tier.ref_counts) <= tier.num_blocks
    # every block a sequence set aside holds is still allocated to it; every GPU block is held or free
    live = [*scheduler.waiting, *scheduler.running, *scheduler.loading]
    held = [b for s in live for b in s.block_table]
    assert set(held).isdisjoint(scheduler.block_manager.free_block_ids)
    assert len(set(held)) + scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
    # the fold's tier is the live one
    assert {s.seq_id for s in scheduler.loading if s.seq_id in tier.loads} == set(tier.loads)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tier_workloads())
def test_the_tier_gives_the_events_of_the_plain_reference_and_the_run_replays(workload):
    config, requests = workload
    assume(requests)
    runs = []
    for tier_class in (CpuTier, ReferenceCpuTier):
        with mock.patch.object(policies_module, "CpuTier", tier_class):
            sink = ListSink()
            checks = TierChecks(sink) if tier_class is CpuTier else None
            runs.append(run_workload(config, requests, SyntheticRunner(eos=EOS), sink=sink, on_step=checks,
                                     max_steps=10_000))
    assert [without_wall_clock(e) for e in runs[0][1:]] == [without_wall_clock(e) for e in runs[1][1:]]
    assert sum(type(e) is SeqFinish for e in runs[0]) == len(requests)
    assert reexecute(runs[0]).ok
    fold = Fold(runs[0])
    assert fold.state_at(fold.num_steps - 1).cpu.num_blocks <= config.num_cpu_blocks
    event("CPU hit" if any(type(e) is CpuHit for e in runs[0]) else "no CPU hit")
    event("eviction" if any(type(e) is CpuStore and e.evicted for e in runs[0]) else "no eviction")


def test_a_fleets_replicas_each_run_a_tier_and_the_fleet_replays(tmp_path):
    from tracengine.fleet.engine import simulate_fleet
    from tracengine.fleet.replay import reexecute_fleet
    from tracengine.fleet.spec import FleetSpec
    events = simulate_fleet(tier_config(32, gbps=0.01, num_kvcache_blocks=8), shared_prefix_requests(24), STEP_TIME,
                            FleetSpec(num_replicas=2))
    assert any(type(e) is CpuHit for e in events)
    assert reexecute_fleet(events).ok
    path = tmp_path / "fleet.trace"
    write_trace(path, events)
    assert main(["check", str(path)]) == 0
