"""SGLang's own scheduler in simulated time (tracengine/sglang/timed.py, replay/scheduler_backends.py), the
third backend of the engine interface: `simulate --scheduler sglang`, the what-if of an SGLang
trace in simulated time, and sweeps of both. A what-if in time equals simulating the workload
through SGLang's scheduler with that config (`tracengine diff` finds no scheduling difference),
a simulated trace re-executes exactly, and every row of a sweep is the run it stands for made
alone (skipped where SGLang is not installed: scripts/install-sglang-cpu.sh)."""
import importlib.util
import json
from pathlib import Path

import pytest

from tests.helpers import table_of, write_mooncake
from tracengine.analysis.stats import stats
from tracengine.cli import main
from tracengine.sim.sweep import IN_TIME, render_rows, row_of
from tracengine.trace.events import RequestAdded, SeqAbort
from tracengine.trace.tracelog import open_trace

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")
FIXED = str(Path(__file__).parent / "data" / "fixed_steptime.json")
TRACES = Path(__file__).resolve().parents[1] / "traces"
BASE = ["--set", "max_total_tokens=2000", "--set", "chunked_prefill_size=128"]


def simulate_argv(workload, *extra, step_time: str = FIXED) -> list[str]:
    return ["simulate", workload, "--scheduler", "sglang", "--step-time", step_time, "--length-scale", "0.25",
            "--time-scale", "20", *extra]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """The workload and the trace `simulate --scheduler sglang` records of it under BASE."""
    folder = tmp_path_factory.mktemp("sglang-timed")
    workload = write_mooncake(folder / "mooncake.jsonl", 20)
    path = folder / "base.trace"
    assert main(simulate_argv(workload, *BASE, "--record", str(path))) == 0
    return workload, path


def test_a_simulated_trace_holds_arrival_times_and_replays_exactly(simulated):
    from tracengine.sglang.replay import reexecute
    events = list(open_trace(simulated[1]))
    header = events[0]
    assert (header.engine, header.device) == ("sglang", "simulated (linear)")
    added = [e for e in events if type(e) is RequestAdded]
    assert len(added) == 20 and all(e.arrival_ns >= 0 for e in added)
    s = stats(events)
    assert s["requests"]["num_finished"] == 20 and s["prefix_cache"]["num_hit_tokens"] > 0
    assert reexecute(events).ok


def test_a_timed_whatif_equals_simulating_sglang_with_that_config(simulated, tmp_path, capsys):
    workload, base = simulated
    assert_timed_whatif_is_simulating(workload, base, FIXED, tmp_path, capsys)


def assert_timed_whatif_is_simulating(workload, base, step_time: str, tmp_path, capsys, *settings: str):
    """`replay base --set chunked_prefill_size=64` in simulated time: under the recorded config it
    is the recorded run, under 64 it is simulate's run of the workload with 64 (and `settings`)."""
    whatif, direct = tmp_path / "whatif.trace", tmp_path / "direct.trace"
    assert main(["replay", str(base), "--set", "chunked_prefill_size=64", "--step-time", step_time,
                 "--record", str(whatif)]) == 0
    out = capsys.readouterr().out
    assert "in simulated time: chunked_prefill_size 128 -> 64" in out
    for line in out.splitlines()[3:24]:     # the recorded config in simulated time is the recorded run
        assert line.split()[-3] in ("+0.0%", "-"), line
    assert main(simulate_argv(workload, "--set", "max_total_tokens=2000", "--set", "chunked_prefill_size=64",
                              *settings, "--record", str(direct), step_time=step_time)) == 0
    capsys.readouterr()
    assert main(["diff", str(whatif), str(direct)]) == 0
    assert "no scheduling difference in" in capsys.readouterr().out
    assert stats(whatif)["latency"] == stats(direct)["latency"]
    assert stats(whatif)["steps"]["num_steps"] != stats(base)["steps"]["num_steps"]


def sweep_rows(argv, capsys) -> list[dict]:
    assert main(argv + ["--json", "--no-cache"]) == 0
    return [v["figures"] for v in json.loads(capsys.readouterr().out)["variants"]]


