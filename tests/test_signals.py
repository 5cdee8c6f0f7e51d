"""SIGTERM closes `generate` and `simulate` as SIGINT does (issue 34, item 10): the trace
ends at the last finished step, closed and saying it was interrupted, the exit status is
the documented one, and `generate --output` still writes every finished result."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracengine.cli.common import EXIT_INTERRUPTED, EXIT_TERMINATED
from tracengine.errors import TraceError
from tracengine.trace.tracelog import TraceReader

ROOT = Path(__file__).resolve().parent.parent


def start(argv: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", "import sys; from tracengine.cli import main; "
                             "sys.exit(main(sys.argv[1:]))", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, done, proc: subprocess.Popen) -> None:
    """Polls the trace being recorded until `done(events)` holds (the process must still run)."""
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            with TraceReader(path) as reader:
                if done(list(reader.events())):
                    return
        except (OSError, TraceError):    # not there yet, or its header still being written
            pass
        time.sleep(0.05)


def finished(events) -> int:
    return sum(type(e).__name__ == "SeqFinish" for e in events)


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, EXIT_TERMINATED), (signal.SIGINT, EXIT_INTERRUPTED)])
def test_a_signal_closes_generate_and_keeps_the_finished_results(tmp_path, signum, status):
    workload = tmp_path / "w.jsonl"    # two requests finish early; the third runs until the signal
    workload.write_text("".join(json.dumps({"arrival_s": 0, "prompt_token_ids": [11 + i, 12, 13, 14],
                                            "max_tokens": n, "ignore_eos": True}) + "\n"
                                for i, n in enumerate((2, 3, 1000))))
    proc = start(["generate", "--workload", "w.jsonl", "--record", "run.trace", "--output", "out.jsonl",
                  "--quiet", "--max-model-len", "1024"], tmp_path)
    wait_for(tmp_path / "run.trace", lambda events: finished(events) == 2, proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert err.strip().splitlines()[-1] == f"tracengine: interrupted ({signal.Signals(signum).name})"
    with TraceReader(tmp_path / "run.trace") as reader:
        assert reader.ended and reader.corruption is None and reader.torn_tail is None
        assert reader.run_end.outcome == "interrupted" and reader.run_end.reason == signal.Signals(signum).name
        events = list(reader.events())
    steps = [e.step for e in events if type(e).__name__ == "StepEnd"]
    assert reader.run_end.step == steps[-1]            # the trace ends at the last finished step
    results = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["prompt_token_ids"][0], len(r["token_ids"]), r["finish_reason"]) for r in results] == \
        [(11, 2, "length"), (12, 3, "length")]         # the finished two, in the workload's order
    assert all(r["ttft_s"] > 0 and r["latency_s"] >= r["ttft_s"] for r in results)


def test_sigterm_closes_simulate_like_sigint(tmp_path):
    model = tmp_path / "config.json"
    model.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
                                 "vocab_size": 1000, "torch_dtype": "bfloat16"}))
    proc = start(["simulate", "--num-prompts", "20000", "--input-len", "64", "--output-len", "64",
                  "--roofline", "config.json", "--hardware", "h200", "--set", "num_kvcache_blocks=64",
                  "--record", "sim.trace", "--quiet"], tmp_path)
    wait_for(tmp_path / "sim.trace", lambda events: finished(events) >= 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_TERMINATED, err
    with TraceReader(tmp_path / "sim.trace") as reader:
        assert reader.ended and reader.corruption is None and reader.torn_tail is None
        assert (reader.run_end.outcome, reader.run_end.reason) == ("interrupted", "SIGTERM")
