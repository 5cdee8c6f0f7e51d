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
import dataclasses
import difflib
import itertools
import os
import random
import tempfile
from pathlib import Path

import msgspec
import pytest

from tracengine.engine.config import Config
from tracengine.engine.llm_engine import LLMEngine
from tracengine.engine.sampling_params import SamplingParams
from tracengine.errors import TracengineError
from tracengine.engine.request import NO_TIME, Request
from tracengine.sim.runners import SyntheticRunner, run_workload
from tracengine.trace.events import StepEnd, WALL_CLOCK_FIELDS

_FRESH_TOKEN_IDS = itertools.count(1 << 30)   # far above any vocabulary a test writes ids from


def make_request(prompt: int | list[int], max_tokens: int = 8, *, arrival_step: int = 0,
                 arrival_ns: int = NO_TIME, ignore_eos: bool = False, temperature: float = 1.0,
                 seq_id: int | None = None) -> Request:
    """One request of a scripted workload. `prompt`: token ids, or a length (that
    many ids no other request shares, so only prompts given as ids share a
    prefix). It enters before step `arrival_step`, or, with `arrival_ns` (ns from the
    start), when the simulated clock reaches it."""
    ids = list(prompt) if not isinstance(prompt, int) else [next(_FRESH_TOKEN_IDS) for _ in range(prompt)]
    return Request(ids, max_tokens, arrival_step=arrival_step, ignore_eos=ignore_eos, temperature=temperature, seq_id=seq_id, arrival_ns=arrival_ns)


def constant_step_time(step_ns: int = 1_000_000):
    """A step-time model in which every step lasts `step_ns` (for workloads with arrival times)."""
    from tracengine.sim.steptime import PARTS, PHASES, LinearStepTime
    row = {part: [step_ns if part == "model_ns" else 0, 0, 0, 0, 0] for part in PARTS}
    return LinearStepTime({phase: dict(row) for phase in PHASES}, source={"model": "constant"})


def run_requests(config: Config, requests: list[Request], runner=None, step_time=None,
                 policy: type | str | None = None) -> list:
    """The requests through the real scheduler with the synthetic runner (or
    `runner`); the events, TraceHeader first. With arrival times (any request
    made with `arrival_ns`) the clock is simulated by `step_time`, by
    default every step lasting 1 ms; otherwise requests enter at their steps.
    `policy`: a Scheduler subclass, or None for the one `config.scheduling_policy` names."""
    runner = runner if runner is not None else SyntheticRunner(eos=config.eos, seed=config.seed)
    if any(r.arrival_ns >= 0 for r in requests):
        from tracengine.engine.policies import BUILTIN_POLICIES, policy_path, scheduler_class
        from tracengine.sim.engine import run_timed     # it refuses a request that can never run
        if policy is not None:
            name = policy_path(scheduler_class(config, policy))
            if name not in BUILTIN_POLICIES:
                raise TracengineError(f"a workload with arrival times runs built-in policies only, not {name}; "
                                      "give arrival steps")
            config = config.replace(scheduling_policy=name)
        timed = [r if r.arrival_ns >= 0 else dataclasses.replace(r, arrival_ns=0) for r in requests]
        return run_timed(config, timed, step_time if step_time is not None else constant_step_time(), runner)
    return run_workload(config, requests, runner, policy=policy)


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
    if header.engine == "vllm":
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
    vLLM's own scheduler schedules a workload (vLLM installed; tracengine/vllm/snapshot.py)."""
    from tracengine.vllm.snapshot import VllmWorkloadSnapshot
    return VllmWorkloadSnapshot(snapshot, request.config.getoption("snapshot_update"))


def random_workload(rng: random.Random, num_requests: int = 8, max_prompt_len: int = 40,
                    max_output_len: int = 12, max_arrival_step: int = 10, block_size: int = 4,
                    vocab_size: int = 1000) -> list[Request]:
    """Requests of random lengths and arrivals; about half share a prefix of whole
    blocks with another prompt, so the prefix cache is exercised."""
    prefixes = [[rng.randrange(vocab_size) for _ in range(block_size * rng.randint(1, 3))] for _ in range(2)]
    requests = []
    for _ in range(num_requests):
        n = rng.randint(1, max_prompt_len)
        prefix = rng.choice(prefixes)[:n] if rng.random() < 0.5 else []
        prompt = prefix + [rng.randrange(vocab_size) for _ in range(n - len(prefix))]
        requests.append(Request(prompt, rng.randint(1, max_output_len), arrival_step=rng.randint(0, max_arrival_step), ignore_eos=rng.random() < 0.3))
    return requests


