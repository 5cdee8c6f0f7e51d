"""The server against clients that push on its limits (issue 34): a huge prompt does not stall
other clients, a chat request without max_tokens gets what fits a small KV cache, bad seeds and
deeply nested bodies are 400s, arrivals are stamped when a request is whole, an abort shows at
once in /metrics and in the trace file, and chat's top_logprobs is refused, not ignored."""
import json
import socket
import threading
from pathlib import Path

import httpx
import openai
import pytest

from tracengine.cli import main
from tracengine.engine.config import Config
from tracengine.engine.llm import LLM
from tracengine.engine.sampling_params import SamplingParams
from tracengine.errors import ConfigError
from tracengine.replay.whatif import whatif
from tracengine.serve.server import ServeApp
from tracengine.trace.events import BlockFree, RequestAdded, SeqAbort
from tracengine.trace.tracelog import open_trace

# a KV cache of 8 blocks of 16 tokens holds 128 tokens, half of max_model_len
CONFIG = dict(max_model_len=256, num_kvcache_blocks=8, kvcache_block_size=16, max_num_seqs=8,
              max_num_batched_tokens=256)
NUM_CACHE_TOKENS = 8 * 16


def wait_for(condition, what: str, timeout: float = 60.0):
    """Polls until `condition()`; the timeout only bounds a hang, no figure depends on it."""
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    llm = LLM("", **CONFIG)
    path = tmp_path_factory.mktemp("hardening") / "served.trace"
    llm.start_recording(str(path))
    app = ServeApp(llm, "127.0.0.1", 0, "embedded").start()
    yield app, llm, path
    app.stop()
    llm.close()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="none", max_retries=0, timeout=60)


def metric(app, name: str, labels: str = 'model_name="embedded"') -> float:
    text = httpx.get(app.url + "/metrics").text
    line = next((line for line in text.splitlines() if line.startswith(f"{name}{{{labels}}} ")), None)
    return 0.0 if line is None else float(line.split()[-1])


def stream_tokens(url: str, prompt: list[int], max_tokens: int, first: threading.Event, out: list) -> None:
    body = {"model": "embedded", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                out.extend(json.loads(line[6:])["choices"][0]["token_ids"])
                first.set()


# -- 1: a huge prompt is tokenized off the event loop --------------------------------------------

def test_a_huge_prompt_does_not_stall_another_clients_stream(served):
    app, llm, _ = served
    tokenizer = llm.tokenizer
    encode = tokenizer.encode
    entered, released = threading.Event(), threading.Event()

    def held_encode(text, *args, **kwargs):
        if len(text) > 100_000:         # the huge prompt: held mid-tokenization until the test lets it go
            entered.set()
            released.wait(60)
        return encode(text, *args, **kwargs)

    tokens: list[int] = []
    first = threading.Event()
    streaming = threading.Thread(target=stream_tokens, args=(app.url, list(range(1, 11)), 60, first, tokens))
    refused = {}
    huge = {"model": "embedded", "prompt": "word " * 200_000, "max_tokens": 4}      # 1 MB of text
    tokenizer.encode = held_encode
    try:
        streaming.start()
        assert first.wait(60)
        sender = threading.Thread(target=lambda: refused.update(r=httpx.post(app.url + "/v1/completions",
                                                                             json=huge, timeout=120)))
        sender.start()
        assert entered.wait(60)
        # while the huge prompt is being tokenized, the stream gets every token and /health answers
        streaming.join(60)
        finished_while_held = not streaming.is_alive()
        health = httpx.get(app.url + "/health", timeout=60).status_code
    finally:
        released.set()
        del tokenizer.encode
    sender.join(60)
    streaming.join(60)
    assert finished_while_held and len(tokens) == 60 and health == 200
    assert refused["r"].status_code == 400 and "maximum context length" in refused["r"].json()["error"]["message"]


# -- 2: max_tokens defaults to what fits -----------------------------------------------------------

def test_chat_without_max_tokens_gets_what_the_kv_cache_holds(served, client):
    # max_model_len is 256 but the cache holds 128 tokens: the default is what fits, 128 - prompt
    r = client.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "tell me all"}],
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == NUM_CACHE_TOKENS
    with pytest.raises(openai.BadRequestError, match="needs 9 KV blocks"):       # asked for: refused
        client.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=NUM_CACHE_TOKENS)


