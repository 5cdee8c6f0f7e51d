"""`tracengine bench-serve`: a workload sent to an OpenAI-compatible server
over HTTP, each request at its arrival time, streamed, and the figures of
vLLM's serving benchmark measured at the client:

- TTFT: request sent -> first chunk that carries a token.
- ITL:  between consecutive chunks that carry tokens, pooled over requests.
- TPOT: (e2e - TTFT) / (completion tokens - 1), per request with more than one token.
- E2E:  request sent -> last chunk.
- throughput: requests, completion tokens and all tokens per second of the run's
  duration (first send to last reply).

A sessions workload (docs/workloads.md) is sent closed-loop (`run_sessions`): a later turn only
after the turns it depends on came back and its think time passed, its prompt their tokens as
the server returned them (workload/sessions.py's rule, the one the engine and simulator use).

Completion tokens are the server's `usage` count (stream_options.include_usage),
else the number of token-carrying chunks. Percentiles are `tracengine stats`' own."""
import asyncio
import json
import math
import time
from dataclasses import dataclass, field

import httpx

from tracengine.analysis.figures import summarize
from tracengine.errors import TracengineError
from tracengine.workload.formats import Request


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    send_s: float = 0.0                 # from the start of the run
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)      # the completion's, when the server returns them

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.num_completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_completion_tokens - 1)