def test_sweeps_give_each_variants_own_run(simulated, tmp_path, capsys):
    """A sweep of the trace in simulated time and simulate's sweep: each row is the run of its
    config made alone. (One job: this process built SGLang schedulers, which a forked worker
    cannot tear down; the command line's process builds none before it forks.)"""
    workload, base = simulated
    rows = sweep_rows(["replay", str(base), "--step-time", FIXED, "--sweep", "chunked_prefill_size=64,128",
                       "--jobs", "1"], capsys)
    direct = tmp_path / "direct.trace"
    assert main(simulate_argv(workload, "--set", "max_total_tokens=2000", "--set", "chunked_prefill_size=64",
                              "--record", str(direct))) == 0
    capsys.readouterr()
    assert rows == [row_of(stats(direct)), row_of(stats(base))] and rows[0] != rows[1]
    assert main(simulate_argv(workload, "--set", "max_total_tokens=2000", "--sweep", "chunked_prefill_size=64,128",
                              "--jobs", "1", "--no-cache")) == 0
    table = table_of(capsys.readouterr().out)
    assert table[0].startswith("simulate 20 requests through SGLang's scheduler with")
    assert table[1:] == render_rows([{"chunked_prefill_size": 64}, {"chunked_prefill_size": 128}], rows,
                                    IN_TIME).splitlines()


def test_the_golden_traces_whatif_in_time_keeps_its_departures(tmp_path, capsys):
    """The driver's trace has arrival steps, not times: its requests arrive at the recorded start of
    the step they came before, its clients leave at the start of the step they left before."""
    from tracengine.sglang.replay import reexecute
    new = tmp_path / "new.trace"
    assert main(["replay", str(TRACES / "sglang.trace"), "--set", "chunked_prefill_size=32", "--step-time", FIXED,
                 "--record", str(new)]) == 0
    capsys.readouterr()
    events = list(open_trace(new))
    assert [e.seq_id for e in events if type(e) is SeqAbort] == \
        [e.seq_id for e in open_trace(TRACES / "sglang.trace") if type(e) is SeqAbort]
    assert reexecute(events).ok


def test_simulate_refuses_what_sglang_does_not_take(simulated, tmp_path, capsys):
    workload, _ = simulated
    assert main(simulate_argv(workload, "--set", "chunk_size=3")) == 2
    assert "unknown SGLang config field 'chunk_size'" in capsys.readouterr().err
    assert main(simulate_argv(workload, "--num-kvcache-blocks", "64")) == 2
    assert "--num-kvcache-blocks is tracengine's engine's" in capsys.readouterr().err
    assert main(["simulate", workload, "--scheduler", "sglang"]) == 2
    assert "simulate needs step times" in capsys.readouterr().err


def test_a_request_aborted_in_the_step_it_arrived_replays():
    """A client that leaves before the step it arrived for: added and aborted in the same step."""
    from tracengine.sglang.build import default_config
    from tracengine.sglang.drive import RequestSpec
    from tracengine.sglang.replay import reexecute
    from tracengine.sglang.timed import run_config
    from tracengine.sim.steptime import load_step_time
    specs = [RequestSpec(f"r{i:02d}", [1, 2, 3, 4] * 8 + [i] * 12, 6, arrival_ns=i * 40_000_000) for i in range(12)]
    specs[3].abort_ns = specs[3].arrival_ns      # it leaves as it comes: before the step it came for
    events, _ = run_config(default_config(max_total_tokens=300, chunked_prefill_size=64), specs,
                           load_step_time(FIXED))
    abort = next(e for e in events if type(e) is SeqAbort)
    assert (abort.seq_id, abort.status) == (3, "waiting")
    assert next(e for e in events if type(e) is RequestAdded and e.seq_id == 3).step == abort.step
    assert reexecute(events).ok


SCHEDULE_NS, POSTPROCESS_NS = 6_000_000, 5_000_000     # the CPU's part of each step, in cpu_steptime


@pytest.fixture(scope="module")
def overlapped(simulated, tmp_path_factory):
    """FIXED with CPU time (SCHEDULE_NS, POSTPROCESS_NS each step: a decode's 11 ms of CPU to its
    10 ms forward), and the traces of the workload under it through the normal and overlap loops."""
    folder = tmp_path_factory.mktemp("sglang-overlap")
    model = json.loads(Path(FIXED).read_text())
    for phase in ("prefill", "decode"):
        model["coefficients"][phase]["schedule_ns"][0] = SCHEDULE_NS
        model["coefficients"][phase]["postprocess_ns"][0] = POSTPROCESS_NS
    step_time = folder / "cpu_steptime.json"
    step_time.write_text(json.dumps(model))
    paths = {}
    for loop in ("normal", "overlap"):
        paths[loop] = folder / f"{loop}.trace"
        assert main(simulate_argv(simulated[0], *BASE, "--set", f"scheduler_loop={loop}", "--record",
                                  str(paths[loop]), step_time=str(step_time))) == 0
    return str(step_time), paths


