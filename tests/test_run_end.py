"""A failed or interrupted run's trace says so (issue 34, item 6): the end frame holds a
RunEnd instead of being empty, `check` reports it with its reason (exit 4), and a
recording replaces an existing file only once its first step is written."""
import json
import os
from pathlib import Path

import pytest

from tracengine.cli import main
from tracengine.cli.common import EXIT_RUN_FAILED
from tracengine.engine.llm_engine import LLMEngine
from tracengine.engine.sampling_params import SamplingParams
from tracengine.errors import TraceError
from tracengine.process.signals import Terminated
from tracengine.sim.runners import SyntheticRunner
from tracengine.testing import every_event_type, every_event_type_config
from tracengine.trace import writer as trace_writer
from tracengine.trace.events import RunEnd
from tracengine.trace.tracelog import TraceReader, TraceWriter, make_header, open_trace

ROOT = Path(__file__).resolve().parent.parent


def run_steps(writer, num_steps: int) -> None:
    config = every_event_type_config()
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos), writer)
    engine.add_request(list(range(20, 40)), SamplingParams(max_tokens=num_steps, ignore_eos=True))
    for _ in range(num_steps):
        engine.step()


def test_a_run_that_raises_ends_its_trace_with_the_reason(tmp_path):
    path = tmp_path / "failed.trace"
    with pytest.raises(ValueError):
        with TraceWriter(path, make_header(every_event_type_config())) as writer:
            run_steps(writer, 3)
            raise ValueError("the model broke")
    with TraceReader(path) as reader:
        assert reader.ended
        assert reader.run_end == RunEnd(step=2, outcome="failed", reason="ValueError: the model broke")
        assert [type(e).__name__ for e in reader.events()].count("StepEnd") == 3   # every finished step


def test_an_interrupted_run_says_which_signal(tmp_path):
    path = tmp_path / "interrupted.trace"
    with pytest.raises(KeyboardInterrupt):
        with TraceWriter(path, make_header(every_event_type_config())) as writer:
            run_steps(writer, 2)
            raise KeyboardInterrupt
    with TraceReader(path) as reader:
        assert reader.run_end == RunEnd(step=1, outcome="interrupted", reason="SIGINT")


def test_a_run_that_finishes_has_no_run_end(tmp_path):
    path = tmp_path / "whole.trace"
    with TraceWriter(path, make_header(every_event_type_config())) as writer:
        run_steps(writer, 2)
    with TraceReader(path) as reader:
        assert reader.ended and reader.run_end is None


@pytest.mark.parametrize("deflate", [True, False])
def test_check_reports_a_failed_run_with_its_reason_and_exit_4(tmp_path, capsys, deflate):
    path = tmp_path / "failed.trace"
    with pytest.raises(TraceError):
        with TraceWriter(path, make_header(every_event_type_config()), deflate=deflate) as writer:
            run_steps(writer, 2)
            raise TraceError("a frame of 70000000 bytes exceeds the limit of 67108864")
    assert main(["check", str(path)]) == EXIT_RUN_FAILED == 4
    out = capsys.readouterr().out
    assert "run failed after step 1: a frame of 70000000 bytes exceeds the limit of 67108864" in out
    assert out.splitlines()[-1] == f"{path}: failed (intact; the run did not finish: exit 4)"
    assert main(["check", str(path), "--json"]) == 4
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "failed"
    assert report["run_end"] == {"step": 1, "outcome": "failed",
                                 "reason": "a frame of 70000000 bytes exceeds the limit of 67108864"}


def test_a_follower_stops_at_a_failed_runs_end_frame(tmp_path):
    path = tmp_path / "failed.trace"
    with pytest.raises(KeyboardInterrupt):
        with TraceWriter(path, make_header(every_event_type_config()), deflate=False) as writer:
            run_steps(writer, 2)
            raise KeyboardInterrupt
    events = list(open_trace(path, follow=True, poll_interval=0.01))   # returns: the end frame was read
    assert sum(type(e).__name__ == "StepEnd" for e in events) == 2


