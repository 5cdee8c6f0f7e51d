"""Clients that leave, through a fleet what-if (fleet/departures.py, docs/cluster.md): a
recorded SeqAbort leaves the what-if at the same time, on whichever replica holds the
request then, by the rule of one engine's what-if in time."""
import dataclasses

import pytest

from tracengine.fleet.stats import fleet_stats, replica_streams
from tracengine.analysis.timeline import RequestTimeline
from tracengine.cli.main import main
from tracengine.fleet.replay import reexecute_fleet
from tracengine.fleet.whatif import fleet_whatif
from tracengine.replay.timed import timed_whatif
from tracengine.replay.whatif import extract_workload
from tracengine.sim.engine import run_timed
from tracengine.fleet.spec import FleetSpec
from tracengine.trace.events import RequestAdded, SeqAbort
from test_fleet import CONFIG, fixed_step_time, with_writer, workload

LEAVING = {3: 4_000_000, 8: 9_000_000, 11: 10_500_000, 17: 15_000_000, 24: 19_000_000}   # seq_id -> abort_ns


def recorded_with_aborts() -> list:
    """One engine's run in time in which the clients of LEAVING leave mid-answer."""
    requests = [dataclasses.replace(r, max_tokens=24 if r.seq_id in LEAVING else r.max_tokens,
                                    abort_ns=LEAVING.get(r.seq_id, -1)) for r in workload(30)]
    events = run_timed(CONFIG, requests, fixed_step_time())
    assert {e.seq_id for e in events if type(e) is SeqAbort} == set(LEAVING)
    return events


def abort_times(events) -> dict[int, tuple[int, int]]:
    """seq_id -> (replica, the start of the step its SeqAbort preceded) of a fleet's trace."""
    _, streams = replica_streams(events)
    times = {}
    for replica, stream in streams.items():
        timeline = RequestTimeline(stream[0])
        for e in stream[1:]:
            timeline.add(e)
        for e in stream:
            if type(e) is SeqAbort:
                times[e.seq_id] = (replica, timeline.start_ns(e.step))
    return times


def test_one_replica_leaves_as_one_engines_whatif_does():
    recorded = recorded_with_aborts()
    alone = timed_whatif(recorded, {}, fixed_step_time()).self_check
    fleet = fleet_whatif(recorded, FleetSpec(1), {}, fixed_step_time())
    assert fleet.events[1:] == alone[1:]
    assert fleet.new["requests"] == {"num_requests": 30, "num_finished": 25, "num_aborted": 5}


@pytest.mark.parametrize("spec", [FleetSpec(3, "least_loaded"),
                                  FleetSpec(num_prefill_replicas=1, num_decode_replicas=2, kv_bytes_per_token=64,
                                            kv_transfer_gbps=1, kv_transfer_latency_ns=100_000)],
                         ids=["aggregated", "disaggregated"])
def test_a_recorded_abort_leaves_the_fleet_at_its_time_on_the_replica_that_holds_it(tmp_path, capsys, spec):
    recorded = recorded_with_aborts()
    # when each client left, as the trace has it: the start of the step its SeqAbort preceded
    leaving = {r.seq_id: r.abort_ns for r in extract_workload(recorded).requests if r.abort_ns >= 0}
    assert all(leaving[seq_id] >= abort_ns for seq_id, abort_ns in LEAVING.items())
    result = fleet_whatif(recorded, spec, {}, fixed_step_time())
    times = abort_times(result.events)
    assert set(times) <= set(LEAVING) and times      # those not finished before their clients left
    _, streams = replica_streams(result.events)
    for seq_id, (replica, start_ns) in times.items():
        # at the first step of its replica that starts once its client has left
        timeline = RequestTimeline(streams[replica][0])
        for e in streams[replica][1:]:
            timeline.add(e)
        abort = next(e for e in streams[replica] if type(e) is SeqAbort and e.seq_id == seq_id)
        assert start_ns >= leaving[seq_id]
        added = next(e for e in streams[replica] if type(e) is RequestAdded and e.seq_id == seq_id)
        assert abort.step == added.step or timeline.start_ns(abort.step - 1) < leaving[seq_id]
    if spec.disaggregated:     # some left while decoding, on a decode replica
        assert any(replica >= spec.num_prefill_replicas for replica, _ in times.values())
    for seq_id in set(LEAVING) - set(times):       # finished before its client left
        assert max(r["e2e_s"] + r["arrival_s"] for r in fleet_stats(result.events)["per_request"]
                   if r["seq_id"] == seq_id) * 1e9 <= leaving[seq_id]
    # the fleet's trace replays exactly, checks, and its own what-if carries the aborts on
    assert reexecute_fleet(result.events).ok
    path = tmp_path / "fleet.trace"
    with_writer(path, result.events)
    assert main(["check", str(path)]) == 0 and main(["replay", str(path)]) == 0
    capsys.readouterr()
    again = fleet_whatif(result.events, spec, {}, fixed_step_time())
    assert again.events[1:] == result.events[1:]


def test_a_departure_that_leaves_a_replica_idle_replays_checks_and_what_ifs_again(tmp_path, capsys):
    from tracengine.engine.request import Request
    from tracengine.fleet.engine import simulate_fleet
    from tracengine.trace.events import ReplicaScope, StepEnd
    requests = [Request(list(range(10, 30)), 30, 0, ignore_eos=True, seq_id=0),
                Request(list(range(40, 60)), 30, 100_000, ignore_eos=True, seq_id=1, abort_ns=5_000_000),
                Request(list(range(70, 90)), 5, 20_000_000, ignore_eos=True, seq_id=2),
                Request(list(range(90, 110)), 5, 25_000_000, ignore_eos=True, seq_id=3)]
    spec = FleetSpec(2, "round_robin")
    events = simulate_fleet(CONFIG, requests, fixed_step_time(), spec)
    # s1, alone on replica 1, leaves it with nothing to take: its events end without a step
    i = next(i for i, e in enumerate(events) if type(e) is SeqAbort)
    scope = max(j for j in range(i) if type(events[j]) is ReplicaScope)
    assert events[scope].replica == 1 and StepEnd not in {type(e) for e in events[scope:i + 3]}
    assert reexecute_fleet(events).ok
    path = tmp_path / "idle.trace"
    with_writer(path, events)
    assert main(["check", str(path)]) == 0
    capsys.readouterr()
    assert fleet_whatif(events, spec, {}, fixed_step_time()).events[1:] == events[1:]