def _tokens(seq: int, n: int) -> list[int]:
    """n distinct token ids for request `seq`, so only deliberate prefixes are shared."""
    return list(range(1000 + 100 * seq, 1000 + 100 * seq + n))


def canned_workload(name: str) -> tuple[Config, list[Request], SyntheticRunner]:
    """Small workloads that each show one scheduling behaviour (block size 4,
    eos 999): the snapshot tests pin their step tables."""
    R, eos = Request, 999

    def config(**changes):
        values = dict(num_kvcache_blocks=64, kvcache_block_size=4, max_num_batched_tokens=64, max_num_seqs=16,
                      max_model_len=1024, eos=eos)
        return Config(**{**values, **changes})

    shared = _tokens(9, 8)                        # two blocks of a common prefix
    workloads = {
        # the seeds' worked example: budget 20, prompts 25, 8, 6
        "worked_example": (config(max_num_batched_tokens=20),
                           [R(_tokens(0, 25), 3, ignore_eos=True), R(_tokens(1, 8), 3, ignore_eos=True),
                            R(_tokens(2, 6), 3, ignore_eos=True)], {}),
        # s1 needs 6 free blocks while s0 holds 5 of 10: s2 would fit but waits behind s1
        "head_of_line": (config(num_kvcache_blocks=10),
                         [R(_tokens(0, 20), 8, arrival_step=0, ignore_eos=True), R(_tokens(1, 24), 4, arrival_step=1, ignore_eos=True), R(_tokens(2, 4), 2, arrival_step=1, ignore_eos=True)],
                         {}),
        # 4 prompts of 2 blocks in 9 blocks: every sequence needs a third block at once
        "preemption_tail": (config(num_kvcache_blocks=9), [R(_tokens(i, 8), 6, ignore_eos=True) for i in range(4)], {}),
        # s1 needs a block, nobody is left behind it in running: it preempts itself
        "self_preemption": (config(num_kvcache_blocks=4),
                            [R(_tokens(0, 6), 4, ignore_eos=True), R(_tokens(1, 8), 4, ignore_eos=True)], {}),
        # the long tail s2 is preempted; its prefix blocks stay cached and its recompute hits them
        "recompute_prefix_hit": (config(num_kvcache_blocks=8),
                                 [R(_tokens(0, 8), 3, ignore_eos=True), R(_tokens(1, 4), 3, ignore_eos=True),
                                  R(_tokens(2, 20), 3, ignore_eos=True)], {}),
        # s1 shares s0's two prefix blocks while s0 runs; s2 finds them again after both finished
        "shared_prefix": (config(), [R(shared + _tokens(0, 4), 3, arrival_step=0, ignore_eos=True), R(shared + _tokens(1, 6), 3, arrival_step=2, ignore_eos=True),
                                     R(shared + _tokens(2, 1), 2, arrival_step=12, ignore_eos=True)], {}),
        "max_tokens_one": (config(), [R(_tokens(0, 5), 1, ignore_eos=True), R(_tokens(1, 9), 1, ignore_eos=True),
                                      R(_tokens(2, 3), 2, ignore_eos=True)], {}),
        # s0 samples eos at completion 2, s1 at once; s2 ignores its eos; s3 runs to max_tokens
        "eos_vs_length": (config(), [R(_tokens(0, 5), 6), R(_tokens(1, 6), 6), R(_tokens(2, 4), 3, ignore_eos=True),
                                     R(_tokens(3, 4), 3)], {0: 2, 1: 0, 2: 1}),
        # a long prompt arrives while two sequences decode: prefill_first stalls them for its three
        # chunks, mixed decodes them beside each chunk
        "long_prompt_during_decode": (config(max_num_batched_tokens=16),
                                      [R(_tokens(0, 6), 8, arrival_step=0, ignore_eos=True), R(_tokens(1, 4), 8, arrival_step=0, ignore_eos=True),
                                       R(_tokens(2, 40), 2, arrival_step=2, ignore_eos=True)], {}),
    }
    cfg, requests, eos_at = workloads[name]
    return cfg, requests, SyntheticRunner(eos=eos, eos_at=eos_at)


