"""The timeline's fold of the steps (analysis/step_figures.py): its sums against the same sums taken
from the events by hand, lean and whole, and a decision it cannot place refused as a trace error."""
import random

import msgspec
import pytest

from tracengine.analysis.timeline import RequestTimeline
from tracengine.engine.config import Config
from tracengine.errors import TraceError
from tracengine.testing import random_workload, run_requests
from tracengine.trace.events import ScheduleDecision, StepEnd


def mixed_run() -> list:
    """A `mixed` run with prefill, decode and mixed steps, preemptions and a blocked head."""
    config = Config(num_kvcache_blocks=16, kvcache_block_size=4, max_num_batched_tokens=16, max_num_seqs=5,
                    max_model_len=128, scheduling_policy="mixed")
    return run_requests(config, random_workload(random.Random(3), num_requests=16, max_output_len=20))


def by_hand(events: list) -> dict:
    """The step sums, from each step's decision and end as they are recorded."""
    sums: dict = {"tokens": {}, "ns": {}, "steps": {}, "kind": {"prefill": 0, "decode": 0}, "free": []}
    decisions = {e.step: e for e in events if type(e) is ScheduleDecision}
    for end in (e for e in events if type(e) is StepEnd):
        d = decisions[end.step]
        for key, value in (("tokens", d.num_batched_tokens),
                           ("ns", end.schedule_ns + end.model_ns + end.postprocess_ns), ("steps", 1)):
            sums[key][d.phase] = sums[key].get(d.phase, 0) + value
        for i, s in enumerate(d.seqs):
            is_prefill = d.phase == "prefill" or d.phase == "mixed" and i >= d.num_decode_seqs
            sums["kind"]["prefill" if is_prefill else "decode"] += s.num_tokens
        sums["free"].append(end.num_free_blocks)
    return sums


@pytest.mark.parametrize("lean", [False, True])
def test_the_step_sums_are_those_of_the_events(lean):
    events = mixed_run()
    timeline = RequestTimeline(events[0], lean=lean)
    for e in events[1:]:
        timeline.add(e)
    f, want = timeline.step_figures, by_hand(events)
    assert {phase for phase in want["steps"]} == {"prefill", "decode", "mixed"}
    got_tokens = {"prefill": f.prefill_tokens, "decode": f.decode_tokens, "mixed": f.mixed_tokens}
    got_ns = {"prefill": f.prefill_ns, "decode": f.decode_ns, "mixed": f.mixed_ns}
    got_steps = {"prefill": f.num_prefill_steps, "decode": f.num_decode_steps, "mixed": f.num_mixed_steps}
    assert got_tokens == want["tokens"] and got_ns == want["ns"] and got_steps == want["steps"]
    assert {"prefill": f.kind_prefill_tokens, "decode": f.kind_decode_tokens} == want["kind"]
    assert (f.min_free, f.min_free_at) == (min(want["free"]), want["free"].index(min(want["free"])))
    assert f.busy_ns == sum(want["ns"].values()) and timeline.num_steps == len(want["free"])
    assert all(r.first_scheduled_step is not None for r in timeline.requests.values())


def test_a_decision_of_an_unknown_phase_is_a_trace_error():
    events = mixed_run()
    timeline = RequestTimeline(events[0])
    for e in events[1:]:
        if type(e) is ScheduleDecision and e.step == 2:
            e = msgspec.structs.replace(e, phase="verify")
        if type(e) is StepEnd and e.step == 2:
            with pytest.raises(TraceError, match="unknown phase 'verify'"):
                timeline.add(e)
            return
        timeline.add(e)
