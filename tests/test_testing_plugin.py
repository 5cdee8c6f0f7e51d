"""tracengine.testing as a user's test suite uses it: a test file in a fresh
project pins a recorded trace and a scripted workload; a scheduler change
fails it with the first divergent step and a diff of step tables; accepting
with --snapshot-update makes the next run pass. And `tracengine render`
prints the tables the snapshots hold."""
from pathlib import Path

import pytest

from tracengine import Config
from tracengine.cli import main
from tracengine.analysis.render import render_steps
from tracengine.testing import CANNED_WORKLOADS, canned_workload, make_request, run_requests
from tracengine.trace.events import Preempt, RequestAdded
from helpers import stored_snapshot, user_project

ROOT = Path(__file__).parent.parent
SNAPSHOTS = Path(__file__).parent / "snapshots"

USER_CONFTEST = '''
import os

import pytest

pytest_plugins = ["tracengine.testing"]


@pytest.fixture(autouse=True)
def scheduler_change(monkeypatch):
    """PREEMPT_HEAD=1: the head of running gives way instead of the tail (a change under review)."""
    if os.environ.get("PREEMPT_HEAD"):
        from tracengine.engine.scheduler import Scheduler
        original = Scheduler.preempt

        def preempt(self, seq, by):
            if seq is not by and self.running:
                self.running.append(seq)
                seq = self.running.popleft()
            original(self, seq, by)

        monkeypatch.setattr(Scheduler, "preempt", preempt)
'''

USER_TESTS = '''
from tracengine import Config
from tracengine.testing import make_request


def test_recorded_trace(trace_snapshot):
    trace_snapshot.assert_match("traces/preemption.trace")


def test_four_prompts_in_nine_blocks(workload_snapshot):
    config = Config(num_kvcache_blocks=9, kvcache_block_size=4, max_num_batched_tokens=64, max_num_seqs=16,
                    max_model_len=1024, eos=999)
    requests = [make_request(8, max_tokens=6, ignore_eos=True) for _ in range(4)]
    workload_snapshot.assert_match(config, requests, "four_prompts")
'''


@pytest.fixture
def project(pytester):
    return user_project(pytester, USER_CONFTEST, USER_TESTS, "preemption.trace")


@pytest.mark.patches_core
def test_a_user_suite_pins_accepts_and_catches_a_scheduler_change(project, monkeypatch):
    # first run with --snapshot-update stores the tables (pytest-snapshot reports that as an error)
    project.runpytest("--snapshot-update").assert_outcomes(passed=2, errors=2)
    table = stored_snapshot(project, "test_recorded_trace", "preemption.txt").read_text()
    assert table == (SNAPSHOTS / "golden_preemption.txt").read_text()     # the one renderer's table
    assert stored_snapshot(project, "test_four_prompts_in_nine_blocks", "four_prompts.txt").read_text() == \
        (SNAPSHOTS / "preemption_tail.txt").read_text()                   # the canned workload it copies
    project.runpytest().assert_outcomes(passed=2)                         # the unchanged scheduler passes

    monkeypatch.setenv("PREEMPT_HEAD", "1")
    result = project.runpytest()
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    # the trace: re-execution's divergence report, then the diff of the tables
    assert "replay diverges at step 19 (event 0 of the step)" in out
    assert "expected:     19  Preempt           seq_id=2 by_seq_id=0 " in out
    assert "actual:       19  Preempt           seq_id=1 by_seq_id=0 " in out
    assert "replayed state at the divergence:" in out
    assert "the step table differs from" in out and ", first at step 19:" in out
    assert "+++ the scheduler as it now is" in out
    assert "-  19 decode  s0:1@48 s1:1@48 | running_empty (waiting s3 needs 5 free) | append s0+12 s1+15; " \
           "preempt s2(by s0, recompute 48) | free 4" in out
    # the workload: the diff alone, from the first step that schedules differently
    assert ", first at step 1:" in out
    assert "-   1 decode  s0:1@8 s1:1@8 s2:1@8 | running_empty | append s0+8 s1+7 s2+6; " \
           "preempt s3(by s1, recompute 8) | free 0" in out
    assert "+   1 decode  s0:1@8 s1:1@8 s3:1@8 | running_empty | append s0+8 s1+5 s3+4; " \
           "preempt s2(by s1, recompute 8) | free 0" in out
    assert "pytest --snapshot-update" in out

    # accepting: the tables are rewritten (and the trace's new run stored beside its table) ...
    project.runpytest("--snapshot-update").assert_outcomes(passed=2, errors=2)
    assert stored_snapshot(project, "test_recorded_trace", "preemption.trace").is_file()
    assert stored_snapshot(project, "test_recorded_trace", "preemption.txt").read_text() != table
    project.runpytest().assert_outcomes(passed=2)                         # ... and the next run passes
    assert (project.path / "traces" / "preemption.trace").read_bytes() == \
        (ROOT / "traces" / "preemption.trace").read_bytes()                # the recorded trace is not written

    monkeypatch.delenv("PREEMPT_HEAD")                                    # undoing the change is a change too
    project.runpytest().assert_outcomes(failed=2)


