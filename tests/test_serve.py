"""`tracengine serve` on a free loopback port, spoken to with the real `openai` client:
completions and chat, streamed and not; concurrent clients get what LLM.generate gives;
a client that disconnects is aborted; bad requests get OpenAI-shaped 4xx errors and the
server goes on serving; the trace it records replays exactly."""
import json
import threading
import time

import httpx
import openai
import pytest

from tracengine.engine.llm import LLM
from tracengine.engine.sampling_params import SamplingParams
from tracengine.replay.reexec import reexecute
from tracengine.serve.protocol import plain_chat_prompt
from tracengine.serve.server import ServeApp
from tracengine.trace.events import SeqAbort
from tracengine.trace.tracelog import open_trace

KEY = "test-key-0123"
CONFIG = dict(max_model_len=128, num_kvcache_blocks=48, kvcache_block_size=16, max_num_seqs=8,
              max_num_batched_tokens=256)
PROMPTS = ["The scheduler decides", "A block of sixteen tokens", "hello world", "Why does a request wait",
           "prefix caching", "one two three four five six"]


def wait_for(condition, what: str, timeout: float = 60.0):
    """Polls until `condition()`; the timeout only bounds a hang, no figure depends on it."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    llm = LLM("", **CONFIG)
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    expected = llm.generate(PROMPTS, greedy, use_tqdm=False)      # before serving: the same engine, alone
    path = tmp_path_factory.mktemp("serve") / "served.trace"
    llm.start_recording(str(path))     # as tracengine serve records
    app = ServeApp(llm, "127.0.0.1", 0, "embedded", api_key=KEY, max_body_bytes=64 << 10).start()
    yield app, llm, expected, path
    app.stop()
    llm.close()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def metric(app, name: str, labels: str = 'model_name="embedded"') -> float:
    text = httpx.get(app.url + "/metrics").text
    line = next(line for line in text.splitlines() if line.startswith(f"{name}{{{labels}}} "))
    return float(line.split()[-1])


def decode(llm, token_ids) -> str:
    return llm.tokenizer.decode(token_ids, skip_special_tokens=True)


def test_completion_whole_and_streamed(served, client):
    app, llm, expected, _ = served
    before = metric(app, "vllm:generation_tokens_total")
    whole = client.completions.create(model="embedded", prompt=PROMPTS[0], max_tokens=12, temperature=0,
                                      extra_body={"return_token_ids": True})
    choice = whole.choices[0]
    assert choice.token_ids == expected[0]["token_ids"]                    # vLLM's return_token_ids extension
    assert choice.text == decode(llm, expected[0]["token_ids"])
    assert choice.finish_reason == {"length": "length", "eos": "stop"}[expected[0]["finish_reason"]]
    num_prompt = len(llm.tokenizer.encode(PROMPTS[0]))
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (num_prompt, len(expected[0]["token_ids"]))
    assert metric(app, "vllm:generation_tokens_total") - before == len(expected[0]["token_ids"])

    chunks = list(client.completions.create(model="embedded", prompt=PROMPTS[0], max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_chat_whole_and_streamed_with_the_plain_template(served, client):
    app, llm, _, _ = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a block?"}]
    prompt_ids = llm.tokenizer.encode(plain_chat_prompt(messages))   # the embedded model has no chat template
    reference = llm.tokenizer.encode("system: Be brief.\nuser: What is a block?\nassistant:")
    assert prompt_ids == reference
    whole = client.chat.completions.create(model="embedded", messages=messages, max_tokens=10, temperature=0)
    assert whole.usage.prompt_tokens == len(prompt_ids)
    assert whole.choices[0].message.role == "assistant" and whole.object == "chat.completion"
    streamed = list(client.chat.completions.create(model="embedded", messages=messages, max_tokens=10,
                                                   temperature=0, stream=True))
    assert streamed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == whole.choices[0].message.content
    assert streamed[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_concurrent_clients_get_what_generate_gives(served):
    app, llm, expected, _ = served
    results = [None] * len(PROMPTS)

    def ask(i):
        c = openai.OpenAI(base_url=app.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        if i % 2:
            chunks = list(c.completions.create(model="embedded", prompt=PROMPTS[i], max_tokens=12, temperature=0,
                                               stream=True, extra_body={"return_token_ids": True}))
            results[i] = [t for ch in chunks for t in ch.choices[0].token_ids]
        else:
            r = c.completions.create(model="embedded", prompt=PROMPTS[i], max_tokens=12, temperature=0,
                                     extra_body={"return_token_ids": True})
            results[i] = r.choices[0].token_ids

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [e["token_ids"] for e in expected]


def test_a_client_that_disconnects_mid_stream_is_aborted(served, client):
    app, llm, _, path = served
    aborted = 'finished_reason="abort",model_name="embedded"'
    aborts_before = metric(app, "vllm:request_success_total", aborted) if aborted in httpx.get(
        app.url + "/metrics").text else 0.0
    prompt = list(range(100, 133))       # 33 tokens: its abort is known by its prompt length
    other = {}
    body = {"model": "embedded", "prompt": prompt, "max_tokens": 90, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=app.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            runner = threading.Thread(target=lambda: other.update(r=client.completions.create(
                model="embedded", prompt="still served", max_tokens=20, temperature=0,
                extra_body={"ignore_eos": True})))
            runner.start()
            data = []
            for line in response.iter_lines():
                if line.startswith("data: "):
                    data.append(line)
                if len(data) == 3:
                    break                # three tokens in: hang up
    runner.join()
    assert other["r"].choices[0].finish_reason == "length" and other["r"].usage.completion_tokens == 20
    wait_for(lambda: aborted in httpx.get(app.url + "/metrics").text
             and metric(app, "vllm:request_success_total", aborted) > aborts_before, "the abort")
    wait_for(lambda: llm.is_finished(), "the engine to go idle")
    assert llm.scheduler.block_manager.num_free_blocks == llm.config.num_kvcache_blocks   # its blocks came back
    assert metric(app, "vllm:kv_cache_usage_perc") == 0.0
    client.completions.create(model="embedded", prompt="x", max_tokens=1)   # a step after it flushes its frame
    aborts = [e for e in open_trace(path) if type(e) is SeqAbort and e.num_prompt_tokens == len(prompt)]
    assert len(aborts) == 1 and aborts[0].reason == "client" and aborts[0].status == "running"
    assert 3 <= aborts[0].num_completion_tokens < 90


@pytest.mark.parametrize("content, status, what", [
    (b'{"model": "embedded", "prompt": ', 400, "not valid JSON"),
    (b'[1, 2]', 400, "Expected `object`"),
    (b'{"model": "embedded", "prompt": "x", "max_tokens": "many"}', 400, "`$.max_tokens`"),
    (b'{"model": "embedded", "prompt": 5}', 400, "`$.prompt`"),
    (b'{"model": "embedded", "prompt": [1.5, true]}', 400, "prompt must be"),
    (b'{"model": "embedded", "messages": []}', 400, "missing required field `prompt`"),
    (b'{"model": "embedded", "prompt": [5000]}', 400, "outside the model's vocabulary"),
    (b'{"model": "embedded", "prompt": "x", "n": 2}', 400, "n is not supported"),
    (b'{"model": "embedded", "prompt": "x", "max_tokens": 500}', 400, "maximum context length is 128"),
    (b'{"model": "gpt-4", "prompt": "x"}', 404, "`gpt-4` does not exist"),
    (b'', 400, "body is empty"),
])
def test_bad_requests_get_an_openai_error_and_the_server_goes_on(served, client, content, status, what):
    app = served[0]
    response = httpx.post(app.url + "/v1/completions", content=content,
                          headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert what in error["message"] and set(error) == {"message", "type", "param", "code"}
    assert client.completions.create(model="embedded", prompt="next", max_tokens=2).usage.completion_tokens == 2


def test_the_checkpoints_chat_template_is_used_when_it_has_one(served, client):
    llm = served[1]
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
    llm.tokenizer.chat_template = template
    try:
        whole = client.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=2)
        with pytest.raises(openai.BadRequestError, match="chat template refused"):
            llm.tokenizer.chat_template = "{{ raise_exception('no system messages') }}"
            client.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "hi"}])
    finally:
        llm.tokenizer.chat_template = None
    assert whole.usage.prompt_tokens == len(llm.tokenizer.encode("[user] hi\n[assistant]", add_special_tokens=False))


def test_sampling_fields_reach_the_engine(served, client):
    app, llm, expected, path = served
    # top_k=1 at temperature 1 samples the most likely token: the greedy output
    r = client.completions.create(model="embedded", prompt=PROMPTS[2], max_tokens=12, temperature=1.0,
                                  extra_body={"top_k": 1, "return_token_ids": True})
    assert r.choices[0].token_ids == expected[2]["token_ids"]
    seeded = [client.completions.create(model="embedded", prompt=PROMPTS[2], max_tokens=8, seed=7,
                                        extra_body={"return_token_ids": True}).choices[0].token_ids for _ in range(2)]
    assert seeded[0] == seeded[1]                 # a request's own seed: the same tokens in any run
    with pytest.raises(openai.BadRequestError, match="top_p must be in"):
        client.completions.create(model="embedded", prompt="x", top_p=1.5)
    with pytest.raises(openai.BadRequestError, match="temperature must be in"):
        client.completions.create(model="embedded", prompt="x", temperature=-1)


def test_a_client_that_disconnects_before_a_whole_response_is_aborted(served, monkeypatch):
    import json
    import socket
    app, llm, _, _ = served
    aborted = 'finished_reason="abort",model_name="embedded"'

    def num_aborted():
        text = httpx.get(app.url + "/metrics").text
        return metric(app, "vllm:request_success_total", aborted) if aborted in text else 0.0

    # the request's decode steps wait until the server has taken the disconnect as an abort: it
    # cannot finish first, however the threads are scheduled
    prompt = list(range(200, 220))
    running, abort_queued = threading.Event(), threading.Event()
    run, abort = llm.runner.run, app.engine_loop.abort

    def held_run(seqs, is_prefill):
        if not is_prefill and any(seq.prompt_token_ids[:1] == prompt[:1] for seq in seqs):
            running.set()
            abort_queued.wait(60)
        return run(seqs, is_prefill)

    def noted_abort(request, reason="client"):
        abort(request, reason)
        abort_queued.set()
    monkeypatch.setattr(llm.runner, "run", held_run)
    monkeypatch.setattr(app.engine_loop, "abort", noted_abort)
    before = num_aborted()
    body = json.dumps({"model": "embedded", "prompt": prompt, "max_tokens": 100, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", app.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert running.wait(60)
    wait_for(lambda: num_aborted() > before, "the abort")
    wait_for(lambda: llm.is_finished(), "the engine to go idle")
    assert llm.scheduler.block_manager.num_free_blocks == llm.config.num_kvcache_blocks


def test_bad_chat_requests(served, client):
    with pytest.raises(openai.BadRequestError, match="messages must be a non-empty list"):
        client.chat.completions.create(model="embedded", messages=[])
    with pytest.raises(openai.BadRequestError, match="role 'robot' is not one of"):
        client.chat.completions.create(model="embedded", messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="only text is supported"):
        client.chat.completions.create(model="embedded", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}])
    assert client.chat.completions.create(model="embedded", messages=[{"role": "user", "content": [
        {"type": "text", "text": "parts"}]}], max_tokens=2).usage.completion_tokens == 2


def test_prompt_longer_than_max_model_len_and_a_body_over_the_bound(served, client):
    with pytest.raises(openai.BadRequestError, match="maximum context length is 128"):
        client.completions.create(model="embedded", prompt=list(range(200)), max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "word " * 200}])
    with pytest.raises(openai.BadRequestError, match="over the limit of 65536"):
        client.completions.create(model="embedded", prompt="x" * 70_000, max_tokens=1)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="other", prompt="x", max_tokens=1)
    assert client.completions.create(model="embedded", prompt="after", max_tokens=3).usage.completion_tokens == 3


def test_api_key_is_required(served, client):
    app = served[0]
    wrong = openai.OpenAI(base_url=app.url + "/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.completions.create(model="embedded", prompt="x", max_tokens=1)
    assert caught.value.status_code == 401 and caught.value.body["code"] == "invalid_api_key"
    assert httpx.get(app.url + "/v1/models").status_code == 401                      # no header at all
    assert httpx.get(app.url + "/v1/models", headers={"Authorization": f"Basic {KEY}"}).status_code == 401
    assert client.models.list().data[0].id == "embedded"
    assert client.completions.create(model="embedded", prompt="x", max_tokens=1).usage.completion_tokens == 1


def test_health_models_metrics_and_unknown_routes(served, client):
    app = served[0]
    assert httpx.get(app.url + "/health").status_code == 200
    model = client.models.list().data[0]
    assert model.id == "embedded" and model.max_model_len == 128
    text = httpx.get(app.url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket"):
        assert f"\n{name}{{" in text, name
    missing = httpx.get(app.url + "/v1/nothing")
    assert missing.status_code == 404 and "error" in missing.json()
    assert httpx.get(app.url + "/v1/completions").status_code == 405


def test_bench_serve_sends_a_workload_and_measures_it(served, capsys):
    import json
    from tracengine.cli import main
    from tracengine.cli.main import build_parser
    from tracengine.cli.flags import workload_spec
    from tracengine.workload.sources import workload_requests
    argv = ["bench-serve", "--url", served[0].url, "--api-key", KEY, "--num-prompts", "6", "--input-len", "8:16",
            "--output-len", "3:7", "--request-rate", "40", "--seed", "3", "--json"]
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    requests = workload_requests(workload_spec(build_parser().parse_args(argv)), 1024)     # the workload it sent
    assert figures["num_completed"] == 6 and figures["num_failed"] == 0
    assert figures["num_completion_tokens"] == sum(r.max_tokens for r in requests)     # synthetic: ignore_eos
    assert figures["num_prompt_tokens"] == sum(len(r.prompt) for r in requests)
    assert figures["ttft_ms"]["count"] == 6 and figures["e2e_ms"]["p50"] >= figures["ttft_ms"]["p50"]
    assert figures["tpot_ms"]["count"] == 6 and figures["itl_ms"]["count"] == sum(r.max_tokens - 1 for r in requests)


def test_bench_serve_shows_its_progress_on_stderr(served, capsys):
    from tracengine.cli import main
    argv = ["bench-serve", "--url", served[0].url, "--api-key", KEY, "--num-prompts", "3", "--input-len", "8:16",
            "--output-len", "2:3", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "Benchmarking" in err and "3/3" in err and "0 failed" in err
    assert json.loads(out)["num_completed"] == 3        # stdout: the figures alone
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_bench_serve_reports_failures(served, capsys):
    from tracengine.cli import main
    assert main(["bench-serve", "--url", served[0].url, "--api-key", "wrong", "--prompt", "x"]) == 2
    assert "answered 401" in capsys.readouterr().err
    assert main(["bench-serve", "--url", served[0].url, "--api-key", KEY, "--prompt", "x" * 600,
                 "--max-tokens", "4"]) == 1
    assert "1 failed" in capsys.readouterr().out


def test_bench_serve_sessions_sends_a_turn_after_the_last_came_back(served, tmp_path, capsys):
    """Closed loop: a later turn is sent its think time after the turn before it came back, after
    that turn's prompt and completion as the server returned them; what was served replays."""
    import asyncio

    from tracengine.cli import main
    from tracengine.serve.bench import run_sessions
    from tracengine.workload.formats import read_workload
    rows = [{"session_id": s, "timestamp": 5 * i, "input_length": 16, "output_length": 4} for i, s in enumerate("ab")]
    rows += [{"session_id": s, "think_ms": 30, "input_length": 8, "output_length": 4} for _ in range(2) for s in "ab"]
    path = tmp_path / "sessions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["bench-serve", "--url", served[0].url, "--api-key", KEY, "--sessions", str(path), "--json",
                 "--quiet"]) == 0
    f = json.loads(capsys.readouterr().out)
    assert f["num_completed"] == 6 and f["sessions"]["num_sessions"] == 2 and f["sessions"]["num_turns_sent"] == 6
    turns = read_workload(str(path), vocab_size=1024)
    results, _ = asyncio.run(run_sessions(served[0].url, turns, "embedded", KEY))
    for session in "ab":
        mine = [(t, r) for t, r in zip(turns, results) if t.session_id == session]
        for (_, before), (turn, after) in zip(mine, mine[1:]):
            # sent no earlier than its think time after the turn before it came back: they never overlap
            assert after.send_s >= before.send_s + before.e2e_s + turn.think_ns / 1e9 - 1e-3
            assert after.num_prompt_tokens == before.num_prompt_tokens + before.num_completion_tokens + 8
    assert reexecute(list(open_trace(served[3]))).ok


def test_what_was_served_replays_exactly(served, client):
    app, llm, _, path = served
    client.completions.create(model="embedded", prompt="last", max_tokens=2)
    events = list(open_trace(path))          # every finished step so far; the writer is still open
    assert sum(type(e).__name__ == "RequestAdded" for e in events) >= 10
    # arrivals are the server's clock: each before the start of the step the request entered at
    starts, t = [], 0
    for e in events:
        if type(e).__name__ == "StepEnd":
            starts.append(t + e.gap_ns)
            t += e.gap_ns + e.schedule_ns + e.model_ns + e.postprocess_ns
    added = [e for e in events if type(e).__name__ == "RequestAdded"]
    assert all(0 <= e.arrival_ns <= starts[e.step] for e in added if e.step < len(starts))
    result = reexecute(events)
    assert result.ok, result.divergence
