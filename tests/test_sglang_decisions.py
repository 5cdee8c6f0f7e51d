"""SGLang's schedule policy order (PolicyOrder) and its prefill adder's stop (PrefillStop), recorded
from SGLang's own calls (format 13): each policy's order is the one SGLang's scheduler admitted
in, each stop is the adder's verdict, both replay exactly, and traces of format 12 (without
them) still replay (skipped where SGLang is not installed)."""
import importlib.util
from pathlib import Path

import msgspec
import pytest

from tracengine.trace.events import ScheduleDecision
from tracengine.trace.sglang_events import PolicyOrder, PrefillStop

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")
TRACES = Path(__file__).resolve().parents[1] / "traces"


def record(policy: str, specs, **config):
    from tracengine.sglang.build import default_config
    from tracengine.sglang.drive import record_workload
    return record_workload(default_config(schedule_policy=policy, **config), specs)


def shared_prefix_specs():
    """A 64-token prefix shared by all, then each request's own tail; three arrive each step."""
    from tracengine.sglang.drive import RequestSpec
    return [RequestSpec(f"r{i}", [1, 2, 3, 4, 5, 6, 7, 8] * 8 + [i] * (10 + i), 6 + i % 3, arrival_step=i // 3)
            for i in range(8)]


def by_step(events, event_type) -> dict:
    return {e.step: e for e in events if type(e) is event_type}


def test_lpm_orders_by_radix_match_and_admits_in_that_order():
    from tracengine.sglang.drive import RequestSpec
    from tracengine.sglang.replay import reexecute
    # r0 and r1 share a prefix; once r0 is in the radix cache, r2 (no match) arrived before r1 but waits
    specs = [RequestSpec("r0", [9] * 40 + [1] * 8, 2), RequestSpec("r2", [3] * 48, 2, arrival_step=2),
             RequestSpec("r1", [9] * 40 + [2] * 8, 2, arrival_step=2)]
    events = record("lpm", specs, max_total_tokens=400, chunked_prefill_size=64, max_running_requests=1)
    orders, decisions = by_step(events, PolicyOrder), by_step(events, ScheduleDecision)
    ranked = next(o for o in orders.values() if o.num_waiting == 2)
    assert (ranked.policy, ranked.applied) == ("lpm", "lpm")
    assert ranked.seq_ids[0] == 2 and ranked.num_matched_tokens[0] == 40       # r1, its 40 cached tokens first
    assert [s.seq_id for s in decisions[ranked.step].seqs] == [2]
    fcfs = record("fcfs", specs, max_total_tokens=400, chunked_prefill_size=64, max_running_requests=1)
    ranked = next(o for o in by_step(fcfs, PolicyOrder).values() if o.num_waiting == 2)
    assert ranked.seq_ids == [1, 2] and ranked.num_matched_tokens == []          # arrival order, nothing ranked
    assert reexecute(events).ok and reexecute(fcfs).ok


def test_lof_orders_by_max_tokens_and_lpm_puts_in_batch_sharers_last():
    from tracengine.sglang.drive import RequestSpec
    specs = [RequestSpec(f"r{i}", [i + 1] * 20, 4 + 3 * i) for i in range(4)]
    order = by_step(record("lof", specs, max_total_tokens=400, chunked_prefill_size=64), PolicyOrder)[0]
    assert order.applied == "lof" and order.seq_ids == [3, 2, 1, 0]
    lpm = by_step(record("lpm", shared_prefix_specs(), max_total_tokens=300, chunked_prefill_size=64,
                         max_running_requests=6), PolicyOrder)[0]
    assert lpm.deprioritized == [1, 2] and lpm.seq_ids[0] == 0     # one of the sharers goes first, to fill the cache


def test_each_stop_is_the_adders_verdict():
    from tracengine.sglang.drive import RequestSpec
    events = record("fcfs", shared_prefix_specs(), max_total_tokens=300, chunked_prefill_size=64,
                    max_running_requests=6)
    stops, decisions = by_step(events, PrefillStop), by_step(events, ScheduleDecision)
    assert set(stops) == set(decisions)                     # one per step
    first = stops[0]      # the first prompt is 74 tokens: chunked to 64, the chunk budget spent
    assert (first.reason, first.result, first.seq_id, first.admitted, first.rem_chunk_tokens) == \
        ("chunked_prefill_size", "other", 0, True, 0)
    assert decisions[0].stop_reason == "budget_exhausted"
    limit = next(s for s in stops.values() if s.reason == "max_running_requests")
    assert decisions[limit.step].stop_reason == "max_num_seqs"
    assert all(decisions[s.step].stop_reason == "max_num_seqs" for s in stops.values() if s.reason == "batch_full")
    last = stops[max(stops)]
    assert (last.reason, decisions[last.step].stop_reason) == ("waiting_empty", "waiting_empty")
    # a pool too small for the next prompt: NO_TOKEN at it, not admitted
    specs = [RequestSpec(f"r{i}", [i + 1] * 100, 30, arrival_step=0) for i in range(3)]
    small = record("fcfs", specs, max_total_tokens=300, chunked_prefill_size=512)
    no_token = next(s for s in by_step(small, PrefillStop).values() if s.reason == "no_token")
    assert no_token.result == "no_token" and no_token.seq_id == 2 and not no_token.admitted
    assert by_step(small, ScheduleDecision)[no_token.step].stop_reason == "no_free_blocks"


def test_a_planted_order_or_stop_is_found_at_its_step():
    from tracengine.sglang.replay import reexecute
    events = record("lpm", shared_prefix_specs(), max_total_tokens=300, chunked_prefill_size=64,
                    max_running_requests=6)
    assert reexecute(events).ok
    for event_type, change in ((PolicyOrder, lambda e: dict(seq_ids=e.seq_ids[::-1])),
                               (PrefillStop, lambda e: dict(reason="other"))):
        i = next(i for i, e in enumerate(events) if type(e) is event_type and e.step == 1)
        planted = list(events)
        planted[i] = msgspec.structs.replace(events[i], **change(events[i]))
        divergence = reexecute(planted).divergence
        assert divergence is not None and divergence.step == 1 and divergence.expected == planted[i]


@pytest.mark.parametrize("name", ["sglang_v11", "sglang_overlap_v11"])
def test_earlier_format_traces_replay_without_them(name):
    """Traces recorded before format 13 (these: 11) hold no PolicyOrder and the stop reason as then inferred:
    their replay records as that format did."""
    from tracengine.sglang.replay import reexecute
    from tracengine.trace.tracelog import TraceReader
    with TraceReader(TRACES / f"{name}.trace") as reader:
        events = list(reader.events())
    assert events[0].format_version < 13
    assert not [e for e in events if type(e) in (PolicyOrder, PrefillStop)]
    assert reexecute(events).ok


def test_render_and_events_show_them(capsys):
    from tracengine.analysis.render import describe_event, render_steps
    from tracengine.cli import main
    from tracengine.trace.tracelog import open_trace
    table = render_steps(open_trace(TRACES / "sglang.trace"))
    assert "order fcfs: s0 s1" in table and "adder max_running_requests at s7" in table
    stop = next(e for e in open_trace(TRACES / "sglang.trace") if type(e) is PrefillStop and e.step == 0)
    assert describe_event(stop).startswith("prefill stopped (OTHER after 1 tried): the chunk budget")
    assert main(["events", str(TRACES / "sglang.trace"), "--type", "PolicyOrder", "--step", "5"]) == 0
    assert "policy=fcfs applied=fcfs seq_ids=[6 7]" in capsys.readouterr().out


def test_the_tuis_step_explanation_says_them():
    from tracengine.tui.trace_index import TraceIndex
    index = TraceIndex(TRACES / "sglang.trace")
    while not index.ended:
        index.index_more()
    assert index.view_at(5).explanation == (
        "prefill seq 6 (26 tokens, 64 prefix-cached); max_num_seqs=6 reached; fcfs order s6 s7 +4; "
        "SGLang's adder stopped: no request slot left (max_running_requests) at seq 7")
    index.close()