def test_a_missing_snapshot_says_how_to_create_it(project):
    result = project.runpytest()
    result.assert_outcomes(failed=2)
    assert "run pytest with --snapshot-update to create it" in result.stdout.str()


GOLDEN = sorted(p.stem for p in (ROOT / "traces").glob("*.trace") if (SNAPSHOTS / f"golden_{p.stem}.txt").exists())


def test_every_golden_trace_has_its_table():
    assert {"worked_example", "preemption", "default_mix", "mixed", "online"} <= set(GOLDEN)


@pytest.mark.parametrize("name", GOLDEN)
def test_trace_snapshot_pins_every_golden_trace(trace_snapshot, name):
    # every policy (mixed.trace) and arrival times (online.trace): the public fixture holds the golden tables
    trace_snapshot.snapshot.snapshot_dir = SNAPSHOTS
    trace_snapshot.assert_match(ROOT / "traces" / f"{name}.trace", f"golden_{name}.txt")


@pytest.mark.parametrize("name", CANNED_WORKLOADS)
@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
def test_workload_snapshot_pins_the_canned_tables_under_each_policy(workload_snapshot, name, policy):
    config, requests, runner = canned_workload(name)
    workload_snapshot.snapshot.snapshot_dir = SNAPSHOTS
    workload_snapshot.assert_match(config.replace(scheduling_policy=policy), requests,
                                   name if policy == "prefill_first" else f"mixed_{name}", eos_at=runner.eos_at)


def test_a_workload_with_arrival_times_runs_on_a_simulated_clock():
    config = Config(num_kvcache_blocks=16, kvcache_block_size=4, max_num_batched_tokens=32, eos=999)
    requests = [make_request(8, max_tokens=4, arrival_ns=0), make_request(20, max_tokens=4, arrival_ns=2_500_000)]
    events = run_requests(config, requests)
    added = {e.seq_id: (e.step, e.arrival_ns) for e in events if type(e) is RequestAdded}
    assert added == {0: (0, 0), 1: (3, 2_500_000)}     # steps of 1 ms: s1 arrives during step 2, enters before 3
    by_steps = run_requests(config, [make_request(8, max_tokens=4), make_request(20, max_tokens=4, arrival_step=3)])
    assert render_steps(by_steps).splitlines()[2:] == render_steps(events).splitlines()[2:]


def test_a_user_policy_class_runs_a_workload():
    from tracengine.engine.policies import BUILTIN_POLICIES

    class HeadFirst(BUILTIN_POLICIES["prefill_first"]):
        """The running head gives way instead of the tail."""
        def preempt(self, seq, by):
            if seq is not by and self.running:
                self.running.append(seq)
                seq = self.running.popleft()
            super().preempt(seq, by)

    config, requests, runner = canned_workload("preemption_tail")
    events = run_requests(config, requests, policy=HeadFirst)
    runs = (events, run_requests(config, requests))
    first_preempted = [next(e for e in run if type(e) is Preempt).seq_id for run in runs]
    assert first_preempted == [2, 3]        # at step 1 s1 needs a block: s2 (behind it) gives way, not the tail s3
    assert events[0].config["scheduling_policy"].endswith(".HeadFirst")


@pytest.mark.parametrize("name", GOLDEN)
def test_render_prints_the_golden_step_tables(name, capsys):
    assert main(["render", str(ROOT / "traces" / f"{name}.trace")]) == 0
    assert capsys.readouterr().out == (SNAPSHOTS / f"golden_{name}.txt").read_text()


def test_render_steps_and_seq(capsys):
    path = str(ROOT / "traces" / "preemption.trace")
    rows = [line for line in (SNAPSHOTS / "golden_preemption.txt").read_text().splitlines() if not line.startswith("#")]
    assert main(["render", path, "--steps", "17:21"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# config: ") and out[1].startswith("# step ")
    assert out[2:] == rows[17:21]
    assert main(["render", path, "--seq", "3"]) == 0
    shown = capsys.readouterr().out.splitlines()[2:]
    assert shown and all(" s3" in row or "s3:" in row or "s3[" in row or "s3(" in row for row in shown)
    assert len(shown) < len(rows)
    assert main(["render", path, "--steps", "5:2"]) == 2
    assert "--steps expects" in capsys.readouterr().err