def every_event_type_config() -> Config:
    # 10 blocks of 4 tokens and a budget of 16: chunked prefill, a prefix hit and a preemption
    return Config(num_kvcache_blocks=10, kvcache_block_size=4, max_num_batched_tokens=16, max_num_seqs=4,
                  max_model_len=64, eos=999)


def every_event_type(sink) -> LLMEngine:
    """A run that emits every event type: seq 0 (20 tokens) is chunked 16 + 4, seq 1 hits
    its 8-token prefix, seq 2 preempts itself, seq 3 stops on EOS, the others on length.
    `traces/format-v1.trace` pins it, so it never changes."""
    config = every_event_type_config()
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos, eos_at={3: 2}), sink)
    prefix = list(range(500, 508))
    engine.add_request(prefix + list(range(20, 32)), SamplingParams(max_tokens=8))
    engine.step()
    engine.step()
    engine.add_request(prefix + list(range(40, 45)), SamplingParams(max_tokens=8))
    engine.add_request(list(range(60, 66)), SamplingParams(max_tokens=10))
    engine.add_request(list(range(70, 75)), SamplingParams(max_tokens=6))
    while not engine.is_finished():
        engine.step()
    return engine


def aborts_between_steps(writer) -> LLMEngine:
    """A server's run in engine terms, with each abort flushed as a server's engine loop does
    (format 8's between-steps frames): seq 1 is aborted while seq 0 runs (its frame comes
    before step 2's), seq 0 finishes, then seq 2 arrives, runs two steps and is aborted with
    nothing left to run (its frame is the last before the end frame). `writer`: a TraceWriter.
    `traces/format-v8.trace` pins it."""
    config = every_event_type_config()
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos), writer)
    sp = SamplingParams(max_tokens=5, ignore_eos=True)
    engine.add_request(list(range(20, 30)), sp)
    engine.add_request(list(range(40, 46)), sp)
    engine.step()
    engine.step()
    engine.abort_request(1, "client")
    writer.flush()
    while not engine.is_finished():
        engine.step()
    engine.add_request(list(range(60, 66)), sp)
    engine.step()
    engine.step()
    engine.abort_request(2, "client")
    writer.flush()
    return engine


def every_fleet_event_type(sink=None) -> list:
    """A fleet run that writes every fleet event type (format 4): one prefill and two decode
    replicas, round robin, KV transfers of 0.1 ms plus 1 GB/s; the events, header first (with
    `sink`, a TraceWriter made with `fleet_event_type_header()`, the header alone).
    `traces/format-v4.trace` pins it."""
    from tracengine.sim.fleet import simulate_fleet
    config, spec, step_time, requests = _fleet_event_type_run()
    return simulate_fleet(config, requests, step_time, spec, sink, fleet_event_type_header() if sink else None)


def fleet_event_type_header():
    from tracengine.sim.fleet import fleet_header
    config, spec, step_time, _ = _fleet_event_type_run()
    return fleet_header(config, step_time, spec)


def _fleet_event_type_run():
    from tracengine.sim.fleet import FleetSpec
    from tracengine.engine.request import Request
    from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime
    config = every_event_type_config()
    spec = FleetSpec(num_prefill_replicas=1, num_decode_replicas=2, kv_bytes_per_token=512, kv_transfer_gbps=1.0,
                     kv_transfer_latency_ns=100_000)
    fixed = {part: [1_000_000 if part == "model_ns" else 0] + [0] * (len(FEATURES) - 1) for part in PARTS}
    step_time = LinearStepTime({"prefill": fixed, "decode": fixed})
    prefix = list(range(500, 508))
    requests = [Request(prefix + list(range(20 + 10 * i, 25 + 10 * i)), 4, i * 500_000, seq_id=i)
                for i in range(3)]
    return config, spec, step_time, requests


CANNED_WORKLOADS = ("worked_example", "head_of_line", "preemption_tail", "self_preemption", "recompute_prefix_hit",
                    "shared_prefix", "max_tokens_one", "eos_vs_length", "long_prompt_during_decode")
