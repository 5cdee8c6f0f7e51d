"""An executor for vLLM's engine core with no model and no device: it answers the engine
core's calls (the KV cache's spec and size, model execution) and makes up each step's
sampled tokens, so vLLM's real EngineCore (or `vllm serve`) runs its real loop, calling
the scheduler's schedule, update_from_output and finish_requests in its own order, on a
CPU. What the recorder sees then is what it sees in production, the model aside.

    vllm serve MODEL_DIR --distributed-executor-backend tracengine.vllm.executor.NoModelExecutor \
        --scheduler-cls tracengine.vllm.RecordingScheduler --num-gpu-blocks-override 512 ...

The KV cache is one full-attention group over the model's layers, of
`num_gpu_blocks_override` blocks (required). A request samples a token in a step where its
scheduled tokens reach the end of what it holds (prompt and tokens sampled so far), as a
model runner does; the token is made up from the request's id and position. The executor
follows each request as a model runner does (new, cached, resumed, finished), from the
SchedulerOutputs alone."""
import functools
import zlib
from concurrent.futures import Future

from tracengine.vllm.drive import FIRST_TOKEN_ID, NUM_TOKEN_IDS


def made_up_token(req_id: str, position: int) -> int:
    """The token a request samples at `position` (of all its tokens): made up from both."""
    return FIRST_TOKEN_ID + zlib.crc32(f"{req_id}:{position}".encode()) % NUM_TOKEN_IDS


def _done(value) -> Future:
    future = Future()
    future.set_result(value)
    return future


def __getattr__(name):
    # Lazy, as tracengine.vllm's recording classes: vLLM resolves the executor's path by getattr
    if name == "NoModelExecutor":
        return executor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def executor_class() -> type:
    """NoModelExecutor: vLLM's Executor with `_NoModel` in front, made once, when first asked for."""
    from vllm.v1.executor.abstract import Executor

    class NoModelExecutor(_NoModel, Executor):
        """vLLM's Executor with no model: made-up tokens, a KV cache of `num_gpu_blocks_override` blocks."""

    NoModelExecutor.__module__, NoModelExecutor.__qualname__ = __name__, "NoModelExecutor"
    return NoModelExecutor


class _NoModel:
    """What NoModelExecutor answers in place of a model's workers."""

    def _init_executor(self) -> None:
        if self.cache_config.num_gpu_blocks_override is None:
            raise ValueError("NoModelExecutor has no device to size the KV cache: give num_gpu_blocks_override "
                             "(--num-gpu-blocks-override N)")
        self.num_tokens: dict[str, int] = {}       # req_id -> the tokens it holds (prompt and sampled)
        self.last_output = None

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return True

    def kv_cache_spec(self) -> dict:
        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        model = self.model_config
        spec = FullAttentionSpec(block_size=self.cache_config.block_size,
                                 num_kv_heads=model.get_total_num_kv_heads(), head_size=model.get_head_size(),
                                 dtype=model.dtype if isinstance(model.dtype, torch.dtype) else torch.float32)
        return {f"layer.{i}": spec for i in range(model.get_total_num_hidden_layers())}

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
        if method == "get_kv_cache_spec":
            result = self.kv_cache_spec()
        elif method == "determine_available_memory":
            # exactly the memory of the blocks asked for (the override decides the count anyway)
            specs = self.kv_cache_spec()
            spec = next(iter(specs.values()))
            result = spec.page_size_bytes * len(specs) * self.cache_config.num_gpu_blocks_override
        elif method == "get_supported_tasks":
            result = ("generate",)
        elif method == "get_supported_kv_cache_layouts":
            result = ["LBNHC"]        # vLLM's default layout; nothing is laid out
        else:       # initialize_from_config, compile_or_warm_up_model, set_kv_cache_layout, ...: nothing to do
            result = None
        return _done([result]) if non_block else [result]

    def compile_or_warm_up_model(self) -> None:
        pass        # nothing to compile

    def execute_model(self, scheduler_output, non_block: bool = False):
        output = self.sampled(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            result = output           # nothing ran, nothing to sample: the output now, as a model runner gives it
        else:
            self.last_output, result = output, None    # None: the tokens come from sample_tokens
        return _done(result) if non_block else result

    def sample_tokens(self, grammar_output, non_block: bool = False):
        output, self.last_output = self.last_output, None
        return _done(output) if non_block else output

    def sampled(self, so):
        """The ModelRunnerOutput of a step: a made-up token for each request whose scheduled tokens
        reach the end of what it holds, none for one still mid-prefill."""
        from vllm.v1.outputs import ModelRunnerOutput
        for req_id in so.finished_req_ids:
            self.num_tokens.pop(req_id, None)
        computed = {}
        for new in so.scheduled_new_reqs:
            held = new.prefill_token_ids if new.prefill_token_ids is not None else new.prompt_token_ids
            self.num_tokens[new.req_id] = max(self.num_tokens.get(new.req_id, 0), len(held))
            computed[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for req_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens):
            computed[req_id] = num_computed
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        verified = so.scheduled_spec_decode_tokens
        for req_id in req_ids:
            tokens = []
            if computed[req_id] + so.num_scheduled_tokens[req_id] >= self.num_tokens[req_id]:
                position = self.num_tokens[req_id]
                tokens = [made_up_token(req_id, position)]
                if verified.get(req_id):      # speculative decoding: the drafts that are its tokens, too
                    tokens = self.accepted(req_id, position, verified[req_id])
                self.num_tokens[req_id] = position + len(tokens)
            sampled.append(tokens)
        if self.vllm_config.speculative_config is not None:
            self.drafts = self.propose([r for r, tokens in zip(req_ids, sampled) if tokens])
        return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled)

    def accepted(self, req_id: str, position: int, drafts: list[int]) -> list[int]:
        """The tokens a verification samples: the drafts that are the request's tokens (spec.py's
        rule), then one. With async scheduling the scheduler holds placeholders: the worker's own drafts."""
        from tracengine.vllm.spec import made_up_drafts, num_accepted
        token_at = functools.partial(made_up_token, req_id)
        if drafts[0] == -1:
            drafts = made_up_drafts(req_id, position, len(drafts), token_at)
        return [token_at(position + j) for j in range(num_accepted(drafts, position, token_at) + 1)]

    def propose(self, req_ids):
        """The next drafts of the requests that sampled (a drafter's), which the engine core takes."""
        from vllm.v1.outputs import DraftTokenIds

        from tracengine.vllm.spec import made_up_drafts
        k = self.vllm_config.speculative_config.num_speculative_tokens
        return DraftTokenIds(req_ids, [made_up_drafts(r, self.num_tokens[r], k, functools.partial(made_up_token, r))
                                       for r in req_ids])

    def take_draft_token_ids(self):
        drafts, self.drafts = getattr(self, "drafts", None), None
        return drafts

    def check_health(self) -> None:
        pass
