"""The step-table snapshots behind the fixtures: a recorded trace re-executed (`TraceSnapshot`), a
scripted workload through tracengine's scheduler (`WorkloadSnapshot`) or vLLM's own
(`VllmWorkloadSnapshot`, vLLM installed), each compared with its stored table."""
import difflib
import itertools
import os
import tempfile
from pathlib import Path

import msgspec
import pytest

from tracengine.engine.config import Config
from tracengine.errors import TracengineError
from tracengine.engine.request import Request
from tracengine.sim.runners import SyntheticRunner
from tracengine.trace.events import StepEnd, WALL_CLOCK_FIELDS

from tracengine.testing.workloads import run_requests
from tracengine.trace.header import VLLM, backend_of


class _StepTableSnapshot:
    """Compares a rendered step table with the one stored under `name` in
    pytest-snapshot's directory; stores it with --snapshot-update."""

    def __init__(self, snapshot, update: bool):
        self.snapshot = snapshot
        self.update = update

    def _check(self, table: str, name: str, notes: list[str]) -> None:
        __tracebackhide__ = True
        path = Path(self.snapshot.snapshot_dir) / name
        if self.update or not path.is_file():
            self.snapshot.assert_match(table, name)    # stores it, or says how to; pytest-snapshot reports it
            return
        stored = path.read_text()
        if stored != table:
            notes.append(table_diff(stored, table, os.path.relpath(path)))
        if notes:
            notes.append("accept the new scheduling with `pytest --snapshot-update` (review the diff first)")
            pytest.fail("\n\n".join(notes), pytrace=False)


def first_differing_step(stored: str, table: str) -> int | None:
    """The step of the first row where two step tables differ (None: only the header differs)."""
    a, b = stored.splitlines(), table.splitlines()
    for x, y in itertools.zip_longest(a, b, fillvalue=""):
        if x != y:
            row = x if not x.startswith("#") and x else y
            return int(row.split()[0]) if row and not row.startswith("#") else None
    return None


def table_diff(stored: str, table: str, stored_name: str) -> str:
    """A unified diff of step tables: `-` the stored snapshot, `+` the scheduler as it now is."""
    step = first_differing_step(stored, table)
    head = f"the step table differs from {stored_name}" + (f", first at step {step}" if step is not None else "")
    diff = difflib.unified_diff(stored.splitlines(keepends=True), table.splitlines(keepends=True),
                                fromfile=f"{stored_name} (stored)", tofile="the scheduler as it now is")
    return head + ":\n" + "".join(diff).rstrip("\n")


class TraceSnapshot(_StepTableSnapshot):
    """A recorded trace, re-executed with the scheduler as it now is."""

    def assert_match(self, trace, name: str | None = None, policy: type | str | None = None) -> None:
        """Re-execute the trace at `trace` (a path); on divergence the failure holds
        the divergence report (the step, the expected and the actual event, the
        state around it). Then its step table is compared with the snapshot
        `name` (default: the trace's file name with .txt). The table is the
        trace's when it reproduces, and otherwise that of its workload (prompts,
        arrival steps, recorded outputs) scheduled as the scheduler now does.

        Accepting a divergence (--snapshot-update) also stores that run as
        `<name>.trace` beside the table; from then on the stored run, not the
        recorded one, is what must reproduce. The recorded trace is never written.
        `policy`: the Scheduler subclass to run (a trace recorded with a policy
        that is not built in names it, and it is never imported on its own).
        A trace of vLLM's own scheduler (docs/vllm.md) is re-executed and
        rescheduled by the installed vLLM's."""
        __tracebackhide__ = True
        from tracengine.analysis.render import render_steps
        from tracengine.replay.reexec import divergence_report
        from tracengine.trace.tracelog import TraceReader
        trace = Path(trace)
        name = name or trace.stem + ".txt"
        accepted = Path(self.snapshot.snapshot_dir) / (Path(name).stem + ".trace")
        reference = accepted if accepted.is_file() else trace
        with TraceReader(reference) as reader:
            events = list(reader.events())
            torn = reader.describe_torn_tail()
        if torn is not None:
            pytest.fail(f"{reference}: {torn}: a snapshot pins a whole trace", pytrace=False)
        reexecute, reschedule = _replayers(events[0], policy)
        result = reexecute(events)
        notes = []
        if result.ok:
            table = render_steps(events)
        else:
            rescheduled = reschedule(events)
            table = render_steps(rescheduled)
            if self.update:
                self.snapshot.assert_match(_trace_bytes(rescheduled), accepted.name)
            else:
                notes.append(divergence_report(str(reference), result, events).rstrip("\n"))
        self._check(table, name, notes)


