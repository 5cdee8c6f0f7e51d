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


def renamed(event, new_id):
    """`event` with each seq id it names replaced by `new_id(id)`."""
    changes = {name: new_id(getattr(event, name)) for name in ("seq_id", "by_seq_id") if hasattr(event, name)}
    if type(event) is ScheduleDecision:
        changes["seqs"] = [msgspec.structs.replace(s, seq_id=new_id(s.seq_id)) for s in event.seqs]
        changes["resumed_seq_ids"] = [new_id(i) for i in event.resumed_seq_ids]
        if event.blocked_seq_id != -1:
            changes["blocked_seq_id"] = new_id(event.blocked_seq_id)
    return msgspec.structs.replace(event, **changes) if changes else event


@pytest.mark.parametrize("lean", [False, True])
def test_requests_are_folded_alike_whatever_their_seq_ids(lean):
    """A kept token finds its request in a slot by the low bits of its seq_id, else in `requests`:
    ids spread out, sharing a slot (1024 apart), far apart and negative fold to the same records and
    gaps as 0, 1, 2..."""
    events = mixed_run()
    def new_id(seq_id: int) -> int:
        return [3 * seq_id, 1024 + 3 * (seq_id - 1), -seq_id, 10 ** 9 + seq_id][seq_id % 4]
    folds = []
    for run in (events, [renamed(e, new_id) for e in events]):
        timeline = RequestTimeline(run[0], lean=lean)
        for e in run[1:]:
            timeline.add(e)
        folds.append(timeline)
    before, after = folds
    assert {new_id(i) for i in before.requests} == after.requests.keys() and len(before.requests) == 16
    for seq_id, req in before.requests.items():
        got = after.requests[new_id(seq_id)]
        assert (got.num_tokens, got.first_token_step, got.last_token_step, list(got.token_steps), got.scheduled,
                got.first_scheduled_step, got.finish_step, len(got.preempts)) == (
               req.num_tokens, req.first_token_step, req.last_token_step, list(req.token_steps), req.scheduled,
               req.first_scheduled_step, req.finish_step, len(req.preempts))
    assert after.itl() == before.itl() and sum(before.itl()[0].values()) > 50


def test_a_token_finds_its_request_among_thousands():
    """The slots grow with the requests (twice as many): each of 5,000 requests, added before any
    token, some 1024 ids apart, gets its own tokens."""
    from tracengine.trace.events import RequestAdded
    timeline = RequestTimeline(lean=True)
    seq_ids = [i if i % 2 else 1024 * i for i in range(5000)]
    for seq_id in seq_ids:
        timeline.add(RequestAdded(0, seq_id, [1, 2], 4, 1.0, False))
    for step in range(1, 4):
        for n, seq_id in enumerate(seq_ids):
            if n % step == 0:
                timeline.token_kept(step, seq_id)
    for n, seq_id in enumerate(seq_ids):
        req = timeline.requests[seq_id]
        assert (req.num_tokens, req.first_token_step) == (2 + sum(n % step == 0 for step in range(1, 4)), 1)
