"""The Starlette application: OpenAI's completions and chat completions
(streamed as server-sent events or not), models, health and metrics.

Every error a client can cause is an OpenAI-shaped JSON body with a 4xx
status; the engine loop never sees a request that failed its checks. A
client that disconnects, streaming or not, aborts its requests. Nothing in a
request names a file: prompts, templates and outputs stay in memory."""
import asyncio
import hmac
import secrets

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tracengine.engine.llm import completion_text
from tracengine.serve.engine_loop import EngineLoop, ServeRequest, ShuttingDown
from tracengine.serve.metrics import CONTENT_TYPE_LATEST
from tracengine.serve.prepare import RequestPreparer
from tracengine.serve.protocol import MAX_BODY_BYTES, APIError, ChatBody, CompletionBody, now, usage

_encode = msgspec.json.Encoder().encode


def json_response(obj, status: int = 200) -> Response:
    return Response(_encode(obj), status, media_type="application/json")


def sse(obj) -> bytes:
    return b"data: " + _encode(obj) + b"\n\n"


class Detokenizer:
    """Text of a growing list of token ids, a piece at a time. The text of the last
    few tokens is decoded again with each new token, so a piece is only given once
    it is whole (no half of a multi-byte character)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.prefix_offset = 0     # decoded again for context: spacing depends on the token before
        self.read_offset = 0       # tokens whose text has been given

    def _decode(self, token_ids) -> str:
        return completion_text(self.tokenizer, token_ids)

    def add(self, token_ids: list[int], final: bool = False) -> str:
        self.token_ids += token_ids
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset:])
        if len(new_text) > len(prefix_text) and (final or not new_text.endswith("\ufffd")):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
            return new_text[len(prefix_text):]
        return ""


class Server:
    """What the handlers share: the engine (through its loop), the metrics, the settings."""

    def __init__(self, llm, engine_loop: EngineLoop, metrics, model_name: str, api_key: str | None = None,
                 max_body_bytes: int = MAX_BODY_BYTES):
        self.llm = llm
        self.engine_loop = engine_loop
        self.metrics = metrics
        self.model_name = model_name
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.preparer = RequestPreparer(llm, model_name)
        self.stopping = asyncio.Event()    # set at shutdown: a body still on its way is not waited for
        self.created = now()

    # -- checks -------------------------------------------------------------------------------

    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # constant time: the comparison does not tell how much of a guess was right
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key):
            raise APIError(401, "invalid or missing API key: send the header 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    async def read_body(self, request: Request) -> bytes:
        """The whole body; a shutdown does not wait for one still on its way (a client that
        sent its headers and stalled)."""
        reading = asyncio.ensure_future(self._read_body(request))
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait((reading, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not reading.done():
            reading.cancel()
            raise APIError(503, "the server is shutting down; the request body had not arrived",
                           type="service_unavailable")
        return reading.result()

    async def _read_body(self, request: Request) -> bytes:
        limit = self.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise APIError(400, f"Content-Length {length!r} is not a number")
            if int(length) > limit:
                raise APIError(400, f"the request body of {int(length)} bytes is over the limit of {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(400, f"the request body is over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    # -- endpoints ----------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, CompletionBody)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, ChatBody)

    async def _generate(self, request: Request, cls) -> Response:
        try:
            self.check_auth(request)
            body, prepared = await self.preparer.run(await self.read_body(request), cls)
            queue: asyncio.Queue = asyncio.Queue()
            event_loop = asyncio.get_running_loop()
            requests = [ServeRequest(token_ids, sp, queue, event_loop) for token_ids, sp in prepared]
            try:
                for r in requests:
                    self.engine_loop.submit(r)
            except ShuttingDown as exc:
                for r in requests:
                    self.engine_loop.abort(r)
                raise APIError(503, str(exc), type="service_unavailable") from None
        except APIError as exc:
            return json_response(exc.body(), exc.status)
        reply = Reply(self, body, requests, queue, cls is ChatBody)
        if body.stream:
            return StreamingResponse(reply.stream(), media_type="text/event-stream",
                                     headers={"cache-control": "no-cache"})
        return await reply.whole(request.receive)

    async def models(self, request: Request) -> Response:
        try:
            self.check_auth(request)
        except APIError as exc:
            return json_response(exc.body(), exc.status)
        config = self.llm.config
        return json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "tracengine",
            "root": self.model_name, "max_model_len": config.max_model_len,
            "vocab_size": self.llm.hf_config.vocab_size}]})

    async def health(self, request: Request) -> Response:
        if not self.engine_loop.alive:
            return json_response(APIError(503, "the engine loop has stopped", type="service_unavailable").body(), 503)
        return Response(b"", 200)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), 200, media_type=CONTENT_TYPE_LATEST)


class Reply:
    """The response to one HTTP request of one or more prompts, streamed or whole."""

    def __init__(self, server: Server, body, requests: list[ServeRequest], queue: asyncio.Queue, chat: bool):
        self.server, self.body, self.requests, self.queue, self.chat = server, body, requests, queue, chat
        self.index = {id(r): i for i, r in enumerate(requests)}
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.object = "chat.completion" if chat else "text_completion"
        self.created = now()
        self.detokenizers = [Detokenizer(server.llm.tokenizer) for _ in requests]

    def _abort_unfinished(self) -> None:
        for r in self.requests:
            self.server.engine_loop.abort(r, "client")

    def _choice(self, i: int, text: str, finish_reason, token_ids: list[int] | None, delta: bool) -> dict:
        if self.chat:
            key = "delta" if delta else "message"
            message = {"content": text} if delta else {"role": "assistant", "content": text}
            if delta and not text and finish_reason is not None:
                message = {}
            choice = {"index": i, key: message, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": i, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if self.body.return_token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
            if not delta:
                choice["prompt_token_ids"] = self.requests[i].prompt_token_ids
        return choice

    def _usage(self) -> dict:
        return usage(sum(len(r.prompt_token_ids) for r in self.requests),
                     sum(r.num_delivered for r in self.requests))

    async def stream(self):
        head = {"id": self.id, "object": self.object + (".chunk" if self.chat else ""), "created": self.created,
                "model": self.server.model_name}
        try:
            if self.chat:
                for i in range(len(self.requests)):
                    yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                    "logprobs": None, "finish_reason": None}]})
            pending = len(self.requests)
            while pending:
                request, output = await self.queue.get()
                i = self.index[id(request)]
                if output.error is not None:
                    pending -= 1
                    yield sse({"error": APIError(500, output.error, type="internal_error").body()["error"]})
                    continue
                final = output.finish_reason is not None
                text = self.detokenizers[i].add(output.token_ids, final)
                if final:
                    pending -= 1
                if text or final or output.token_ids:
                    yield sse({**head, "choices": [self._choice(i, text, output.finish_reason, output.token_ids,
                                                                True)]})
            options = self.body.stream_options
            if options is not None and options.include_usage:
                yield sse({**head, "choices": [], "usage": self._usage()})
            yield b"data: [DONE]\n\n"
        finally:
            # cancelled when the client disconnects: its requests leave the engine
            self._abort_unfinished()

    async def whole(self, receive) -> Response:
        """The whole response; a client that disconnects first aborts its requests."""
        disconnected = asyncio.ensure_future(_disconnect(receive))
        token_ids = [[] for _ in self.requests]
        finish_reasons = [None] * len(self.requests)
        try:
            pending = len(self.requests)
            while pending:
                got = asyncio.ensure_future(self.queue.get())
                await asyncio.wait((got, disconnected), return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    got.cancel()
                    return Response(b"", 499)        # nobody is there to read it
                request, output = got.result()
                i = self.index[id(request)]
                if output.error is not None:
                    raise APIError(500, output.error, type="internal_error")
                token_ids[i] += output.token_ids
                if output.finish_reason is not None:
                    if output.finish_reason == "abort":
                        raise APIError(503, "the server shut down before the request finished",
                                       type="service_unavailable")
                    finish_reasons[i] = output.finish_reason
                    pending -= 1
        except APIError as exc:
            return json_response(exc.body(), exc.status)
        finally:
            disconnected.cancel()
            self._abort_unfinished()
        choices = [self._choice(i, self.detokenizers[i].add(ids, True), finish_reasons[i], ids, False)
                   for i, ids in enumerate(token_ids)]
        return json_response({"id": self.id, "object": self.object, "created": self.created,
                              "model": self.server.model_name, "choices": choices, "usage": self._usage()})


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return json_response(APIError(exc.status_code, str(exc.detail)).body(), exc.status_code)


async def _server_error(request: Request, exc: Exception) -> Response:
    # a bug: the client gets OpenAI's error object, and the log keeps the traceback
    return json_response(APIError(500, "internal server error", type="internal_error").body(), 500)


def build_app(server: Server) -> Starlette:
    routes = [
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics_text, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error, Exception: _server_error})
