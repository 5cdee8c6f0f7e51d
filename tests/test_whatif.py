"""What-if (`replay --set`), the figures it compares, and `tracengine diff`."""
import json
from pathlib import Path

import msgspec
import pytest

from tracengine.cli import main
from tracengine.errors import ConfigError, RequestError
from tracengine.trace.events import Preempt, StepEnd, TokenSample
from tracengine.replay.diff import diff_traces
from tracengine.replay.metrics import rows, side_by_side
from tracengine.analysis.figures import to_json_object
from tracengine.analysis.figures import summarize
from tracengine.analysis.stats import stats
from tracengine.replay.reexec import reexecute
from tracengine.testing import CANNED_WORKLOADS
from tracengine.replay.whatif import extract_workload, whatif
from tracengine.engine.scheduler import Scheduler
from tracengine.trace.tracelog import FORMAT_VERSION, TraceReader

from helpers import run_canned, write_trace


def preemptions(figures: dict) -> int:
    return figures["preemption"]["num_preemptions"]


def kept_tokens(events):
    tokens = {}
    for e in events:
        if type(e) is TokenSample and e.kept:
            tokens.setdefault(e.seq_id, []).append(e.token_id)
    return tokens


@pytest.mark.parametrize("name", CANNED_WORKLOADS)
def test_the_same_config_schedules_the_same(name):
    events = run_canned(name)
    result = whatif(events, {})
    assert result.changes == []
    assert diff_traces(events, result.events).identical
    assert kept_tokens(result.events) == kept_tokens(events)


def test_fewer_blocks_preempt_more_and_keep_every_output():
    events = run_canned("head_of_line")
    result = whatif(events, {"num_kvcache_blocks": 7})
    assert result.changes == [("num_kvcache_blocks", 10, 7)]
    assert preemptions(result.original) == 0 and preemptions(result.new) > 0
    assert result.new["preemption"]["num_recomputed_tokens"] == sum(e.num_computed_tokens for e in result.events
                                                   if type(e) is Preempt)
    assert kept_tokens(result.events) == kept_tokens(events)
    assert result.new["requests"]["num_finished"] == result.original["requests"]["num_finished"] == 3
    assert reexecute(result.events).ok      # the new run is itself a trace that reproduces


def test_more_blocks_remove_the_preemptions():
    result = whatif(run_canned("preemption_tail"), {"num_kvcache_blocks": 32})
    assert (preemptions(result.original), preemptions(result.new)) == (2, 0)
    assert result.new["steps"]["num_steps"] < result.original["steps"]["num_steps"]
    assert result.original["preemption"]["num_recomputed_tokens"] == 8 + 12


def test_a_smaller_budget_chunks_more():
    result = whatif(run_canned("worked_example"), {"max_num_batched_tokens": 8})
    # s0's 25 = 8 + 8 + 8 + 1; the chunk gate keeps s1 (8 > 8 - 1) out of that last step; then s1, then s2
    assert (result.original["steps"]["num_prefill_steps"], result.new["steps"]["num_prefill_steps"]) == (2, 4 + 1 + 1)


def test_a_request_that_can_never_fit_is_refused():
    with pytest.raises(RequestError, match=r"request s0 .* can never run under the new config"):
        whatif(run_canned("worked_example"), {"num_kvcache_blocks": 4})


def test_an_unknown_field_is_refused():
    with pytest.raises(ConfigError, match="unknown config field 'blocks'"):
        whatif(run_canned("worked_example"), {"blocks": 4})


def test_running_past_the_recorded_output_is_counted():
    # under max_model_len=27, s0 (25 prompt tokens) stops at 2 of its 3 max_tokens
    short = whatif(run_canned("worked_example"), {"max_model_len": 27})
    assert short.new["requests"]["finish_reasons"] == {"length": 3} and len(kept_tokens(short.events)[0]) == 2
    # lifting the limit again, s0 needs a 3rd token the trace does not have: a filler, counted
    longer = whatif(short.events, {"max_model_len": 1024})
    assert longer.num_past_output == 1
    assert len(kept_tokens(longer.events)[0]) == 3


