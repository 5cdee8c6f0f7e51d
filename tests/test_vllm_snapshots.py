"""tracengine.testing on vLLM's own scheduler, as a user's test suite uses it: a test file in a
fresh project pins a recorded vLLM trace (`trace_snapshot`, re-executed by the installed vLLM)
and a scripted workload driven through vLLM's scheduler by the recorder (`vllm_snapshot`); a
planted change to vLLM's admission fails both at the step it first decides differently."""
import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # torch's and vLLM's own, as they import
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.v1.core.sched.scheduler  # noqa: E402

from tracengine.replay.fold import Fold  # noqa: E402
from tracengine.trace.events import BlockAllocate  # noqa: E402
from tracengine.trace.tracelog import open_trace  # noqa: E402
from helpers import stored_snapshot, user_project  # noqa: E402

ROOT = Path(__file__).parent.parent

USER_CONFTEST = '''
import os

import pytest

pytest_plugins = ["tracengine.testing"]


@pytest.fixture(autouse=True)
def admission_change(monkeypatch):
    """ADMIT_BELOW_3=1: vLLM admits nobody while 3 requests run (a change under review)."""
    if os.environ.get("ADMIT_BELOW_3"):
        from vllm.v1.core.sched.scheduler import Scheduler
        admit = Scheduler._handle_blocked_waiting_request
        monkeypatch.setattr(Scheduler, "_handle_blocked_waiting_request",
                            lambda self, request: len(self.running) < 3 and admit(self, request))
'''

USER_TESTS = '''
from tracengine.testing import make_request


def test_served_trace(trace_snapshot):
    trace_snapshot.assert_match("traces/vllm.trace")


def test_vllm_under_pressure(vllm_snapshot):
    shared = list(range(100, 132))                      # two blocks of 16 every prompt shares
    requests = [make_request(shared + [i] * (20 + 5 * i), max_tokens=16, arrival_step=2 * i) for i in range(8)]
    vllm_snapshot.assert_match(requests, "pressure", num_gpu_blocks=18, max_num_batched_tokens=64, max_num_seqs=16,
                               scheduler_kind="async", eos_at={3: 4}, aborts={12: [6]})
'''

PLANTED = ("ADMIT_BELOW_3", "1")


def planted_step(events) -> int:
    """The first step of a run that admitted a request with 3 or more running: where the planted rule first differs."""
    fold = Fold(events)
    return next(step for step in range(fold.num_steps)
                if any(len(fold.state_at(before_step=step).running) + i >= 3
                       for i, e in enumerate(e for e in fold.events_at(step) if type(e) is BlockAllocate)))


@pytest.fixture
def project(pytester):
    return user_project(pytester, USER_CONFTEST, USER_TESTS, "vllm.trace")


def test_a_user_suite_pins_vllms_scheduling_and_catches_a_planted_change(project, monkeypatch):
    # Everything the user's tests run, run here first: pytester's in-process runs forget the
    # modules they import, and some of vLLM's register torch operators, which a second import refuses.
    from tracengine.vllm.replay import reexecute
    from tracengine.vllm.whatif import whatif
    recorded = list(open_trace(ROOT / "traces" / "vllm.trace"))
    assert reexecute(recorded).ok and whatif(recorded, {}).events
    trace_step, workload_step = planted_step(recorded), planted_step(workload_events())

    project.runpytest("--snapshot-update").assert_outcomes(passed=2, errors=2)      # stores the tables
    table = stored_snapshot(project, "test_vllm_under_pressure", "pressure.txt").read_text()
    assert table.startswith(f"# vLLM {vllm.__version__} (async): max_num_batched_tokens=64")
    assert " mixed " in table and "preempt " in table and "s6:abort(client)" in table
    project.runpytest().assert_outcomes(passed=2)                                  # vLLM as it is passes

    monkeypatch.setenv(*PLANTED)
    result = project.runpytest()
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    # the recorded trace: vLLM's re-execution reports where it parts, then the tables' diff
    assert f"replay diverges at step {trace_step} " in out
    assert f"vllm.txt, first at step {trace_step}:" in out
    # the workload: the diff of the tables, from the first step the planted rule decides
    assert f"pressure.txt, first at step {workload_step}:" in out
    assert "+++ the scheduler as it now is" in out and "pytest --snapshot-update" in out

    project.runpytest("--snapshot-update").assert_outcomes(passed=2, errors=2)     # accepting the change
    assert stored_snapshot(project, "test_served_trace", "vllm.trace").is_file()          # the new run, beside its table
    assert stored_snapshot(project, "test_vllm_under_pressure", "pressure.txt").read_text() != table
    project.runpytest().assert_outcomes(passed=2)
    monkeypatch.delenv(PLANTED[0])
    project.runpytest().assert_outcomes(failed=2)                                 # undoing it is a change too


def workload_events() -> list:
    """USER_TESTS' workload, recorded here (without the planted rule)."""
    from tracengine.vllm.build import default_config
    from tracengine.vllm.drive import RequestSpec, record_workload
    shared = list(range(100, 132))
    specs = [RequestSpec(f"r{i}", shared + [i] * (20 + 5 * i), 16, arrival_step=2 * i, eos_after=5 if i == 3 else 0)
             for i in range(8)]
    return record_workload(default_config(num_gpu_blocks=18, max_num_batched_tokens=64, max_num_seqs=16,
                                          scheduler_kind="async"),
                           specs, aborts={12: ["r6"]})
