"""SGLang's real Scheduler built from flat data: the config fields a trace header records
(`header_config`) and the scheduler they rebuild (`build_scheduler`), on any machine: the device
is "cpu", the model a folder holding only a config.json (a one-layer Llama of the recorded KV
shape, its weights SGLang's "dummy" load format), and the model's forward a stand-in that gives
the tokens it is told (`StandInWorker`): the scheduler, its radix cache, token pool, request
pool, schedule policy and batches are SGLang's own.

The header's config is flat: SERVER_FIELDS, the ServerArgs that decide scheduling, as the
scheduler resolved them (`max_total_tokens` is the token pool's size, whatever the server was
given); MODEL_FIELDS, the KV shape; and `scheduler_loop` ("normal": event_loop_normal; "overlap":
event_loop_overlap, one batch in flight)."""
import json
import os
import tempfile
import warnings

from tracengine.errors import ConfigError, TracengineError

# ServerArgs fields that decide what SGLang's scheduler does, and which `replay --set` changes
SERVER_FIELDS = ("max_total_tokens", "chunked_prefill_size", "max_running_requests", "max_prefill_tokens",
                 "schedule_policy", "schedule_conservativeness", "page_size", "disable_radix_cache",
                 "enable_mixed_chunk", "radix_eviction_policy", "context_length")
MODEL_FIELDS = ("num_kv_heads", "head_dim")
LOOPS = ("normal", "overlap")
_groups_pid = [None]      # the process that made the process groups of the last scheduler built
NO_WATCHDOG_S = 1e9       # SGLang's scheduler watchdog's timeout: a billion seconds, never


def settable_fields() -> list[str]:
    return list(SERVER_FIELDS) + list(MODEL_FIELDS) + ["scheduler_loop"]


def default_config(**overrides) -> dict:
    """A small SGLang config in the header's terms (tests, the driver)."""
    config = {"max_total_tokens": 4096, "chunked_prefill_size": 512, "max_running_requests": 32,
              "max_prefill_tokens": 16384, "schedule_policy": "fcfs", "schedule_conservativeness": 1.0,
              "page_size": 1, "disable_radix_cache": False, "enable_mixed_chunk": False,
              "radix_eviction_policy": "lru", "context_length": 4096, "num_kv_heads": 2, "head_dim": 16,
              "scheduler_loop": "normal"}
    return apply_overrides(config, overrides)


def apply_overrides(config: dict, overrides: dict) -> dict:
    unknown = sorted(set(overrides) - set(settable_fields()))
    if unknown:
        raise ConfigError(f"unknown SGLang config field {unknown[0]!r}; known: {', '.join(settable_fields())}")
    return {**config, **overrides}


def header_config(scheduler) -> dict:
    """The flat config a trace header records for a running SGLang scheduler (resolved values)."""
    args = scheduler.server_args
    config = {name: getattr(args, name) for name in SERVER_FIELDS}
    config.update(max_total_tokens=scheduler.max_total_num_tokens,
                  chunked_prefill_size=scheduler.chunked_prefill_size,
                  max_running_requests=scheduler.max_running_requests,
                  max_prefill_tokens=scheduler.max_prefill_tokens,
                  context_length=scheduler.model_config.context_len)
    hf_config = scheduler.model_config.hf_config
    config["num_kv_heads"] = scheduler.model_config.num_key_value_heads
    config["head_dim"] = getattr(hf_config, "head_dim", None) or scheduler.model_config.head_dim
    config["scheduler_loop"] = "overlap" if scheduler.enable_overlap else "normal"
    return config


class StandInWorker:
    """The model's forward, standing in: each request's next token is `token_of(req, position)`,
    its position in the output (a middle chunk's token SGLang drops): the output processed so
    far and, in the overlap loop, the token of the batch in flight."""

    def __init__(self, token_of, scheduler):
        self.token_of = token_of
        self.scheduler = scheduler

    def forward_batch_generation(self, batch, **kwargs):
        import torch
        from sglang.srt.managers.utils import GenerationBatchResult
        ids = [self.token_of(req, len(req.output_ids) + in_flight_tokens(self.scheduler, req)) for req in batch.reqs]
        return GenerationBatchResult(next_token_ids=torch.tensor(ids, dtype=torch.int64), can_run_cuda_graph=False)