def test_extract_workload():
    events = run_canned("worked_example")
    workload = extract_workload(events)
    assert [(r.seq_id, len(r.prompt), r.max_tokens, r.arrival_step) for r in workload.requests] == [
        (0, 25, 3, 0), (1, 8, 3, 0), (2, 6, 3, 0)]
    assert workload.outputs == kept_tokens(events)
    # the middle chunk of step 0 ended at position 20
    assert workload.middle == {(0, 20): next(e.token_id for e in events if type(e) is TokenSample)}


def test_metrics_in_steps():
    s = stats(run_canned("worked_example"))
    steps = s["steps"]
    assert (steps["num_steps"], steps["num_prefill_steps"], steps["num_decode_steps"]) == (4, 2, 2)
    assert [r["ttft_steps"] for r in s["per_request"]] == [2, 2, 2]   # arrived before step 0, first token in step 1
    assert [r["e2e_steps"] for r in s["per_request"]] == [4, 4, 4]    # finished in step 3
    assert s["requests"]["finish_reasons"] == {"length": 3}
    assert stats(run_canned("shared_prefix"))["prefix_cache"]["num_hit_blocks"] == 4


def test_what_if_percentiles_are_the_stats_percentiles():
    # one definition for `replay --set` and `tracengine stats`: linear interpolation
    s = stats(run_canned("worked_example"))
    ttft = msgspec.structs.replace(s.latency.ttft, steps=summarize(list(range(1, 101))))
    s = msgspec.structs.replace(s, latency=msgspec.structs.replace(s.latency, ttft=ttft))
    assert dict(rows(s))["TTFT steps mean/p50/p99"] == "50.5 / 50.5 / 99.0"   # p99: rank 98.01, 99.01
    assert summarize([5])["p99"] == 5
    assert summarize(list(range(1, 101)))["p50"] == 50.5
    assert summarize([3, 1, 2])["p99"] == 2.98      # 2 + (3 - 2) * 0.98
    assert summarize([])["p50"] is None


def test_whatif_command_prints_side_by_side_and_records(tmp_path, capsys):
    path = write_trace(tmp_path / "run.trace", run_canned("preemption_tail"))
    new = tmp_path / "new.trace"
    assert main(["replay", path, "--set", "num_kvcache_blocks=32", "--record", str(new), "--arrivals", "steps"]) == 0
    out = capsys.readouterr().out
    assert "num_kvcache_blocks 9 -> 32" in out
    assert "recorded" in out and "what-if" in out
    assert any(line.startswith("preemptions") and line.split()[1:3] == ["2", "0"] for line in out.splitlines())
    with TraceReader(new) as reader:
        assert reader.header.config["num_kvcache_blocks"] == 32
    assert main(["replay", str(new)]) == 0


@pytest.mark.parametrize("name, overrides", [("preemption_tail", ["num_kvcache_blocks=32"]),
                                             ("head_of_line", ["num_kvcache_blocks=7"]),
                                             ("worked_example", ["max_num_batched_tokens=8"])])
