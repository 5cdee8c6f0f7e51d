"""A request body made ready for the engine: decoded, checked, its prompts rendered
and tokenized, each prompt's size checked against the model and the KV cache.

All of it runs in one tokenizer thread, never on the event loop: a 1 MiB prompt
takes the tokenizer about half a second, and on the event loop that half second
would stall every other client's stream, /health and /metrics (the tokenizer
releases the GIL while it works). One thread, as vLLM's API server has: requests
are prepared in the order they came, and a stream waits for none of them."""
import asyncio
from concurrent.futures import ThreadPoolExecutor

from tracengine.engine.sampling_params import SamplingParams
from tracengine.errors import RequestError
from tracengine.serve.protocol import (APIError, CompletionBody, chat_messages, completion_prompts,
                                       decode_body, plain_chat_prompt, refuse_unsupported, request_sampling)


class RequestPreparer:

    def __init__(self, llm, model_name: str):
        self.llm = llm
        self.model_name = model_name
        self.stopping = False      # set at shutdown: a body still queued here is refused, not tokenized
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracengine-tokenizer")

    async def run(self, raw: bytes, cls) -> tuple[object, list[tuple[list[int], SamplingParams]]]:
        """`prepare` in the tokenizer thread, awaited from the event loop."""
        if self.stopping:     # the executor is shut down: it takes nothing new
            raise APIError(503, "the server is shutting down", type="service_unavailable")
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.prepare, raw, cls)

    def prepare(self, raw: bytes, cls) -> tuple[object, list[tuple[list[int], SamplingParams]]]:
        """The body as `cls` and, for each of its prompts, its token ids and sampling
        parameters; or an APIError that says what is wrong."""
        if self.stopping:
            raise APIError(503, "the server is shutting down", type="service_unavailable")
        body = decode_body(raw, cls)
        self.check_model(body.model)
        refuse_unsupported(body)
        if cls is CompletionBody:
            # as LLM.add_request tokenizes; a prompt over the tokenizer's own limit is ours to refuse
            prompts = [self.llm.tokenizer.encode(p, verbose=False) if isinstance(p, str) else p
                       for p in completion_prompts(body)]
        else:
            prompts = [self.chat_prompt_ids(chat_messages(body))]
        config = self.llm.config
        prepared = []
        for token_ids in prompts:
            sp = request_sampling(body, len(token_ids), config.max_model_len,
                                  config.num_kvcache_blocks * config.kvcache_block_size)
            self.check_token_ids(token_ids, sp.max_tokens)
            prepared.append((token_ids, sp))
        return body, prepared

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                           type="NotFoundError", param="model", code="model_not_found")

    def check_token_ids(self, token_ids: list[int], max_tokens: int) -> None:
        # the size first: a prompt far over max_model_len is refused without a pass over its ids
        try:
            self.llm.scheduler.check_request(len(token_ids), max_tokens)
        except RequestError as exc:
            raise APIError(400, str(exc)) from None
        vocab_size = self.llm.hf_config.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the model's vocabulary of {vocab_size}", param="prompt")

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        tokenizer = self.llm.tokenizer
        if getattr(tokenizer, "chat_template", None):
            from jinja2 import TemplateError     # transformers renders chat templates with jinja2
            try:
                text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            except TemplateError as exc:
                raise APIError(400, f"the chat template refused the messages: {exc}", param="messages") from None
            return tokenizer.encode(text, add_special_tokens=False, verbose=False)
        return tokenizer.encode(plain_chat_prompt(messages), verbose=False)

    def close(self) -> None:
        """Refuse what is still queued; the one body being tokenized finishes on its own."""
        self.stopping = True
        self.executor.shutdown(wait=False)
