"""`tracengine simulate`: a workload through the real scheduler in simulated
time, with no model and no torch; its trace is an ordinary one."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracengine.analysis.stats import stats
from tracengine.cli.main import main
from tracengine.replay.reexec import reexecute as replay
from tracengine.trace.tracelog import TraceReader

DATA = Path(__file__).parent / "data"
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000, "torch_dtype": "bfloat16"}


@pytest.fixture
def roofline(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_simulate_writes_a_trace_that_reads_replays_and_shows_in_stats(tmp_path, roofline, capsys):
    out = str(tmp_path / "sim.trace")
    assert main(["simulate", str(DATA / "mooncake_sample.jsonl"), "--roofline", roofline, "--hardware", "H100",
                 "--set", "num_kvcache_blocks=400", "--set", "kvcache_block_size=16", "--record", out]) == 0
    text = capsys.readouterr().out
    assert "simulated 4 requests" in text and "roofline" in text and f"wrote {out}" in text
    with TraceReader(out) as reader:
        events = list(reader.events())
    assert events[0].config["num_kvcache_blocks"] == 400 and events[0].device == "simulated (roofline)"
    assert replay(events).ok
    s = stats(out)
    assert s["requests"]["num_finished"] == 4
    # the simulated durations are on the time axis: 1 ms of overhead per step at least
    assert s["steps"]["total_s"] >= s["steps"]["num_steps"] * 1e-3
    assert main(["stats", out]) == 0 and "4 requests" in capsys.readouterr().out
    assert main(["replay", out]) == 0
    # no overwrite without --force
    assert main(["simulate", str(DATA / "mooncake_sample.jsonl"), "--roofline", roofline, "--hardware", "H100",
                 "--set", "num_kvcache_blocks=400", "--record", out]) == 2
    assert "exists" in capsys.readouterr().err


def test_simulate_synthetic_workload_at_a_request_rate(tmp_path, roofline, capsys):
    out = str(tmp_path / "sim.trace")
    assert main(["simulate", "--num-prompts", "12", "--request-rate", "50", "--roofline", roofline,
                 "--peak-tflops", "1", "--bandwidth-tbs", "0.1", "--set", "num_kvcache_blocks=256",
                 "--set", "kvcache_block_size=4", "--record", out]) == 0
    with TraceReader(out) as reader:
        arrivals = [e.arrival_ns for e in reader.events() if type(e).__name__ == "RequestAdded"]
    assert len(arrivals) == 12 and arrivals == sorted(arrivals) and arrivals[-1] > 0


def test_simulate_errors_are_one_line(tmp_path, roofline, capsys):
    sample = str(DATA / "mooncake_sample.jsonl")
    for argv, message in [
        ([sample, "--set", "num_kvcache_blocks=400"], "needs step times"),
        ([sample, "--roofline", roofline, "--hardware", "H100"], "num_kvcache_blocks"),
        ([sample, "--roofline", roofline], "--hardware or both"),
        ([sample, "--roofline", roofline, "--hardware", "H100", "--set", "num_kvcache_blocks=2"], "can never run"),
        (["--roofline", roofline, "--hardware", "H100", "--set", "num_kvcache_blocks=4"], "WORKLOAD"),
        ([str(tmp_path / "missing.jsonl"), "--roofline", roofline, "--hardware", "H100",
          "--set", "num_kvcache_blocks=4"], "missing.jsonl"),
    ]:
        assert main(["simulate", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("tracengine: error:") and message in err and err.count("\n") == 1, (argv, err)


def test_simulate_imports_no_torch(tmp_path, roofline):
    code = ("import sys; from tracengine.cli.main import main; "
            f"rc = main(['simulate', {str(DATA / 'mooncake_sample.jsonl')!r}, '--roofline', {roofline!r}, "
            "'--hardware', 'H200', '--set', 'num_kvcache_blocks=400']); "
            "assert rc == 0, rc; assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