def test_whatif_gives_a_request_that_asked_for_the_whole_context_what_fits_there(tmp_path):
    path = tmp_path / "whole.trace"
    with LLM("", **CONFIG) as llm:
        whole = SamplingParams(temperature=0.0, max_tokens=NUM_CACHE_TOKENS - 10, ignore_eos=True)  # all that fits
        short = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
        llm.generate([list(range(1, 11)), list(range(20, 30))], [whole, short], record=str(path), use_tqdm=False)
    events = list(open_trace(path))
    # 6 blocks hold 96 tokens: the request that asked for all the context gets 96 - 10 = 86
    result = whatif(events, {"num_kvcache_blocks": 6})
    added = {e.seq_id: e.max_tokens for e in result.events if type(e) is RequestAdded}
    assert added == {0: 96 - 10, 1: 20}
    assert result.new["requests"]["num_finished"] == 2


def test_replay_set_in_time_gives_the_whole_context_request_what_fits_there(tmp_path, capsys):
    path = tmp_path / "timed.trace"
    with LLM("", **CONFIG) as llm:
        whole = SamplingParams(temperature=0.0, max_tokens=NUM_CACHE_TOKENS - 10, ignore_eos=True)
        short = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
        llm.generate([list(range(1, 11)), list(range(20, 30))], [whole, short], record=str(path), use_tqdm=False,
                     arrival_ns=[0, 10_000_000])
    # arrival times: the what-if runs in simulated time, as on a server's trace
    assert main(["replay", str(path), "--set", "num_kvcache_blocks=6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["what_if"]["tokens"]["num_completion_tokens"] == 86 + 20


# -- 3: seeds are checked up front -----------------------------------------------------------------

@pytest.mark.parametrize("seed", [1 << 63, -1, 2 ** 70])
def test_an_engine_seed_out_of_range_is_a_config_error(seed):
    with pytest.raises(ConfigError, match=r"seed must be an integer in \[0, 2\*\*63\)"):
        Config(seed=seed)


def test_generate_and_serve_refuse_a_bad_seed_before_touching_a_file(tmp_path, capsys):
    old = tmp_path / "old.trace"
    old.write_bytes(b"keep me")
    argv = ["--prompt", "hi", "--max-tokens", "2", "--seed", str(1 << 63), "--record", str(old), "--force"]
    assert main(["generate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: seed must be") and err.count("\n") == 1
    assert old.read_bytes() == b"keep me"
    assert main(["serve", "--port", "0", "--seed", "-3", "--record", str(old), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: seed must be") and err.count("\n") == 1
    assert old.read_bytes() == b"keep me"


@pytest.mark.parametrize("argv", [["--num-prompts", "3"], ["--num-prompts", "3", "--sweep", "max_num_seqs=2,4"],
                                  ["--num-prompts", "3", "--replicas", "2"]], ids=["run", "sweep", "fleet"])
def test_simulate_refuses_a_bad_workload_seed_as_generate_does(tmp_path, capsys, argv):
    steptime = Path(__file__).parent / "data" / "fixed_steptime.json"
    record = [] if "--sweep" in argv else ["--record", str(tmp_path / "sim.trace")]
    for seed in (1 << 63, -5):
        assert main(["simulate", *argv, "--step-time", str(steptime), "--num-kvcache-blocks", "64",
                     "--seed", str(seed), *record]) == 2
        err = capsys.readouterr().err
        assert err == f"tracengine: error: seed must be an integer in [0, 2**63), got {seed}\n"
    assert not (tmp_path / "sim.trace").exists()


@pytest.mark.parametrize("seed", [1 << 63, -1, -5, 2 ** 64])
def test_a_requests_bad_seed_is_a_400_and_the_engine_goes_on(served, client, seed):
    response = httpx.post(served[0].url + "/v1/completions",
                          json={"model": "embedded", "prompt": "x", "max_tokens": 2, "seed": seed})
    assert response.status_code == 400 and "seed" in response.json()["error"]["message"]
    assert httpx.get(served[0].url + "/health").status_code == 200
    assert client.completions.create(model="embedded", prompt="x", max_tokens=2, seed=(1 << 63) - 1).usage \
        .completion_tokens == 2


# -- 5: a deeply nested body -----------------------------------------------------------------------

@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_deeply_nested_body_is_a_400_with_a_json_error(served, route):
    depth = 100_000
    nested = b"[" * depth + b"]" * depth
    inner = b'"prompt": ' + nested if route == "/v1/completions" else \
        b'"messages": [{"role": "user", "content": "x", "extra": ' + nested + b"}]"
    for content, what in [(b'{"model": "embedded", ' + inner + b"}", "nested too deeply"),
                          (b'{"model": "embedded", "extra": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}",
                           "nested too deeply"),
                          (b"[" * depth + b"]" * depth, "Expected `object`")]:
        response = httpx.post(served[0].url + route, content=content, headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
        assert what in response.json()["error"]["message"]
    assert httpx.get(served[0].url + "/health").status_code == 200


def test_a_server_bug_is_a_500_with_a_json_body(served):
    app = served[0]
    preparer = app.server.preparer

    def broken(raw, cls):
        raise RuntimeError("a bug")
    preparer.prepare = broken
    try:
        response = httpx.post(app.url + "/v1/completions", json={"model": "embedded", "prompt": "x"})
    finally:
        del preparer.prepare
    assert response.status_code == 500 and response.json()["error"]["type"] == "internal_error"
    assert httpx.get(app.url + "/health").status_code == 200


# -- 7: arrival is when the request is whole -------------------------------------------------------

def test_arrival_is_stamped_when_the_body_is_whole(served, client):
    app, llm, path = served
    body = json.dumps({"model": "embedded", "prompt": list(range(300, 317)), "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", app.port)) as slow:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:10])
        # another request arrives, whole, and is served while the first is still uploading
        client.completions.create(model="embedded", prompt=list(range(400, 413)), max_tokens=2)
        slow.sendall(body[10:])
        assert b" 200 OK" in slow.recv(65536).split(b"\r\n")[0]
    client.completions.create(model="embedded", prompt="flush", max_tokens=1)    # a step after it: its frame
    added = [e for e in open_trace(path) if type(e) is RequestAdded]
    fast = next(e for e in added if len(e.prompt_token_ids) == 13 and e.prompt_token_ids[0] == 400)
    late = next(e for e in added if len(e.prompt_token_ids) == 17 and e.prompt_token_ids[0] == 300)
    assert late.arrival_ns >= fast.arrival_ns
    arrivals = [e.arrival_ns for e in added]
    assert arrivals == sorted(arrivals)            # arrival times never go backwards in the trace


# -- 8: an abort is current at once ----------------------------------------------------------------

def test_an_abort_shows_in_the_gauges_at_once(served):
    app, llm, path = served
    aborted = 'finished_reason="abort",model_name="embedded"'
    before = metric(app, "vllm:request_success_total", aborted)
    prompt = list(range(500, 529))            # 29 tokens: its abort is known by its prompt length
    body = {"model": "embedded", "prompt": prompt, "max_tokens": 90, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", app.url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break                      # a token in: it runs; hang up
    # no other request comes: the gauges must follow the abort without a next step
    wait_for(lambda: metric(app, "vllm:request_success_total", aborted) > before, "the abort")
    assert metric(app, "vllm:num_requests_running") == 0.0
    assert metric(app, "vllm:num_requests_waiting") == 0.0
    assert metric(app, "vllm:kv_cache_usage_perc") == 0.0
    # and the abort is in the trace file already: the writer is open and no step has come since
    events = list(open_trace(path))
    found = [i for i, e in enumerate(events) if type(e) is SeqAbort and e.num_prompt_tokens == len(prompt)]
    assert len(found) == 1, "the abort is not in the trace file"
    i = found[0]
    assert (events[i].reason, events[i].status) == ("client", "running")
    assert type(events[i + 1]) is BlockFree and events[i + 1].seq_id == events[i].seq_id


# -- 12: top_logprobs, and one rule for the text --------------------------------------------------

def test_chat_top_logprobs_is_refused_not_ignored(served, client):
    with pytest.raises(openai.BadRequestError, match="top_logprobs is not supported"):
        client.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=2, top_logprobs=3)


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_stream_options_without_stream_is_refused_not_ignored(served, route):
    body = {"model": "embedded", "prompt": "x", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
            "stream_options": {"include_usage": True}}
    response = httpx.post(served[0].url + route, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stream_options"
    assert httpx.post(served[0].url + route, json={**body, "stream": True}).status_code == 200


def test_generate_and_serve_give_the_same_text_without_special_tokens(client):
    sp = SamplingParams(temperature=1.0, max_tokens=100, seed=3)   # a request's seed: the same tokens in any engine
    with LLM("", **CONFIG) as llm:
        out = llm.generate("prompt 0", sp, use_tqdm=False)[0]    # sampled to EOS: <|endoftext|> is its last token
    assert out["finish_reason"] == "eos" and out["token_ids"][-1] == llm.config.eos
    assert "<|endoftext|>" not in out["text"]
    served_text = client.completions.create(model="embedded", prompt="prompt 0", max_tokens=100, temperature=1.0,
                                            seed=3).choices[0].text
    assert out["text"] == served_text
