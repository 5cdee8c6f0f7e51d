"""The engine interface (engine/interface.py) and its one loop in simulated time
(sim/clock.run_in_time): tracengine's engine, a fleet and vLLM's scheduler behind it, and what
the interface promises whichever engine it is."""
import pytest

from tracengine.engine.config import Config
from tracengine.engine.interface import Engine
from tracengine.engine.request import Request
from tracengine.errors import TracengineError
from tracengine.fleet.engine import Fleet, simulate_fleet
from tracengine.fleet.spec import FleetSpec
from tracengine.sim.clock import ClockedEngine, in_arrival_order, run_in_time
from tracengine.sim.engine import SimulatedEngine, run_timed
from tracengine.sim.runners import SyntheticRunner
from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime
from tracengine.trace.events import CpuLoad, ReplicaScope, RequestAdded, RouteDecision, SeqAbort, TraceHeader
from tracengine.trace.sinks import ListSink

PAGE = 4096


def step_time(gap_ns: int = 0, wake_ns: int = 0) -> LinearStepTime:
    def fixed(ms):
        return {part: [ms * 1e6 if part == "model_ns" else 0.0] + [0.0] * (len(FEATURES) - 1) for part in PARTS}
    return LinearStepTime.from_dict({"kind": "linear", "features": list(FEATURES), "parts": list(PARTS),
                                     "gap_ns": gap_ns, "wake_ns": wake_ns,
                                     "coefficients": {"prefill": fixed(1.0), "decode": fixed(0.1),
                                                      "mixed": fixed(1.1)}})


def tier_config(**changes) -> Config:
    """A small GPU cache and a slow CPU tier: requests wait for loads, steps run nothing."""
    values = dict(kvcache_block_size=4, num_kvcache_blocks=8, max_num_batched_tokens=64, max_num_seqs=4,
                  max_model_len=64, scheduling_policy="mixed", eos=999, kv_offloading_size=32 * PAGE / (1 << 30),
                  kv_bytes_per_token=1024, kv_offloading_bandwidth_gbps=0.01)
    return Config(**{**values, **changes})


def shared_prefix_requests(n: int = 12, every_ns: int = 2_000_000) -> list[Request]:
    prefixes = [list(range(100 * p, 100 * p + 24)) for p in range(4)]
    return [Request(prefixes[i % 4] + [1000 + i], 3, arrival_ns=i * every_ns, ignore_eos=True, seq_id=i)
            for i in range(n)]


def engine_events(events):
    """The events a fleet of one and one engine share: all but the header."""
    return [e for e in events if type(e) is not TraceHeader]


def test_each_engine_has_the_interface():
    for cls in (ClockedEngine, Fleet):
        assert all(callable(getattr(cls, name, None)) for name in Engine.__dict__
                   if not name.startswith("_") and callable(Engine.__dict__[name]))


@pytest.mark.parametrize("gap_ns, wake_ns", [(0, 0), (50_000, 300_000)])
def test_a_fleet_of_one_is_one_engine_event_for_event_even_while_steps_wait_for_the_cpu_tier(gap_ns, wake_ns):
    """One loop, one engine on its clock: a fleet of one replica and one engine take the same
    steps at the same times, arrivals waking an engine that waits for a transfer included."""
    config, timing = tier_config(), step_time(gap_ns, wake_ns)
    alone = run_timed(config, shared_prefix_requests(), timing)
    assert any(type(e) is CpuLoad for e in alone)
    fleet = simulate_fleet(config, shared_prefix_requests(), timing, FleetSpec(num_replicas=1))
    assert engine_events(fleet) == engine_events(alone)


def clocked(config=None, timing=None):
    config = config or Config(num_kvcache_blocks=64, kvcache_block_size=4, max_num_batched_tokens=64,
                              max_num_seqs=4, max_model_len=64)
    sink = ListSink()
    engine = SimulatedEngine(config, SyntheticRunner(), timing or step_time(), sink)
    return ClockedEngine(engine, timing or step_time()), sink


def test_an_idle_engine_wakes_its_wake_up_time_after_an_arrival_and_a_busy_one_its_gap_after_a_step():
    engine, _ = clocked(timing=step_time(gap_ns=20_000, wake_ns=300_000))
    assert engine.next_step_ns() is None and engine.is_finished()
    engine.add(0, Request([1, 2, 3, 4, 5], 2, arrival_ns=1_000_000))
    assert engine.next_step_ns() == 1_300_000
    stepped = engine.step()
    assert stepped.ran and stepped.end_ns == 1_300_000 + 1_000_000
    assert engine.next_step_ns() == stepped.end_ns + 20_000


def test_aborting_a_request_not_entered_yet_leaves_no_event_and_an_entered_one_is_aborted():
    engine, sink = clocked()
    engine.add(0, Request([1, 2, 3, 4, 5], 4, arrival_ns=0))
    engine.add(1, Request([6, 7, 8, 9], 4, arrival_ns=0))
    assert engine.abort(1, "client left")
    engine.step()
    assert [e.seq_id for e in sink.events if type(e) is RequestAdded] == [0]
    assert engine.abort(0, "client left") and not engine.abort(0, "client left")
    assert [e.seq_id for e in sink.events if type(e) is SeqAbort] == [0]
    assert engine.is_finished()


def test_a_fleet_aborts_a_request_on_the_replica_that_holds_it():
    config = Config(num_kvcache_blocks=64, kvcache_block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                    max_model_len=64)
    sink = ListSink()
    fleet = Fleet(config, FleetSpec(num_replicas=2), lambda i, c: SimulatedEngine(c, SyntheticRunner(), step_time(),
                                                                                   sink), sink, step_time=step_time())
    for i in range(4):
        fleet.add(i, Request([i, 1, 2, 3, 4], 6, arrival_ns=0))
    fleet.step()
    fleet.step()
    routed = {e.seq_id: e.replica for e in sink.events if type(e) is RouteDecision}
    assert fleet.abort(3, "client left") and not fleet.abort(3, "client left")
    fleet.step()
    aborted_on = None
    for e in sink.events:
        if type(e) is ReplicaScope:
            replica = e.replica
        elif type(e) is SeqAbort:
            aborted_on = replica
    assert aborted_on == routed[3]


def test_the_one_loop_numbers_requests_without_an_id_by_their_index_and_ends_when_all_finished():
    engine, sink = clocked()
    requests = [Request([5, 6, 7, 8, i], 3, arrival_ns=(3 - i) * 1_000) for i in range(3)]
    steps = run_in_time(engine, in_arrival_order(requests))
    added = [e.seq_id for e in sink.events if type(e) is RequestAdded]
    assert added == [2, 1, 0] and steps > 0 and engine.is_finished()


def test_an_engine_that_can_neither_step_nor_finish_says_why():
    class Stuck:
        def next_step_ns(self):
            return None

        def is_finished(self):
            return False

        def stuck_reason(self):
            return "stuck for a reason"

    with pytest.raises(TracengineError, match="stuck for a reason"):
        run_in_time(Stuck(), in_arrival_order([]))


def test_vllm_scheduler_is_an_engine_of_the_interface():
    pytest.importorskip("vllm")
    from tracengine.vllm.timed import VllmClockedEngine
    assert all(callable(getattr(VllmClockedEngine, name, None)) for name in Engine.__dict__
               if not name.startswith("_") and callable(Engine.__dict__[name]))