def test_whatif_table_is_the_stats_of_both_traces(tmp_path, capsys, name, overrides):
    # one set of run figures: the table is `tracengine stats` of the recorded and of the what-if trace
    path = write_trace(tmp_path / "run.trace", run_canned(name))
    new = str(tmp_path / "new.trace")
    assert main(["replay", path, *(a for o in overrides for a in ("--set", o)), "--record", new,
                 "--arrivals", "steps"]) == 0
    out = capsys.readouterr().out
    assert side_by_side(stats(path), stats(new), "recorded", "what-if") in out
    assert main(["stats", new, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(to_json_object(stats(new))))


def test_whatif_command_errors_exit_2(tmp_path, capsys):
    path = write_trace(tmp_path / "run.trace", run_canned("worked_example"))
    assert main(["replay", path, "--set", "num_kvcache_blocks=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: request s0") and err.count("\n") == 1
    assert main(["replay", path, "--set", "num_kvcache_blocks"]) == 2
    assert "expected NAME=VALUE" in capsys.readouterr().err
    assert main(["replay", path, "--state", "1", "--set", "num_kvcache_blocks=8"]) == 2


def test_diff_of_identical_traces(tmp_path, capsys):
    a = write_trace(tmp_path / "a.trace", run_canned("preemption_tail"))
    b = write_trace(tmp_path / "b.trace", run_canned("preemption_tail"))
    assert main(["diff", a, b]) == 0
    assert "no scheduling difference in 11 steps" in capsys.readouterr().out


def test_diff_of_another_config_differs_from_step_0(tmp_path, capsys):
    events = run_canned("preemption_tail")
    a = write_trace(tmp_path / "a.trace", events)
    b = write_trace(tmp_path / "b.trace", whatif(events, {"num_kvcache_blocks": 10}).events)
    assert main(["diff", a, b]) == 1
    out = capsys.readouterr().out
    assert "config: num_kvcache_blocks 9 vs 10" in out
    # the same sequences are scheduled in step 0, but the decision records 1 vs 2 free blocks
    assert "first scheduling difference at step 0:" in out
    assert "num_free_blocks=1" in out and "num_free_blocks=2" in out


@pytest.mark.patches_core
def test_diff_finds_a_changed_preemption_victim(tmp_path, capsys, monkeypatch):
    a = write_trace(tmp_path / "a.trace", run_canned("preemption_tail"))
    original = Scheduler.preempt

    def preempt_head(self, seq, by):
        if seq is not by and self.running:
            self.running.append(seq)
            seq = self.running.popleft()
        original(self, seq, by)

    monkeypatch.setattr(Scheduler, "preempt", preempt_head)
    b = write_trace(tmp_path / "b.trace", run_canned("preemption_tail"))
    assert main(["diff", a, b]) == 1
    out = capsys.readouterr().out
    assert "config:" not in out
    assert "first scheduling difference at step 1:" in out
    assert "  a:    1 decode  s0:1@8 s1:1@8 s2:1@8 | running_empty | append s0+8 s1+7 s2+6; preempt s3(by s1" in out
    assert "  b:    1 decode  s0:1@8 s1:1@8 s3:1@8 | running_empty | append s0+8 s1+5 s3+4; preempt s2(by s1" in out
    assert "    a:      1  BlockAppend       seq_id=1 block_id=7" not in out       # the first difference is the victim
    assert "    a:      1  Preempt           seq_id=3 " in out and "    b:      1  Preempt           seq_id=2 " in out
    assert any(line.startswith("preemptions") for line in out.splitlines())
    assert side_by_side(stats(a), stats(b), "a", "b") in out     # the figures of `tracengine stats`


def test_diff_of_a_trace_and_its_beginning():
    events = run_canned("head_of_line")
    cut = next(i for i, e in enumerate(events) if type(e) is StepEnd and e.step == 4) + 1
    d = diff_traces(events, events[:cut])
    assert d.step == 5 and d.b_events == [] and d.a_events[-1].step == 5
    assert (d.a_stats["steps"]["num_steps"], d.b_stats["steps"]["num_steps"]) == (12, 5)


def test_diff_reads_a_config_field_an_older_trace_lacks_as_its_default():
    import msgspec
    with TraceReader(Path(__file__).parent.parent / "traces" / "format-v1.trace") as reader:
        old = list(reader.events())
    assert "scheduling_policy" not in old[0].config

    def with_policy(name):
        return [msgspec.structs.replace(old[0], config={**old[0].config, "scheduling_policy": name}), *old[1:]]
    assert diff_traces(old, with_policy("prefill_first")).config_changes == []
    assert diff_traces(with_policy("prefill_first"), old).config_changes == []
    assert diff_traces(old, with_policy("mixed")).config_changes == [("scheduling_policy", "prefill_first", "mixed")]
    assert diff_traces(with_policy("mixed"), old).config_changes == [("scheduling_policy", "mixed", "prefill_first")]


def test_whatif_of_an_older_trace_records_a_readable_trace(tmp_path, capsys):
    # the golden traces are format 1: the what-if run is written as the current format, header and preamble alike
    new = tmp_path / "new.trace"
    golden = Path(__file__).parent.parent / "traces" / "preemption.trace"
    assert main(["replay", str(golden), "--set", "num_kvcache_blocks=32", "--record", str(new)]) == 0
    assert main(["replay", str(new)]) == 0
    with TraceReader(new) as reader:
        assert reader.header.format_version == FORMAT_VERSION
