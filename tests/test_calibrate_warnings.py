"""`calibrate` says when its fit is not to be trusted: a recording whose steps of one shape took
very different times (another process on the CPU) fits poorly, and a simulated trace's times
came from a step-time model, not hardware. One line each on stderr; the what-if that uses such
a fit says the first too."""
import random

import msgspec
import pytest

from test_steptime import CONFIG, TRUTH, bursty_workload
from tracengine.cli.main import main
from tracengine.sim.engine import run_timed, simulation_header
from tracengine.sim.steptime import LinearStepTime, calibrate
from tracengine.trace.events import StepEnd
from tracengine.trace.tracelog import write_trace


@pytest.fixture(scope="module")
def quiet():
    return run_timed(CONFIG, bursty_workload(n=40), LinearStepTime(TRUTH, gap_ns=30_000))


def under_load(events, seed=0):
    """The same run with a busy CPU: one step in three took 3 to 12 times its time."""
    rng = random.Random(seed)
    return [msgspec.structs.replace(e, model_ns=round(e.model_ns * rng.uniform(3, 12)))
            if type(e) is StepEnd and rng.random() < 1 / 3 else e for e in events]


def warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("tracengine: warning: ")]


def test_a_recording_under_load_fits_poorly_and_calibrate_says_why(tmp_path, quiet, capsys):
    loaded = under_load(quiet)
    assert calibrate(loaded).error["all_steps"]["total"]["median_rel"] > 0.5
    write_trace(tmp_path / "loaded.trace", loaded)
    write_trace(tmp_path / "quiet.trace", quiet)
    assert main(["calibrate", str(tmp_path / "quiet.trace")]) == 0
    assert warnings(capsys.readouterr().err) == []
    assert main(["calibrate", str(tmp_path / "loaded.trace"), "-o", str(tmp_path / "st.json")]) == 0
    [warning] = warnings(capsys.readouterr().err)
    assert "fits loaded.trace poorly: median error" in warning and "another process on the CPU" in warning
    # the what-if that calibrates on the trace, and a run with the saved model, say it again
    assert main(["replay", str(tmp_path / "loaded.trace"), "--set", "max_num_seqs=4"]) == 0
    assert warnings(capsys.readouterr().err) == [warning]
    assert main(["simulate", "--num-prompts", "4", "--step-time", str(tmp_path / "st.json"),
                 "--set", "num_kvcache_blocks=100", "--quiet"]) == 0
    assert warnings(capsys.readouterr().err) == [warning]


def test_calibrating_on_a_simulated_trace_is_warned(tmp_path, quiet, capsys):
    step_time = LinearStepTime(TRUTH, gap_ns=30_000)
    simulated = run_timed(CONFIG, bursty_workload(n=40), step_time, header=simulation_header(CONFIG, step_time))
    assert simulated[0].device == "simulated (linear)"       # what `simulate` writes
    write_trace(tmp_path / "sim.trace", simulated)
    assert main(["calibrate", str(tmp_path / "sim.trace")]) == 0
    [warning] = warnings(capsys.readouterr().err)
    assert warning.startswith("tracengine: warning: sim.trace is a simulated trace (device simulated (linear))")