class WorkloadSnapshot(_StepTableSnapshot):
    """A scripted workload through the real scheduler with the synthetic runner."""

    def assert_match(self, config: Config, requests: list[Request], name: str,
                     eos_at: dict[int, int] | None = None, step_time=None, policy: type | str | None = None) -> None:
        """Run `requests` (see `make_request()`) under `config` and compare the step table
        with the snapshot `name` (.txt added if it has no suffix). `eos_at` maps a
        seq_id to the completion index at which the synthetic model samples eos;
        `policy` a Scheduler subclass (default: `config.scheduling_policy`)."""
        __tracebackhide__ = True
        from tracengine.analysis.render import render_steps
        runner = SyntheticRunner(eos=config.eos, seed=config.seed, eos_at=eos_at)
        table = render_steps(run_requests(config, requests, runner, step_time, policy))
        self._check(table, name if Path(name).suffix else name + ".txt", [])


def _replayers(header, policy):
    """(re-execute, reschedule) for a trace: each takes its events; reschedule gives the events of
    its workload scheduled as the scheduler now does. vLLM's scheduler for a vLLM trace."""
    if backend_of(header) == VLLM:
        if policy is not None:
            raise TracengineError("a trace of vLLM's scheduler runs vLLM's scheduler: it takes no policy")
        from tracengine.vllm.replay import reexecute as vllm_reexecute
        from tracengine.vllm.whatif import whatif as vllm_whatif
        return vllm_reexecute, lambda events: vllm_whatif(events, {}).events
    from tracengine.replay.reexec import reexecute
    from tracengine.replay.whatif import whatif
    return (lambda events: reexecute(events, policy)), (lambda events: whatif(events, {}, policy=policy).events)


def _trace_bytes(events) -> bytes:
    """The events as a trace file, wall-clock fields zeroed so the same run gives the same bytes."""
    from tracengine.trace.tracelog import TraceWriter
    header = msgspec.structs.replace(events[0], created_at=0.0)
    zero = {name: 0 for name in StepEnd.__struct_fields__ if name in WALL_CLOCK_FIELDS}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.trace")
        with TraceWriter(path, header) as writer:
            for e in events[1:]:
                writer.emit(msgspec.structs.replace(e, **zero) if type(e) is StepEnd else e)
        return Path(path).read_bytes()


class VllmWorkloadSnapshot(_StepTableSnapshot):
    """A scripted workload through vLLM's own scheduler (installed), driven as vLLM's engine core
    drives it, with made-up tokens (tracengine/vllm/drive.py)."""

    def assert_match(self, requests: list, name: str, *, eos_at: dict[int, int] | None = None,
                     aborts: dict[int, list[int]] | None = None, **config) -> None:
        """Run `requests` (`make_request()`s, entering before their arrival steps, as request
        r{i} for the i-th) through vLLM's scheduler for tracengine.vllm.build.default_config with
        `config`'s vLLM fields (`num_gpu_blocks=32, max_num_batched_tokens=64, scheduler_kind="async",
        policy="priority", ...`) and compare the step table with the snapshot `name`. `eos_at`:
        request index -> the completion index at which it samples EOS; `aborts`: step -> the
        indexes of the requests a client abandons before it is scheduled."""
        __tracebackhide__ = True
        from tracengine.analysis.render import render_steps
        from tracengine.vllm.build import default_config
        from tracengine.vllm.drive import RequestSpec, record_workload
        eos_at = eos_at or {}
        specs = [RequestSpec(f"r{i}", list(r.prompt), r.max_tokens, arrival_step=r.arrival_step,
                             eos_after=eos_at[i] + 1 if i in eos_at else 0) for i, r in enumerate(requests)]
        by_step = {step: [f"r{i}" for i in indexes] for step, indexes in (aborts or {}).items()}
        table = render_steps(record_workload(default_config(**config), specs, aborts=by_step))
        self._check(table, name if Path(name).suffix else name + ".txt", [])
