"""SGLang's own HTTP server on the CPU (`python -m sglang.launch_server`: its tokenizer manager, and
its scheduler in a process it spawns, loading plugins as it starts), a one-layer Llama config with
dummy weights and its real forward (torch_native attention): tracengine's plugin records the
scheduler through TRACENGINE_RECORD while /generate requests come over HTTP, SIGTERM stops the
server gracefully (its scheduler's event loop returns, and the trace gets its end frame), and the
trace replays exactly. SGLang's spawned processes import torchvision (not installable over the
CPU torch here), so a sitecustomize puts tracengine's placeholder in each (docs/sglang.md).
Skipped where SGLang, or what its HTTP server imports (soundfile, python-multipart), is not
installed (scripts/install-sglang-cpu.sh installs them)."""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tracengine.trace.events import BlockAllocate, RequestAdded, SeqFinish

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("sglang", "soundfile", "python_multipart")),
    reason="SGLang or its HTTP server's packages (soundfile, python-multipart) are not installed")
REPO = Path(__file__).resolve().parents[1]
SITECUSTOMIZE = "from tracengine.sglang.imports import torchvision_placeholders\ntorchvision_placeholders()\n"
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_hidden_layers": 1, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 32000, "max_position_embeddings": 512, "torch_dtype": "float32"}
START_TIMEOUT_S = 300       # SGLang's import and start take about half a minute here, more on a loaded machine
STOP_TIMEOUT_S = 60         # SIGTERM: its watchdog notices within 5 s, then up to 15 s for the scheduler
PROMPT = [1, 2, 3, 4, 5] * 8
PARAMS = {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, nchars: int = 3000) -> str:
    return path.read_text(errors="replace")[-nchars:]


def wait_until_healthy(server: subprocess.Popen, url: str, stderr: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"SGLang's server exited with {server.returncode} before /health answered:\n{tail(stderr)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=30) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"SGLang's server did not answer /health within {START_TIMEOUT_S} s:\n{tail(stderr)}")


def generate(url: str, rid, input_ids) -> list:
    body = json.dumps({"rid": rid, "input_ids": input_ids, "sampling_params": PARAMS}).encode()
    request = urllib.request.Request(f"{url}/generate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        out = json.loads(response.read())
    return out if isinstance(out, list) else [out]


def stop(server: subprocess.Popen, stderr: Path) -> None:
    """SIGTERM (SGLang's graceful shutdown), then a kill of its whole group if it hangs."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        pytest.fail(f"SGLang's server did not stop within {STOP_TIMEOUT_S} s of SIGTERM:\n{tail(stderr)}")


def test_sglangs_http_server_on_the_cpu_records_through_the_plugin_and_replays(tmp_path):
    from tracengine.cli.common import EXIT_OK
    from tracengine.sglang.replay import reexecute
    from tracengine.trace.tracelog import open_trace
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = tmp_path / "server.trace"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TRACENGINE_RECORD": str(path), "SGLANG_PLUGINS": "tracengine",
           "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}
    stderr = tmp_path / "server.stderr"
    with open(stderr, "w") as err:
        server = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu",
             "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "float32", "--max-total-tokens", "2000",
             "--disable-overlap-schedule", "--attention-backend", "torch_native", "--host", "127.0.0.1",
             "--port", str(port), "--random-seed", "0", "--log-level", "error"],
            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        wait_until_healthy(server, url, stderr)
        outs = generate(url, ["a", "b"], [PROMPT, PROMPT + [9, 9]])      # a batch of two sharing a prefix
        outs += generate(url, "c", PROMPT + [7])                          # a radix-cache hit
        assert [len(out["output_ids"]) for out in outs] == [4, 4, 4]
    finally:
        if server.poll() is None:
            stop(server, stderr)
    assert server.returncode == 0, tail(stderr)
    events = list(open_trace(path))
    assert events[0].engine == "sglang" and events[0].device == "cpu"
    added = {e.request_id: e.seq_id for e in events if type(e) is RequestAdded}
    finished = {e.seq_id: e.num_completion_tokens for e in events if type(e) is SeqFinish}
    assert {"a", "b", "c"} <= added.keys()
    assert [finished[added[rid]] for rid in "abc"] == [4, 4, 4]
    cached = {e.seq_id: e.num_cached_blocks for e in events if type(e) is BlockAllocate}
    assert cached[added["c"]] == len(PROMPT)       # c's prompt found in the radix tree (one token a slot)
    assert reexecute(events).ok
    check = subprocess.run([sys.executable, "-m", "tracengine.cli", "check", str(path)], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert check.returncode == EXIT_OK, check.stdout + check.stderr       # the end frame is there
