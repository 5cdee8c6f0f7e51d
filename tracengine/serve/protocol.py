"""The OpenAI API as far as the engine serves it: request bodies as typed
msgspec structs (unknown fields are ignored, as OpenAI's own server does),
the checks that turn a bad request into a 4xx with an OpenAI-shaped error
body, and the response objects. No I/O, no engine, no HTTP framework."""
import time

import msgspec

from tracengine.engine.sampling_params import SamplingParams
from tracengine.errors import TracengineError
from tracengine.workload.formats import Request
from tracengine.workload.sources import sampling_params

MAX_BODY_BYTES = 1 << 20         # a larger body is refused before it is read


class APIError(Exception):
    """What a request did wrong, as an HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _Sampling(msgspec.Struct, kw_only=True):
    """The fields both endpoints share. None: the default."""
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False          # vLLM's extension: generate max_tokens even past EOS
    return_token_ids: bool = False    # vLLM's extension: the completion's token ids in each choice
    n: int = 1
    stop: str | list[str] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict | None = None


class CompletionBody(_Sampling, kw_only=True):
    prompt: str | list
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class ContentPart(msgspec.Struct):
    type: str
    text: str = ""


class Message(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None


class ChatBody(_Sampling, kw_only=True):
    messages: list[Message]
    max_completion_tokens: int | None = None   # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list | None = None


_decoders = {cls: msgspec.json.Decoder(cls) for cls in (CompletionBody, ChatBody)}


def decode_body(body: bytes, cls):
    """A body as `cls`, or a 400 that says what is wrong and where."""
    if not body.strip():
        raise APIError(400, "the request body is empty; expected a JSON object")
    try:
        return _decoders[cls].decode(body)
    except msgspec.ValidationError as exc:
        raise APIError(400, f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:      # msgspec's depth bound: a hostile body, not a server failure
        raise APIError(400, "the request body is nested too deeply") from None


def refuse_unsupported(body) -> None:
    """Fields whose non-default values the engine cannot honour are a 400, not silently ignored."""
    checks = [("n", body.n != 1), ("stop", bool(body.stop)), ("presence_penalty", body.presence_penalty != 0),
              ("frequency_penalty", body.frequency_penalty != 0), ("logit_bias", bool(body.logit_bias))]
    if isinstance(body, CompletionBody):
        checks += [("echo", body.echo), ("logprobs", body.logprobs is not None),
                   ("best_of", body.best_of not in (None, 1)), ("suffix", body.suffix is not None)]
    else:
        checks += [("logprobs", body.logprobs), ("top_logprobs", bool(body.top_logprobs)), ("tools", bool(body.tools))]
    for name, given in checks:
        if given:
            raise APIError(400, f"{name} is not supported by this server (docs/serve.md)", param=name)
    if body.stream_options is not None and not body.stream:     # ignored otherwise: refused, as vLLM does
        raise APIError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")


def completion_prompts(body: CompletionBody) -> list[str | list[int]]:
    """`prompt` as a list of prompts: a string, token ids, or a list of either."""
    prompt = body.prompt
    if isinstance(prompt, str):
        prompts = [prompt]
    elif prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompts = [prompt]
    elif prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif prompt and all(isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
                        for p in prompt):
        prompts = list(prompt)
    else:
        raise APIError(400, "prompt must be a string, a list of token ids, or a non-empty list of either",
                       param="prompt")
    if any(len(p) == 0 for p in prompts):
        raise APIError(400, "prompt is empty", param="prompt")
    return prompts


def chat_messages(body: ChatBody) -> list[dict]:
    """The messages as plain dicts of role and text (text parts joined)."""
    if not body.messages:
        raise APIError(400, "messages must be a non-empty list", param="messages")
    messages = []
    for i, m in enumerate(body.messages):
        if m.role not in ("system", "user", "assistant", "developer"):
            raise APIError(400, f"messages[{i}].role {m.role!r} is not one of system, user, assistant, developer",
                           param="messages")
        if isinstance(m.content, list):
            kinds = {part.type for part in m.content} - {"text"}
            if kinds:
                raise APIError(400, f"messages[{i}] has a content part of type {sorted(kinds)[0]!r}; only text is "
                               "supported", param="messages")
            text = "".join(part.text for part in m.content)
        else:
            text = m.content or ""
        messages.append({"role": m.role, "content": text})
    return messages


def plain_chat_prompt(messages: list[dict]) -> str:
    """The template of a checkpoint without one (the embedded model): each message on
    its own line as `role: content`, then `assistant:` for the reply (docs/serve.md)."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def request_sampling(body, num_prompt_tokens: int, max_model_len: int, num_cache_tokens: int) -> SamplingParams:
    """The engine's sampling parameters. A chat request without max_tokens gets what the
    context has left, as vLLM gives: max_model_len, or all the KV cache holds where that is
    less (a sequence longer than the cache could never run), minus the prompt."""
    max_tokens = body.max_tokens
    if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
        max_tokens = body.max_completion_tokens
    if max_tokens is None:
        context_len = min(max_model_len, num_cache_tokens)
        max_tokens = 16 if isinstance(body, CompletionBody) else context_len - num_prompt_tokens
        if max_tokens <= 0 and num_prompt_tokens < max_model_len:
            max_tokens = 1              # no room in the cache: the scheduler's check says so
    if max_tokens <= 0:
        if num_prompt_tokens >= max_model_len:
            raise APIError(400, f"This model's maximum context length is {max_model_len} tokens; the prompt has "
                           f"{num_prompt_tokens}", param="messages" if isinstance(body, ChatBody) else "prompt")
        raise APIError(400, f"max_tokens must be a positive integer, got {max_tokens}", param="max_tokens")
    if num_prompt_tokens + max_tokens > max_model_len:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                       f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} in "
                       f"the completion). Please reduce the prompt or max_tokens.", param="max_tokens")
    temperature = 1.0 if body.temperature is None else body.temperature
    if not 0 <= temperature <= 2:
        raise APIError(400, f"temperature must be in [0, 2], got {temperature}", param="temperature")
    if body.top_p is not None and not 0 < body.top_p <= 1:
        raise APIError(400, f"top_p must be in (0, 1], got {body.top_p}", param="top_p")
    if body.top_k is not None and not (body.top_k == -1 or body.top_k > 0):
        raise APIError(400, f"top_k must be -1 (all tokens) or positive, got {body.top_k}", param="top_k")
    if body.seed is not None and not 0 <= body.seed < 1 << 63:     # -1 too: the trace's "no seed"
        raise APIError(400, f"seed must be an integer in [0, 2**63), got {body.seed}", param="seed")
    request = Request([0], max_tokens, temperature=temperature, ignore_eos=body.ignore_eos,
                      top_k=-1 if body.top_k is None else body.top_k, top_p=1.0 if body.top_p is None else body.top_p,
                      seed=-1 if body.seed is None else body.seed)
    try:
        return sampling_params(request)
    except TracengineError as exc:
        raise APIError(400, str(exc).removeprefix("a request: ")) from None


def usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens}


def now() -> int:
    return int(time.time())
