"""`tracengine serve` as a process: a signal during traffic aborts the requests in flight,
closes the socket and the trace (end frame), exits 0; `check` calls the trace whole and
`replay` reproduces it. And `tracengine tui --follow` shows a running server's steps, and
the end of the recording across the compaction at close."""
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tracengine.cli import main
from tracengine.trace.events import SeqAbort, SeqFinish
from tracengine.trace.tracelog import TraceReader, open_trace
from tracengine.trace.frames import DEFLATED

REPO = Path(__file__).resolve().parents[1]
ENGINE_FLAGS = ["--max-model-len", "256", "--num-kvcache-blocks", "64", "--max-num-seqs", "4"]


def start_server(path, *flags):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tracengine.cli", "serve", "--port", "0", "--record", str(path),
                             *ENGINE_FLAGS, *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    line = proc.stdout.readline()       # printed once the socket listens
    if "http://" not in line:
        proc.kill()
        raise AssertionError(f"the server did not start: {line!r} {proc.communicate()[1]}")
    return proc, line.split(" on ")[1].split()[0]


def stream(url, prompt_len, max_tokens, got_tokens: threading.Event, out: list):
    body = {"model": "embedded", "prompt": list(range(1, 1 + prompt_len)), "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}
    reasons, num_chunks = [], 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                num_chunks += 1
                got_tokens.set()
                if '"finish_reason":"' in line:
                    reasons.append(line.split('"finish_reason":"')[1].split('"')[0])
            if line == "data: [DONE]":
                reasons.append("[DONE]")
    out.append((num_chunks, reasons))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_traffic_closes_the_trace_whole(tmp_path, sig, capsys):
    path = tmp_path / "live.trace"
    proc, url = start_server(path)
    try:
        started = [threading.Event() for _ in range(3)]
        outs: list = []
        clients = [threading.Thread(target=stream, args=(url, 10 + i, 200, started[i], outs)) for i in range(3)]
        for c in clients:
            c.start()
        for e in started:
            assert e.wait(60)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "stopped after" in err and "Traceback" not in err
        for c in clients:
            c.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # every stream was told: aborted at shutdown, then [DONE]
    assert sorted(reasons for _, reasons in outs) == [["abort", "[DONE]"]] * 3
    with pytest.raises(httpx.ConnectError):                 # the socket is closed
        httpx.get(url + "/health")
    with TraceReader(path) as reader:
        assert reader.ended and reader.torn_tail is None and reader.corruption is None
        words = [word for word, _ in reader.stored_frames()]
    # compacted when the server stopped: most frames deflated (a tiny one stays stored), no copy left
    assert sum(1 for word in words if word & DEFLATED) > len(words) // 2
    assert os.listdir(tmp_path) == ["live.trace"]
    events = list(open_trace(path))
    aborts = [e for e in events if type(e) is SeqAbort]
    assert [e.reason for e in aborts] == ["shutdown"] * 3 and not any(type(e) is SeqFinish for e in events)
    capsys.readouterr()
    assert main(["check", str(path)]) == 0
    assert main(["replay", str(path)]) == 0
    assert "reproduced exactly" in capsys.readouterr().out


def test_a_client_that_sent_only_headers_does_not_hold_the_shutdown(tmp_path, capsys):
    import json
    import socket
    path = tmp_path / "stalled.trace"
    proc, url = start_server(path)
    try:
        started, outs = threading.Event(), []
        client = threading.Thread(target=stream, args=(url, 10, 200, started, outs))
        client.start()
        assert started.wait(60)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as stalled:
            # the headers of a body that never comes
            stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100\r\n\r\n")
            assert httpx.get(url + "/health").status_code == 200       # it is being served
            proc.send_signal(signal.SIGTERM)
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                chunk = stalled.recv(65536)
                if not chunk:
                    break
                answer += chunk
        _, err = proc.communicate(timeout=60)
        client.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and "shutting down" in json.loads(body)["error"]["message"]
    assert proc.returncode == 0 and "Traceback" not in err and "ERROR" not in err, err
    assert outs == [(outs[0][0], ["abort", "[DONE]"])]
    with TraceReader(path) as reader:
        assert reader.ended and reader.corruption is None
    assert main(["check", str(path)]) == 0


def test_a_killed_server_leaves_every_finished_step_stored(tmp_path, capsys):
    path = tmp_path / "killed.trace"
    proc, url = start_server(path)
    try:
        started, outs = threading.Event(), []

        def cut_off():
            with pytest.raises(httpx.TransportError):       # the server dies mid-stream
                stream(url, 10, 200, started, outs)
        client = threading.Thread(target=cut_off)
        client.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        client.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    with TraceReader(path) as reader:
        assert not reader.ended and reader.corruption is None and reader.num_frames > 1
        assert not any(word & DEFLATED for word, _ in reader.stored_frames())   # never closed: stored
    capsys.readouterr()
    assert main(["replay", str(path)]) == 0
    assert "reproduced exactly" in capsys.readouterr().out


def test_a_server_killed_right_after_an_abort_leaves_the_abort_in_its_trace(tmp_path, capsys):
    path = tmp_path / "aborted.trace"
    proc, url = start_server(path)
    try:
        body = {"model": "embedded", "prompt": list(range(1, 24)), "max_tokens": 200, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    break                   # it runs: hang up, the only request, so the server goes idle
        aborted = 'vllm:request_success_total{finished_reason="abort",model_name="embedded"} 1.0'
        for _ in range(6000):               # bounds a hang only
            if aborted in httpx.get(url + "/metrics").text:
                break
            threading.Event().wait(0.01)
        else:
            raise AssertionError("the abort never showed in /metrics")
        proc.send_signal(signal.SIGKILL)    # no step, no close after the abort
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    events = list(open_trace(path))
    assert [(e.reason, e.status, e.num_prompt_tokens) for e in events if type(e) is SeqAbort] == [
        ("client", "running", 23)]
    assert type(events[-1]).__name__ == "BlockFree"      # the abort's, the last thing the server did
    assert main(["check", str(path)]) == 3               # intact, no end frame: its writer was killed
    capsys.readouterr()
    assert main(["replay", str(path)]) == 0
    assert "reproduced exactly" in capsys.readouterr().out


def test_serve_refuses_an_existing_trace_and_a_port_in_use(tmp_path, capsys):
    path = tmp_path / "old.trace"
    path.write_bytes(b"keep me")
    assert main(["serve", "--port", "0", "--record", str(path)]) == 2
    assert "exists; give --force" in capsys.readouterr().err and path.read_bytes() == b"keep me"
    import socket
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tracengine: error: cannot listen on 127.0.0.1:{port}") and err.count("\n") == 1


async def test_tui_follow_sees_a_running_servers_steps(tmp_path):
    from tracengine.engine.llm import LLM
    from tracengine.serve.server import ServeApp
    from tracengine.tui.app import TraceApp
    from tracengine.tui.trace_index import TraceIndex

    path = tmp_path / "live.trace"
    llm = LLM("", record=str(path), max_model_len=128, num_kvcache_blocks=32)
    app = ServeApp(llm, "127.0.0.1", 0).start()
    try:
        tui = TraceApp(TraceIndex(str(path)), follow=True)
        async with tui.run_test(size=(120, 40)) as pilot:
            assert tui.num_steps == 0
            done = threading.Event()

            def ask():
                httpx.post(app.url + "/v1/completions", timeout=60,
                           json={"model": "embedded", "prompt": "follow me", "max_tokens": 6, "ignore_eos": True})
                done.set()

            threading.Thread(target=ask).start()
            for _ in range(3000):          # bounded: a hang fails, the time taken does not matter
                if done.is_set() and tui.num_steps >= 6:
                    break
                await pilot.pause(0.02)
            assert tui.num_steps >= 6 and tui.live        # 1 prefill + 5 decode steps, still recording
            assert tui.step == tui.num_steps - 1          # the view follows the newest step
            before = os.stat(path).st_ino
            app.stop()
            llm.close()                                   # the end frame, then the compacted copy renamed over
            assert os.stat(path).st_ino != before
            for _ in range(3000):
                if not tui.live:
                    break
                await pilot.pause(0.02)
            assert not tui.live and tui.note == "recording ended"     # the old file's end frame
            assert tui.num_steps == llm.num_steps
    finally:
        app.stop()
        llm.close()