def in_flight_tokens(scheduler, req) -> int:
    """The overlap loop's: the tokens `req` gets from the batches whose results are not processed
    yet (a decode's, or a prefill's that completes its prompt; a middle chunk's is dropped)."""
    n = 0
    for batch, _ in getattr(scheduler, "result_queue", ()):
        for i, r in enumerate(batch.reqs):
            if r is not req:
                continue
            if batch.forward_mode.is_decode() or any(d is req for d in batch.decoding_reqs or ()) \
                    or batch.prefix_lens[i] + batch.extend_lens[i] >= len(req.origin_input_ids) + len(req.output_ids):
                n += 1
    return n


def build_scheduler(config: dict, token_of):
    """SGLang's Scheduler for a header's `config`, on the CPU, its model's forward
    `StandInWorker(token_of)`. Raises ConfigError for a value SGLang refuses."""
    from tracengine.sglang.imports import scheduler_module
    Scheduler = scheduler_module().Scheduler
    from tracengine.sglang.recorder import install_hooks
    install_hooks()     # before the scheduler binds its handlers (abort_request) at construction
    from sglang.srt.distributed import bootstrap, parallel_state
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import PortArgs
    with tempfile.TemporaryDirectory(prefix="tracengine-sglang-") as model_dir:
        server_args = server_args_of(config, model_dir)
        if bootstrap._PARALLEL_INITIALISED:     # one scheduler's groups per process: the last one's go
            if _groups_pid[0] not in (None, os.getpid()):
                raise TracengineError("SGLang's scheduler was built in this process's parent before it forked: a "
                                      "forked sweep worker cannot build another (sweep from a process that built "
                                      "none, as the command line's, or with --jobs 1)")
            parallel_state.destroy_model_parallel()
            parallel_state.destroy_distributed_environment()
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
        with warnings.catch_warnings():     # SGLang's model loading warns of what a CPU lacks
            warnings.simplefilter("ignore")
            scheduler = Scheduler(server_args, PortArgs.init_new(server_args))
    _groups_pid[0] = os.getpid()
    scheduler.model_worker.forward_batch_generation = StandInWorker(token_of, scheduler).forward_batch_generation
    if scheduler.enable_overlap:        # what event_loop_overlap sets up before its first iteration
        from collections import deque
        scheduler.enable_skip_finishing_decode = True
        scheduler.result_queue = deque()
        scheduler._war_barrier_enabled = False     # a CUDA fence (is_cuda()): a CPU has no streams to fence
    return scheduler


def check_config(config: dict) -> None:
    """Raises ConfigError for a config SGLang refuses, building no Scheduler: a process that
    forks sweep workers builds none itself (a forked child cannot tear down its parent's
    process groups, whose threads it does not have)."""
    from tracengine.sglang.imports import scheduler_module
    scheduler_module()
    with tempfile.TemporaryDirectory(prefix="tracengine-sglang-") as model_dir:
        server_args_of(config, model_dir)


def server_args_of(config: dict, model_dir: str):
    """SGLang's ServerArgs for a header's `config` on the CPU, the model's config written to
    `model_dir`; ConfigError for a value SGLang refuses."""
    from sglang.srt.server_args import ServerArgs
    if config.get("scheduler_loop", "normal") not in LOOPS:
        raise ConfigError(f"SGLang's {config['scheduler_loop']} loop is not rebuilt yet (rebuilt: {', '.join(LOOPS)})")
    write_model_config(model_dir, config)
    try:
        # No watchdog: SGLang's event loop feeds it, the drivers here do not, and its thread sends
        # this process's parent SIGQUIT once a scheduler left mid-batch has not stepped for its timeout.
        return ServerArgs(model_path=model_dir, device="cpu", skip_tokenizer_init=True,
                          disable_overlap_schedule=config.get("scheduler_loop", "normal") != "overlap",
                          load_format="dummy", dtype="float32", watchdog_timeout=NO_WATCHDOG_S,
                          random_seed=0, **{name: config[name] for name in SERVER_FIELDS})
    except (ValueError, TypeError, AssertionError) as exc:
        raise ConfigError(f"SGLang refuses the config: {' '.join(str(exc).split())[:300]}") from None


def write_model_config(model_dir: str, config: dict) -> None:
    """A one-layer Llama of the recorded KV shape: the scheduler reads lengths and the KV shape only."""
    hf_config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                 "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1,
                 "num_key_value_heads": config["num_kv_heads"], "head_dim": config["head_dim"],
                 "vocab_size": 32000, "max_position_embeddings": config["context_length"],
                 "torch_dtype": "float32"}
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(hf_config, f)
