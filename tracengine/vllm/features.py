"""What the recorder records exactly, and what it refuses: a recorder never writes a trace that
cannot replay. Every feature vLLM's scheduler can see that a trace does not hold is named here;
a scheduler configured with one refuses to record when it is built (one line, so that `vllm
serve --scheduler-cls tracengine.vllm.RecordingScheduler` stops before serving), unless the
user says to record anyway ($TRACENGINE_RECORD_ANYWAY=1, or additional_config {"tracengine":
{"record_anyway": true}}): the trace's header then lists what it lacks (TraceHeader.not_recorded)
and `replay` and `check` say so first (trace/header.py's not_recorded_note).

Recorded, so not refused: speculative decoding by ngram (spec.py, with a dynamic draft length
too), LoRA, a hybrid model's KV
cache groups (full attention, sliding window, Mamba: group_blocks.py), a KV connector of any
kind (connector.py: its answers and transfers are events; a replay needs no connector), structured
output (structured.py: its grammars' answers are events; a replay needs no grammar backend).

A request can bring a feature the config does not show (streaming input, a cache salt, structured
output with drafts, ...): the recording ends before it, with a RunEnd naming it, and serving goes
on; the trace holds every step before it, whole."""
import os

from tracengine.errors import ConfigError

RECORD_ANYWAY_ENV = "TRACENGINE_RECORD_ANYWAY"
# speculative decoding methods whose scheduling a trace holds whole: drafts, verified tokens and
# acceptances are events (vllm/spec.py); others reserve lookahead slots and drop blocks by rules
# a trace does not hold (EAGLE, MTP, draft models)
RECORDED_SPEC_METHODS = ("ngram",)
# the specs of a hybrid model's KV cache groups whose blocks a trace holds, group by group
# (group_blocks.py): their managers change a request's blocks only inside allocate_slots and free
RECORDED_GROUP_SPECS = frozenset({"FullAttentionSpec", "SlidingWindowSpec", "MambaSpec"})


def record_anyway(vllm_config) -> bool:
    """Whether the user asked to record a config with features the trace does not hold."""
    extra = vllm_config.additional_config
    options = extra.get("tracengine", {}) if isinstance(extra, dict) else {}
    if isinstance(options, dict) and "record_anyway" in options:
        return bool(options["record_anyway"])
    return os.environ.get(RECORD_ANYWAY_ENV, "") not in ("", "0")


def config_features(vllm_config, kv_cache_config) -> list[str]:
    """The features of a scheduler's config that a trace does not hold, named; [] for none."""
    found = []
    spec = vllm_config.speculative_config
    if spec is not None and spec.method not in RECORDED_SPEC_METHODS:
        found.append(f"speculative decoding with method {spec.method!r} (recorded: "
                     f"{', '.join(RECORDED_SPEC_METHODS) or 'none'})")
    if vllm_config.ec_transfer_config is not None:
        found.append("an encoder cache connector (ec_transfer_config)")
    groups = kv_cache_config.kv_cache_groups
    kinds = {type(g.kv_cache_spec).__name__ for g in groups}
    if len(groups) == 1 and kinds != {"FullAttentionSpec"}:
        found.append(f"a KV cache group of {kinds.pop()} (tracengine records FullAttentionSpec, or several groups)")
    elif len(groups) > 1 and not kinds <= RECORDED_GROUP_SPECS:
        found.append(f"a KV cache group of {sorted(kinds - RECORDED_GROUP_SPECS)[0]} in a hybrid model (recorded: "
                     f"{', '.join(sorted(RECORDED_GROUP_SPECS))})")
    if len(groups) > 1 and vllm_config.kv_transfer_config is not None:
        # a connector's answers name the first group's blocks (connector.py)
        found.append("hybrid KV cache groups with a KV connector")
    if getattr(kv_cache_config, "hisparse_host_num_blocks", None) is not None:
        found.append("HiSparse host KV blocks")
    model = vllm_config.model_config
    if model is not None:
        if model.is_multimodal_model or getattr(model, "supports_multimodal_inputs", False):
            found.append("multimodal encoder inputs")
        if model.runner_type == "pooling":
            found.append("pooling (runner_type 'pooling')")
        if model.is_encoder_decoder:
            found.append("an encoder-decoder model")
        if getattr(model, "is_diffusion", False) or vllm_config.diffusion_config is not None:
            found.append("diffusion decoding")
    parallel = vllm_config.parallel_config
    for name, what in (("pipeline_parallel_size", "pipeline parallelism"),
                       ("data_parallel_size", "data parallelism (prefill throttling across ranks)"),
                       ("decode_context_parallel_size", "decode context parallelism"),
                       ("prefill_context_parallel_size", "prefill context parallelism")):
        if getattr(parallel, name, 1) > 1:
            found.append(f"{what} ({name}={getattr(parallel, name)})")
    if vllm_config.aux_output_config.enabled:
        found.append("auxiliary outputs (aux_output_config, which caps prefix-cache hits)")
    return found


def refuse_unrecorded(vllm_config, kv_cache_config) -> list[str]:
    """The features a recording of this config would not hold: a ConfigError naming the first
    (one line), unless the user records anyway; then the list, for the header."""
    found = config_features(vllm_config, kv_cache_config)
    if found and not record_anyway(vllm_config):
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ConfigError(f"tracengine cannot record this vLLM scheduler: it does not record {found[0]}{more}, "
                          f"so the trace would not replay; {RECORD_ANYWAY_ENV}=1 records anyway (the trace's "
                          f"header then names what it lacks)")
    return found


def request_features(request, scheduler=None) -> list[str]:
    """What a request brings that a trace of `scheduler` does not hold; [] for none. A KV connector
    reads a request's KV transfer parameters, and a grammar its structured output: the scheduler
    acts only on their answers, which are recorded (connector.py, structured.py); but with drafts
    a grammar also cuts the drafts given, which is not recorded."""
    found = []
    has_connector = scheduler is not None and scheduler.connector is not None
    if request.prompt_token_ids is None:
        found.append("a prompt given as embeddings")
    if getattr(request, "structured_output_request", None) is not None and \
            (scheduler is None or scheduler.vllm_config.speculative_config is not None):
        found.append("structured output with speculative decoding")
    if request.pooling_params is not None:
        found.append("pooling")
    if getattr(request, "resumable", False):
        found.append("streaming input")
    if request.mm_features:
        found.append("multimodal inputs")
    if request.cache_salt is not None:
        found.append("a cache salt")
    if (request.kv_transfer_params and not has_connector) or getattr(request, "ec_transfer_params", None):
        found.append("KV transfer parameters")
    if getattr(request, "skip_reading_prefix_cache", False):
        found.append("skip_reading_prefix_cache")
    return found

