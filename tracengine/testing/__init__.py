"""Scheduling snapshot tests, for a user's test suite and for tracengine's own.

A person changing a scheduler pins how it schedules their workloads: a step
table (the one renderer, `tracengine render`) per recorded trace or scripted
workload, stored by pytest-snapshot; a change in behaviour fails the test
with a unified diff of the tables, and `pytest --snapshot-update` accepts it.

    # conftest.py of the project that uses it
    pytest_plugins = ["tracengine.testing"]

    def test_my_trace(trace_snapshot):
        trace_snapshot.assert_match("traces/run.trace")

    def test_my_workload(workload_snapshot):
        config = Config(num_kvcache_blocks=9, kvcache_block_size=4, max_num_batched_tokens=64, eos=999)
        requests = [make_request(8, max_tokens=6, ignore_eos=True) for _ in range(4)]
        workload_snapshot.assert_match(config, requests, "four")

The plugin is opt-in (`pytest_plugins`, or `pytest -p tracengine.testing`)
rather than a `pytest11` entry point: an entry point would load tracengine
and its fixtures into every pytest run of every project in an environment
where tracengine is installed, and would need pytest-snapshot there too
(`pip install tracengine[testing]`); a test suite that wants them says so
in one line, as tracengine's own tests/conftest.py does.

Fixtures: `trace_snapshot` and `workload_snapshot`, and `vllm_snapshot` for vLLM's own
scheduler (all on pytest-snapshot's `snapshot` storage, so `--snapshot-update` accepts a change). Helpers:
`make_request()`, `run_requests()`. For tracengine's own tests, and as examples
of behaviours worth pinning: the canned workloads (`canned_workload`,
`CANNED_WORKLOADS`), `random_workload`, `every_event_type` and `aborts_between_steps`."""
import pytest

from tracengine.testing.snapshots import TraceSnapshot, VllmWorkloadSnapshot, WorkloadSnapshot
from tracengine.testing.workloads import (CANNED_WORKLOADS, aborts_between_steps, canned_workload, constant_step_time,
                                          every_event_type, every_event_type_config, every_fleet_event_type,
                                          fleet_event_type_header, make_request, random_workload, run_requests)

__all__ = ["trace_snapshot", "workload_snapshot", "vllm_snapshot", "make_request", "run_requests", "constant_step_time",
           "random_workload", "canned_workload", "CANNED_WORKLOADS", "every_event_type", "every_event_type_config",
           "aborts_between_steps", "every_fleet_event_type", "fleet_event_type_header"]


@pytest.fixture
def trace_snapshot(snapshot, request) -> TraceSnapshot:
    """`trace_snapshot.assert_match("run.trace")`: re-execute a recorded trace and pin its step table."""
    return TraceSnapshot(snapshot, request.config.getoption("snapshot_update"))


@pytest.fixture
def workload_snapshot(snapshot, request) -> WorkloadSnapshot:
    """`workload_snapshot.assert_match(config, [make_request(...), ...], "name")`: pin a workload's step table."""
    return WorkloadSnapshot(snapshot, request.config.getoption("snapshot_update"))


@pytest.fixture
def vllm_snapshot(snapshot, request):
    """`vllm_snapshot.assert_match([make_request(...), ...], "name", num_gpu_blocks=32)`: pin how
    vLLM's own scheduler schedules a workload (vLLM installed; tracengine/testing/snapshots.py)."""
    return VllmWorkloadSnapshot(snapshot, request.config.getoption("snapshot_update"))

