"""The recorder inside vLLM's real engine core: vLLM's EngineCore builds the scheduler it is
named (`SchedulerConfig(scheduler_cls="tracengine.vllm.RecordingScheduler")`, as `vllm serve
--scheduler-cls` names it), which records where `additional_config` or $TRACENGINE_RECORD
says; an executor with no model (tracengine/vllm/executor.py) answers the engine core's calls
with made-up tokens, so the engine core runs its own loop (`step`, or `step_with_batch_queue`
with async scheduling), adds requests and processes aborts as it does in a server, and the
trace it leaves re-executes exactly."""
import tempfile
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # torch's and vLLM's own, as they import
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.v1.engine.core  # noqa: E402

from tracengine.trace.events import BlockAllocate, Preempt, ScheduleDecision, SeqAbort, SeqFinish  # noqa: E402
from tracengine.trace.tracelog import TraceReader  # noqa: E402
from tracengine.vllm.recorder import RECORD_ENV  # noqa: E402
from tracengine.vllm.replay import reexecute  # noqa: E402

SHARED_PREFIX = list(range(100, 132))


def engine_core(kind: str, additional_config: dict, speculative: bool = False):
    """vLLM's EngineCore as a server builds it, but for the executor: 32 blocks of 16 (31 usable),
    a budget of 64 tokens, at most 16 sequences; the scheduler class named as --scheduler-cls names it."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.engine.core import EngineCore

    from tracengine.vllm.build import default_config, write_model_config
    from tracengine.vllm.executor import executor_class
    name = "RecordingAsyncScheduler" if kind == "async" else "RecordingScheduler"
    with tempfile.TemporaryDirectory() as model_dir:
        write_model_config(model_dir, default_config(max_model_len=496))
        # 496 tokens: what 31 blocks hold (vLLM refuses a max_model_len the KV cache cannot hold)
        model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=496, dtype="float32",
                                   seed=0)
        more = {}
        if speculative:     # ngram speculative decoding, 3 drafts a step (the executor drafts and accepts them)
            from vllm.config import SpeculativeConfig
            more["speculative_config"] = SpeculativeConfig(
                method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3,
                target_model_config=model_config, target_parallel_config=ParallelConfig())
        config = VllmConfig(
            model_config=model_config,
            scheduler_config=SchedulerConfig(max_model_len=496, is_encoder_decoder=False, max_num_batched_tokens=64,
                                             max_num_seqs=16, long_prefill_token_threshold=0,
                                             scheduler_cls=f"tracengine.vllm.{name}",
                                             async_scheduling=kind == "async"),
            cache_config=CacheConfig(block_size=16, enable_prefix_caching=True, num_gpu_blocks_override=32),
            device_config=DeviceConfig(device="cpu"),
            parallel_config=ParallelConfig(distributed_executor_backend="tracengine.vllm.executor.NoModelExecutor"),
            additional_config=additional_config, **more)
        return EngineCore(config, executor_class=executor_class(), log_stats=True)


def serve(core, num_requests: int = 16) -> int:
    """The engine core's busy loop (EngineCoreProc.run_busy_loop): requests come in between steps
    (one every other step), a client leaves between steps (req-9 at step 24) and two while a step
    runs (req-12, req-4: the aborts queue, processed before that step's output); returns the number
    of step_fn calls."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    num_added = num_steps = 0
    while num_added < num_requests or core.scheduler.has_requests() or core.batch_queue:
        if num_added < num_requests and num_steps >= 2 * num_added:
            request = EngineCoreRequest(
                request_id=f"req-{num_added}", prompt_token_ids=SHARED_PREFIX + [num_added] * (20 + 5 * num_added),
                mm_features=None, sampling_params=SamplingParams(max_tokens=32, ignore_eos=True),
                pooling_params=None, arrival_time=float(num_added), lora_request=None, cache_salt=None,
                data_parallel_rank=None)
            core.add_request(*core.preprocess_add_request(request))
            num_added += 1
            continue
        if num_steps == 24:
            core.abort_requests(["req-9"])
        if num_steps == 30:
            core.aborts_queue.put(["req-12", "req-4"])
        _, model_executed = core.step_fn()
        core.post_step(model_executed)      # (the engine core's drafts, with speculative decoding)
        num_steps += 1
        assert num_steps < 5000, "the engine core never finished"
    return num_steps


@pytest.fixture
def no_device_teardown(monkeypatch):
    # EngineCore.shutdown ends by emptying the accelerator's cache, which a torch without an
    # accelerator refuses; the scheduler (and its trace) is shut down before that
    monkeypatch.setattr(vllm.v1.engine.core, "cleanup_dist_env_and_memory", lambda: None)
    yield
    # the engine core's start-up settles its process for serving (its heap frozen out of the
    # garbage collector, vLLM's environment variables cached): this process goes on testing
    import gc

    from vllm.envs import disable_envs_cache
    gc.unfreeze()
    disable_envs_cache()


@pytest.mark.parametrize("kind, where", [("sync", "additional_config"), ("async", "environment")])
def test_vllms_engine_core_runs_the_recorder_and_its_trace_reexecutes_exactly(tmp_path, monkeypatch,
                                                                              no_device_teardown, kind, where):
    path = tmp_path / "served.trace"
    monkeypatch.delenv(RECORD_ENV, raising=False)
    if where == "environment":
        monkeypatch.setenv(RECORD_ENV, str(path))
        core = engine_core(kind, {})
    else:
        core = engine_core(kind, {"tracengine": {"record": str(path)}})
    assert type(core.scheduler).__name__ == ("RecordingAsyncScheduler" if kind == "async" else "RecordingScheduler")
    assert core.batch_queue_size == (2 if kind == "async" else 1)
    num_steps = serve(core)
    core.shutdown()
    with TraceReader(path) as reader:
        assert reader.ended                    # the engine core's shutdown closed the trace
        events = list(reader.events())
    header = events[0]
    assert (header.engine, header.engine_version, header.config["scheduler_kind"]) == ("vllm", vllm.__version__, kind)
    assert header.config["num_gpu_blocks"] == 32 and header.config["max_num_batched_tokens"] == 64
    decisions = [e for e in events if type(e) is ScheduleDecision]
    # a step_fn call schedules once (sync), or schedules, waits for the oldest output, or both (async)
    assert len(decisions) == num_steps if kind == "sync" else len(decisions) < num_steps
    assert {d.phase for d in decisions} >= {"decode", "mixed"}
    assert any(e.num_cached_blocks == 2 for e in events if type(e) is BlockAllocate)     # the shared prefix
    assert any(type(e) is Preempt for e in events)
    assert {e.seq_id for e in events if type(e) is SeqAbort} == {4, 9, 12}
    in_flight = {e.seq_id: e.num_steps_in_flight for e in events if type(e) is SeqAbort}
    assert in_flight[4] == in_flight[12] == in_flight[9] + 1      # the aborts queue's: while a step ran
    assert sum(1 for e in events if type(e) is SeqFinish) == 13
    result = reexecute(events)
    assert result.ok, result.divergence
    assert result.num_steps == len(decisions) and result.num_events == len(events) - 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_vllms_engine_core_with_ngram_speculative_decoding_replays_exactly(tmp_path, monkeypatch, no_device_teardown,
                                                                           kind):
    # the engine core gives a synchronous scheduler the executor's drafts after each step
    # (post_step); an async one's worker drafts for the placeholders the scheduler holds
    from collections import Counter
    path = tmp_path / "served.trace"
    monkeypatch.delenv(RECORD_ENV, raising=False)
    core = engine_core(kind, {"tracengine": {"record": str(path)}}, speculative=True)
    serve(core)
    core.shutdown()
    with TraceReader(path) as reader:
        assert reader.ended
        events = list(reader.events())
    assert events[0].config["speculative_method"] == "ngram" and events[0].config["num_speculative_tokens"] == 3
    types = Counter(type(e).__name__ for e in events)
    assert types["SpecDecode"] and types["SpecAccepted"] and types["Preempt"]
    assert bool(types["SpecDraft"]) == (kind == "sync")
    assert {a for e in events if type(e).__name__ == "SpecAccepted" for a in e.num_accepted} == {0, 1, 2, 3}
    from tracengine.cli import main
    assert main(["check", str(path)]) == 0
    result = reexecute(events)
    assert result.ok, result.divergence
