"""`diff` knows the CPU tier's events: two runs that store, evict, hit or load differently are
told apart at the first step where their tiers do, before their GPU scheduling differs."""
import msgspec

from tracengine.cli.main import main
from tracengine.engine.request import Request
from tracengine.replay.diff import diff_traces
from tracengine.sim.runners import SyntheticRunner, run_workload
from tracengine.trace.events import CpuHit, CpuStore, ScheduleDecision
from tracengine.trace.sinks import ListSink
from tracengine.trace.tracelog import write_trace
from tracengine.trace.views import without_wall_clock
from test_cpu_tier import EOS, tier_config

A = list(range(1, 13))
# A's 3 blocks are stored; B's 4 need the tier to evict; A's prompt again (C) then hits in the tier
REQUESTS = [Request(A, 1), Request(list(range(100, 116)), 4, arrival_step=3), Request(A + [50], 2, arrival_step=12)]


def run(num_cpu_blocks: int) -> list:
    return run_workload(tier_config(num_cpu_blocks), REQUESTS, SyntheticRunner(eos=EOS), sink=ListSink())


def first_step(events, kind) -> int:
    return next(e.step for e in events if type(e) is kind)


def test_two_tiers_that_evict_differently_differ_at_the_first_differing_store():
    # 8 blocks take B's 4 at once; 4 can evict A's 3 only once they are readable, a step later:
    # the GPU schedules alike until C finds A's blocks in one tier and not in the other
    big, small = run(8), run(4)
    stores = [[(e.step, e.seq_id, e.hashes, e.evicted) for e in events if type(e) is CpuStore]
              for events in (big, small)]
    assert stores[0][0] == stores[1][0] and stores[0][1][0] == 1 and stores[1][1][0] == 2
    decisions = [[without_wall_clock(e) for e in events if type(e) is ScheduleDecision and e.step <= 2]
                 for events in (big, small)]
    assert decisions[0] == decisions[1]          # the GPU's scheduling the same over those steps
    assert diff_traces(big, small).step == 1
    assert first_step(big, CpuHit) > 2           # the hit that tells them apart on the GPU comes later


def test_a_hit_of_other_blocks_is_a_difference_and_its_link_times_are_not(tmp_path, capsys):
    events = run(8)
    hit = next(i for i, e in enumerate(events) if type(e) is CpuHit)
    later = msgspec.structs.replace(events[hit], start_ns=events[hit].start_ns + 5, done_ns=events[hit].done_ns + 5)
    assert diff_traces(events, [*events[:hit], later, *events[hit + 1:]]).identical
    other = msgspec.structs.replace(events[hit], hashes=events[hit].hashes[:-1])
    d = diff_traces(events, [*events[:hit], other, *events[hit + 1:]])
    assert d.step == events[hit].step
    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    write_trace(a, events)
    write_trace(b, [*events[:hit], other, *events[hit + 1:]])
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert f"first scheduling difference at step {events[hit].step}" in out and "CpuHit" in out