def test_the_format_v6_trace_reads_with_its_run_end():
    with TraceReader(ROOT / "traces" / "format-v6.trace") as reader:
        assert reader.version == 6
        assert reader.run_end == RunEnd(step=16, outcome="interrupted", reason="SIGTERM")   # 17 steps, 0..16
        names = {type(e).__name__ for e in reader.events()}
    assert {"RequestAdded", "ScheduleDecision", "Preempt", "SeqFinish", "StepEnd"} <= names


def test_the_format_v6_trace_is_what_the_writer_writes(tmp_path):
    # scripts/make_format_trace.py wrote it: the same run, interrupted after its last step
    path = tmp_path / "v4.trace"
    with pytest.raises(KeyboardInterrupt):
        with TraceWriter(path, make_header(every_event_type_config())) as writer:
            every_event_type(writer)
            raise Terminated("SIGTERM")
    with TraceReader(path) as new, TraceReader(ROOT / "traces" / "format-v6.trace") as old:
        assert new.run_end == old.run_end
        assert [type(e).__name__ for e in new.events()] == [type(e).__name__ for e in old.events()]


# -- replacing a file: only once the new run has a step ---------------------------------------


def test_a_run_failing_before_its_first_step_leaves_the_old_file(tmp_path, monkeypatch, capsys):
    path = tmp_path / "run.trace"
    path.write_bytes(b"the old trace")
    with pytest.raises(TraceError, match="exceeds the limit"):
        with TraceWriter(path, make_header(every_event_type_config())) as writer:
            monkeypatch.setattr(trace_writer, "MAX_FRAME_BYTES", 20)     # step 0's frame is over it
            run_steps(writer, 1)
    assert path.read_bytes() == b"the old trace"
    assert os.listdir(tmp_path) == ["run.trace"]       # no temporary file left beside it
    assert f"{path} is kept as it was" in capsys.readouterr().err


def test_a_run_replaces_the_old_file_at_its_first_step(tmp_path):
    path = tmp_path / "run.trace"
    path.write_bytes(b"the old trace")
    with TraceWriter(path, make_header(every_event_type_config()), deflate=False) as writer:
        run_steps(writer, 1)
        assert path.read_bytes() != b"the old trace"     # the new trace, from its first step on
        with TraceReader(path) as reader:
            assert reader.num_frames == 2 and not reader.ended
        run_steps(writer, 1)
    with TraceReader(path) as reader:
        assert reader.ended and reader.run_end is None
    assert os.listdir(tmp_path) == ["run.trace"]


def test_simulate_records_why_its_run_failed(tmp_path, capsys):
    from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime, save
    old = tmp_path / "sim.trace"
    old.write_bytes(b"the old trace")
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"timestamp": 0, "input_length": 16, "output_length": 4, "hash_ids": [0]}) + "\n")

    def model_ns(ns):
        return {part: [ns if part == "model_ns" else 0] + [0] * (len(FEATURES) - 1) for part in PARTS}
    # a decode step of 10**20 ns: past the trace's 64-bit integers, its frame cannot be written
    model = tmp_path / "steptime.json"
    save(LinearStepTime({"prefill": model_ns(1_000_000), "decode": model_ns(10**20)}), str(model))
    rc = main(["simulate", str(workload), "--step-time", str(model), "--num-kvcache-blocks", "64",
               "--record", str(old), "--force", "--quiet"])
    assert rc == 2
    assert "does not fit" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["sim.trace", "steptime.json", "w.jsonl"]
    assert main(["check", str(old)]) == EXIT_RUN_FAILED      # replaced at step 0, then failed
    out = capsys.readouterr().out
    # step 0 prefills the request; step 1, its first decode, cannot be written
    assert "run failed after step 0: a number of the run does not fit the trace's 64-bit integers" in out