def test_the_overlap_loop_in_simulated_time_overlaps_the_cpu_with_the_forward(overlapped):
    """A step of the overlap loop lasts max(its forward, the CPU's scheduling of the next step and
    processing of the last one), not their sum: a decode between decodes 11 ms (the CPU's), not
    21; its trace re-executes exactly, and the run ends sooner than the normal loop's."""
    from tracengine.sglang.replay import reexecute
    from tracengine.trace.events import ScheduleDecision, StepEnd
    _, paths = overlapped
    runs = {loop: list(open_trace(path)) for loop, path in paths.items()}
    events = runs["overlap"]
    assert events[0].config["scheduler_loop"] == "overlap" and events[0].device == "simulated (linear)"
    assert reexecute(events).ok
    phases = [e.phase for e in events if type(e) is ScheduleDecision]
    ends = [e for e in events if type(e) is StepEnd]
    durations = [e.schedule_ns + e.model_ns + e.postprocess_ns for e in ends]
    assert all(e.gap_ns >= 0 and e.model_ns >= 0 for e in ends)
    steady = [durations[k] for k in range(1, len(ends) - 1) if phases[k - 1:k + 2] == ["decode"] * 3]
    assert steady and set(steady) == {SCHEDULE_NS + POSTPROCESS_NS}
    assert all(e.postprocess_ns == POSTPROCESS_NS for e in ends)
    normal = [e for e in runs["normal"] if type(e) is StepEnd]
    assert {e.schedule_ns + e.model_ns + e.postprocess_ns for e in normal} == \
        {SCHEDULE_NS + ns + POSTPROCESS_NS for ns in (10_000_000, 100_000_000)}
    s = {loop: stats(run) for loop, run in runs.items()}
    assert s["overlap"]["requests"]["num_finished"] == s["normal"]["requests"]["num_finished"] == 20
    assert sum(e.gap_ns for e in ends) + sum(durations) < sum(e.gap_ns + e.schedule_ns + e.model_ns + e.postprocess_ns
                                                               for e in normal)
    assert s["overlap"]["latency"]["e2e"]["seconds"]["mean"] < s["normal"]["latency"]["e2e"]["seconds"]["mean"]


def test_an_overlap_traces_whatif_in_time_equals_simulating_it(simulated, overlapped, tmp_path, capsys):
    """The what-if in simulated time of an overlap trace runs the overlap loop: under the recorded
    config it is the recorded run, under another it is simulate's run of that config."""
    workload, _ = simulated
    step_time, paths = overlapped
    assert_timed_whatif_is_simulating(workload, paths["overlap"], step_time, tmp_path, capsys,
                                      "--set", "scheduler_loop=overlap")


def test_simulate_searches_the_capacity_of_sglangs_scheduler(simulated, tmp_path, capsys):
    """`simulate --scheduler sglang --search request_rate`: each probe is SGLang's scheduler run at
    the rate; more running requests admit more at once, so a higher rate meets the TTFT objective."""
    workload, _ = simulated
    argv = simulate_argv(workload, *BASE, "--slo", "ttft=1s", "--search", "request_rate", "--sweep",
                         "max_running_requests=1,8", "--search-precision", "0.5", "--goodput", "0.9",
                         "--jobs", "1", "--cache-dir", str(tmp_path / "cache"))
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "the highest rate at which 90.0% of the requests meet ttft 1000 ms, to 0.5 requests/s" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["8"])}
    rates = [float(rows[n][1]) for n in ("1", "8")]
    assert 0 < rates[0] < rates[1] and all(r % 0.5 == 0 for r in rates)
    assert main(argv) == 0          # again: every probe from the cache, the same answer
    again = capsys.readouterr().out
    probes = next(line for line in again.splitlines() if " probes (" in line).split()
    assert probes[0] == probes[2].lstrip("(") and [float(line.split()[1]) for line in again.splitlines()
                                                    if line.split()[:1] in (["1"], ["8"])] == rates
    assert main(simulate_argv(workload, *BASE, "--search", "request_rate")) == 2
    assert "--search needs an objective" in capsys.readouterr().err


def test_replay_of_an_sglang_trace_refuses_fleet_flags_and_policy(capsys):
    """An SGLang trace runs one SGLang scheduler: a fleet flag is refused, as for a vLLM trace,
    rather than left unread."""
    for argv, message in [(["--replicas", "2"], "an SGLang trace runs one SGLang scheduler"),
                          (["--policy", "x:Y"], "--policy names a tracengine scheduling policy; an SGLang trace runs "
                                                "SGLang's scheduler (--set schedule_policy=lpm for SGLang's)")]:
        assert main(["replay", str(TRACES / "sglang.trace"), *argv]) == 2, argv
        assert capsys.readouterr().err.startswith(f"tracengine: error: {message}"), argv