def server_model(url: str, api_key: str | None, timeout: float = 30.0) -> dict:
    """The server's first model entry from GET /v1/models."""
    try:
        response = httpx.get(f"{url}/v1/models", headers=_headers(api_key), timeout=timeout)
    except httpx.HTTPError as exc:
        raise TracengineError(f"cannot reach {url}: {exc}") from None
    if response.status_code != 200:
        raise TracengineError(f"{url}/v1/models answered {response.status_code}: {response.text[:200]}")
    try:
        return response.json()["data"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        raise TracengineError(f"{url}/v1/models did not list a model") from None


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def request_body(request: Request, model: str, chat: bool) -> dict:
    body = {"model": model, "max_tokens": request.max_tokens, "temperature": request.temperature,
            "ignore_eos": request.ignore_eos, "stream": True, "stream_options": {"include_usage": True},
            # vLLM's extension: chunks carry their token ids, so a token whose text is held back (half a
            # character) or empty still counts; a server without it ignores the field, and text counts
            "return_token_ids": True}
    for name, unset in (("top_k", -1), ("top_p", 1.0), ("seed", -1)):
        if getattr(request, name) != unset:
            body[name] = getattr(request, name)
    if chat:
        if not isinstance(request.prompt, str):
            raise TracengineError(f"{request.source or 'a request'}: the chat endpoint needs a text prompt, "
                                  "not token ids (use --endpoint completions)")
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    return body


async def _send(client: httpx.AsyncClient, url: str, body: dict, start: float, chat: bool,
                timeout: float) -> RequestResult:
    result = RequestResult()
    sent = time.perf_counter()
    result.send_s = sent - start
    last = None
    num_chunks = 0
    try:
        async with client.stream("POST", url, json=body, timeout=timeout) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = str(chunk["error"].get("message", chunk["error"]))
                    return result
                if chunk.get("usage"):
                    result.num_prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.num_completion_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", ()):
                    result.token_ids += choice.get("token_ids") or ()
                if not _carries_token(chunk, chat):
                    continue
                now = time.perf_counter()
                num_chunks += 1
                if last is None:
                    result.ttft_s = now - sent
                else:
                    result.itl_s.append(now - last)
                last = now
    except (httpx.HTTPError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    if last is None:
        result.error = "no token arrived"
        return result
    result.e2e_s = last - sent
    result.num_completion_tokens = result.num_completion_tokens or num_chunks
    result.ok = True
    return result


def _carries_token(chunk: dict, chat: bool) -> bool:
    for choice in chunk.get("choices", ()):
        if choice.get("token_ids") or (choice.get("delta", {}).get("content") if chat else choice.get("text")):
            return True
    return False


async def run_benchmark(url: str, requests: list[Request], model: str, api_key: str | None = None,
                        chat: bool = False, max_concurrency: int | None = None, timeout: float = 600.0,
                        on_result=None):
    """(results in request order, the run's duration in seconds); `on_result(result)` as each
    request ends (the progress bar)."""
    endpoint = f"{url}/v1/chat/completions" if chat else f"{url}/v1/completions"
    bodies = [request_body(r, model, chat) for r in requests]
    semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    limits = httpx.Limits(max_connections=max_concurrency or max(len(requests), 1), max_keepalive_connections=64)
    async with httpx.AsyncClient(headers=_headers(api_key), limits=limits, timeout=timeout) as client:
        start = time.perf_counter()

        async def one(request: Request, body: dict) -> RequestResult:
            delay = start + request.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if semaphore is None:
                result = await _send(client, endpoint, body, start, chat, timeout)
            else:
                async with semaphore:
                    result = await _send(client, endpoint, body, start, chat, timeout)
            if on_result is not None:
                on_result(result)
            return result

        results = await asyncio.gather(*(one(r, b) for r, b in zip(requests, bodies)))
        duration = time.perf_counter() - start
    return list(results), duration


async def run_sessions(url: str, turns: list[Request], model: str, api_key: str | None = None,
                       timeout: float = 600.0, on_result=None):
    """A sessions workload closed-loop: (results by turn index, None for a turn never sent, its
    session having ended; the run's duration). A turn is sent when SessionRelease releases it, on
    this client's clock: its session's first at its arrival, a later one its think time after
    the turns it depends on came back, after their history (prompt and completion token ids as
    the server returned them). A turn that fails ends its session."""
    from types import SimpleNamespace

    from tracengine.workload.sessions import SessionRelease
    for turn in turns:
        if turn.session_id and turn.depends_on and isinstance(turn.prompt, str):
            raise TracengineError(f"{turn.source or 'a turn'}: a later turn's input is sent after its history's "
                                  "token ids: give it as input_length or prompt_token_ids, not text")
    endpoint = f"{url}/v1/completions"
    release = SessionRelease(turns)
    results: list[RequestResult | None] = [None] * len(turns)
    limits = httpx.Limits(max_connections=max(len(turns), 1), max_keepalive_connections=64)
    async with httpx.AsyncClient(headers=_headers(api_key), limits=limits, timeout=timeout) as client:
        start = time.perf_counter()
        in_flight: dict[asyncio.Task, tuple[int, Request]] = {}
        held = release.pop()
        while held[1] is not None or in_flight:
            now_ns = (time.perf_counter() - start) * 1e9
            while held[1] is not None and held[1].arrival_ns <= now_ns:
                index, turn = held
                body = request_body(turn, model, chat=False)
                in_flight[asyncio.ensure_future(_send(client, endpoint, body, start, False, timeout))] = held
                held = release.pop()
            wait_s = None if held[1] is None else max(0.0, (held[1].arrival_ns - now_ns) / 1e9)
            if not in_flight:
                await asyncio.sleep(wait_s)
                continue
            done, _ = await asyncio.wait(in_flight, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index, turn = in_flight.pop(task)
                result = results[index] = task.result()
                prompt = list(turn.prompt) if not isinstance(turn.prompt, str) else []
                seq = SimpleNamespace(seq_id=index if turn.seq_id is None else turn.seq_id,
                                      token_ids=prompt + result.token_ids, num_prompt_tokens=len(prompt),
                                      finish_reason=None if result.ok else "error")
                finish_ns = round((result.send_s + (result.e2e_s or 0.0)) * 1e9)
                held = release.release([seq], finish_ns, held)
                if on_result is not None:
                    on_result(result)
        duration = time.perf_counter() - start
    return results, duration


def session_figures(turns: list[Request], results: list) -> dict:
    """Per session: its turns sent and not (its session ended first), and its duration, first
    send to last reply, from the client."""
    spans: dict[str, list[float]] = {}
    for turn, r in zip(turns, results):
        if r is not None:
            span = spans.setdefault(turn.session_id, [math.inf, 0.0])
            span[0], span[1] = min(span[0], r.send_s), max(span[1], r.send_s + (r.e2e_s or 0.0))
    return {"num_sessions": len({t.session_id for t in turns}),
            "num_turns_sent": sum(r is not None for r in results),
            "num_turns_unsent": sum(r is None for r in results),
            "duration_ms": {k: (v * 1e3 if k != "count" and v is not None else v)
                            for k, v in summarize([b - a for a, b in spans.values()]).items()}}


def figures(results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    num_completion = sum(r.num_completion_tokens for r in ok)
    num_prompt = sum(r.num_prompt_tokens for r in ok)

    def ms(values):
        return {k: (v * 1e3 if k != "count" and v is not None else v) for k, v in summarize(values).items()}

    return {
        "num_requests": len(results), "num_completed": len(ok), "num_failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "num_prompt_tokens": num_prompt, "num_completion_tokens": num_completion,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_token_throughput": num_completion / duration if duration > 0 else None,
        "total_token_throughput": (num_prompt + num_completion) / duration if duration > 0 else None,
        "ttft_ms": ms([r.ttft_s for r in ok]),
        "tpot_ms": ms([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_ms": ms([x for r in ok for x in r.itl_s]),
        "e2e_ms": ms([r.e2e_s for r in ok]),
    }


def render(f: dict) -> str:
    lines = [f"{'requests':<28}{f['num_completed']} completed, {f['num_failed']} failed of {f['num_requests']}",
             f"{'duration':<28}{f['duration_s']:.3f} s",
             f"{'tokens':<28}{f['num_prompt_tokens']:,} prompt, {f['num_completion_tokens']:,} completion"]
    if f["request_throughput"] is not None:
        lines += [f"{'request throughput':<28}{f['request_throughput']:.2f} req/s",
                  f"{'output token throughput':<28}{f['output_token_throughput']:.1f} tok/s",
                  f"{'total token throughput':<28}{f['total_token_throughput']:.1f} tok/s"]
    lines.append(f"{'':<10}{'n':>7}{'mean':>11}{'p50':>11}{'p90':>11}{'p99':>11}   (ms)")
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        d = f[key]
        values = "".join(f"{'-' if d[k] is None else format(d[k], ',.2f'):>11}" for k in ("mean", "p50", "p90", "p99"))
        lines.append(f"{label:<10}{d['count']:>7}{values}")
    if f.get("sessions"):
        ss, d = f["sessions"], f["sessions"]["duration_ms"]
        lines.append(f"{'sessions':<28}{ss['num_sessions']}: {ss['num_turns_sent']} turns sent, "
                     f"{ss['num_turns_unsent']} never sent (their session ended); duration p50 "
                     f"{'-' if d['p50'] is None else format(d['p50'], ',.2f')} ms")
    for error in f["errors"]:
        lines.append(f"error: {error}")
    return "\n".join(lines)
