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
    assert events[0].model.dtype == "bfloat16"     # the config's torch_dtype, whose bytes the roofline counts
    from tracengine.tui.widgets.header import describe_trace
    assert "(simulated, bfloat16) on simulated (roofline)" in describe_trace("sim.trace", events[0])
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


def test_a_roofline_names_its_dtype_in_the_trace_and_in_its_json(tmp_path, roofline, capsys):
    """The header's dtype is the config's (float32 here: 4 bytes a weight); a roofline saved as
    JSON keeps it, and one saved before it had a name gives its size."""
    from tracengine.sim.roofline import ModelShape, RooflineStepTime
    config = tmp_path / "f32.json"
    config.write_text(json.dumps(dict(TINY, torch_dtype="float32")))
    out = str(tmp_path / "f32.trace")
    assert main(["simulate", str(DATA / "mooncake_sample.jsonl"), "--roofline", str(config), "--hardware", "h100",
                 "--quiet", "--set", "num_kvcache_blocks=400", "--record", out]) == 0
    with TraceReader(out) as reader:
        assert reader.header.model.dtype == "float32"
    capsys.readouterr()
    assert main(["stats", out]) == 0 and "4 requests" in capsys.readouterr().out
    roof = RooflineStepTime.for_hardware(ModelShape.from_file(str(config)), "H100")
    again = RooflineStepTime.from_dict(json.loads(json.dumps(roof.to_dict())))
    assert again.model.dtype == "float32" and again.model.dtype_bytes == 4
    old = roof.to_dict()
    del old["model"]["dtype"]
    older = RooflineStepTime.from_dict(old)
    assert older.source["dtype"] == "4-byte"


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


def test_hardware_presets_are_named_in_any_case(roofline, capsys):
    sample = str(DATA / "mooncake_sample.jsonl")
    outs = []
    for name in ("H200", "h200"):
        assert main(["simulate", sample, "--roofline", roofline, "--hardware", name, "--quiet",
                     "--set", "num_kvcache_blocks=400"]) == 0
        outs.append(capsys.readouterr().out)
    assert "on H200 (989.5 TFLOP/s, 4.8 TB/s" in outs[1]
    assert [line for line in outs[0].splitlines() if " s wall" not in line] == \
        [line for line in outs[1].splitlines() if " s wall" not in line]
    assert main(["simulate", sample, "--roofline", roofline, "--hardware", "h300", "--set", "num_kvcache_blocks=400"]) == 2
    err = capsys.readouterr().err
    assert err == "tracengine: error: unknown hardware 'h300'; presets: H200, H100, H100-PCIe, A100\n"


def test_simulate_imports_no_torch(tmp_path, roofline):
    code = ("import sys; from tracengine.cli.main import main; "
            f"rc = main(['simulate', {str(DATA / 'mooncake_sample.jsonl')!r}, '--roofline', {roofline!r}, "
            "'--hardware', 'H200', '--set', 'num_kvcache_blocks=400']); "
            "assert rc == 0, rc; assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_sweep_rows_equal_the_single_runs(tmp_path, roofline):
    from tracengine.sim.roofline import ModelShape, RooflineStepTime
    from tracengine.sim.engine import simulate, simulate_config
    from tracengine.sim.executors import LocalExecutor, run_variants
    from tracengine.sim.spec import SIMULATE, PreparedSources, SweepSpec, Variant, workload_source
    from tracengine.sim.sweep import parse_sweep, row_of
    from tracengine.workload import read_workload
    from tracengine.workload.sources import WorkloadSpec
    requests = read_workload(str(DATA / "mooncake_sample.jsonl"), vocab_size=1000, length_scale=0.1)
    # the sweep reads the file itself, as a worker that was sent its bytes reads them
    source = workload_source(WorkloadSpec(workload=str(DATA / "mooncake_sample.jsonl"), length_scale=0.1), 1000)
    step_time = RooflineStepTime.for_hardware(ModelShape.from_file(roofline), "H100")
    variants = parse_sweep(["num_kvcache_blocks=30,60", "max_num_seqs=1,4"])
    assert variants == [{"num_kvcache_blocks": 30, "max_num_seqs": 1}, {"num_kvcache_blocks": 30, "max_num_seqs": 4},
                        {"num_kvcache_blocks": 60, "max_num_seqs": 1}, {"num_kvcache_blocks": 60, "max_num_seqs": 4}]
    slo = {"ttft": 0.01}
    base = {"kvcache_block_size": 4}
    spec = SweepSpec(SIMULATE, source.digest, base, step_time.to_dict(), slo)
    rows = run_variants(spec, source, [Variant(v) for v in variants], LocalExecutor(2), PreparedSources()).rows
    alone = [row_of(stats(simulate(simulate_config({**base, **v}, requests), requests, step_time), slo))
             for v in variants]
    assert rows == alone
    assert len({r["ttft_p99_ms"] for r in rows}) > 1     # the variants differ


def test_a_sweeps_plot_draws_the_figure_against_the_first_swept_value(tmp_path, roofline, monkeypatch):
    """--plot: the figure against the first swept value, one line per value of the others,
    through the rows' own figures; and the command writes the image it names."""
    pytest.importorskip("matplotlib")     # the 'plot' extra; the dev install has it
    from matplotlib.figure import Figure
    from tracengine.sim.sweep import plot_rows
    drawn, savefig = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), savefig(fig, *a, **k))[1])
    variants = [{"num_kvcache_blocks": b, "max_num_seqs": n} for b in (30, 60) for n in (1, 4)]
    rows = [{"ttft_p99_ms": y} for y in (10.0, 20.0, 30.0, None)]     # None: a run with no such figure
    plot_rows(str(tmp_path / "p.svg"), variants, rows, "ttft_p99_ms")
    ax = drawn[0].axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("num_kvcache_blocks", "TTFT p99 (ms)")
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert lines == {"max_num_seqs=1": ([30, 60], [10.0, 30.0]), "max_num_seqs=4": ([30], [20.0])}
    png = tmp_path / "p.png"
    assert main(["simulate", str(DATA / "mooncake_sample.jsonl"), "--roofline", roofline, "--hardware", "H100",
                 "--set", "num_kvcache_blocks=400", "--sweep", "max_num_seqs=1,2", "--plot", str(png),
                 "--quiet"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn[1].axes[0].get_ylabel() == "TTFT p99 (ms)"      # the default figure


def test_sweep_on_replay_in_time_and_in_steps(tmp_path, capsys):
    from tests.test_steptime import CONFIG, TRUTH, bursty_workload, write_trace
    from tracengine.sim.engine import run_timed
    from tracengine.sim.steptime import LinearStepTime
    from tracengine.sim.sweep import row_of
    from tracengine.replay.timed import TimedReplay
    trace = str(tmp_path / "run.trace")
    events = run_timed(CONFIG, bursty_workload(n=30), LinearStepTime(TRUTH, gap_ns=30_000))
    write_trace(trace, events)
    assert main(["replay", trace, "--sweep", "num_kvcache_blocks=48,96", "--slo", "ttft=20ms", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "in simulated time" in out and "goodput/s" in out
    single = TimedReplay(events)
    expected = row_of(stats(single.run(single.config({"num_kvcache_blocks": 48}))[0], {"ttft": 0.02}))
    line = next(line for line in out.splitlines() if line.split()[:1] == ["48"])
    assert line.split()[1] == f"{expected['throughput']:,.1f}"
    assert main(["replay", trace, "--sweep", "num_kvcache_blocks=48,96", "--arrivals", "steps"]) == 0
    assert "recorded arrival steps" in capsys.readouterr().out


def test_a_step_exact_sweep_gives_its_figures_in_steps(tmp_path, capsys):
    """A step-exact what-if has no time of its own (its durations are the replayer's wall clock),
    so its sweep's rows, table, JSON and plot are in steps, as `stats` counts them, the same
    on every run; goodput objectives (times) and a figure in ms are refused."""
    from tests.test_steptime import CONFIG, TRUTH, bursty_workload, write_trace
    from tracengine.sim.engine import run_timed
    from tracengine.sim.steptime import LinearStepTime
    from tracengine.replay.whatif import whatif
    trace = str(tmp_path / "run.trace")
    events = run_timed(CONFIG, bursty_workload(n=30), LinearStepTime(TRUTH, gap_ns=30_000))
    write_trace(trace, events)
    argv = ["replay", trace, "--arrivals", "steps", "--sweep", "num_kvcache_blocks=48,96", "--jobs", "1"]
    tables = []
    for _ in range(2):
        assert main(argv) == 0
        tables.append([line for line in capsys.readouterr().out.splitlines() if " variants in " not in line])
    assert tables[0] == tables[1]
    header = tables[0][1].split()
    assert header[:3] == ["num_kvcache_blocks", "tok/step", "TTFT"] and "tok/s" not in header
    assert header.count("steps") == 6
    assert main(argv + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["arrivals"] == "steps"
    for variant in got["variants"]:
        s = stats(whatif(events, variant["set"]).events)
        figures = variant["figures"]
        assert figures["tokens_per_step"] == s["tokens"]["num_completion_tokens"] / s["steps"]["num_steps"]
        for name in ("ttft", "tpot", "e2e"):
            assert figures[f"{name}_p50_steps"] == s["latency"][name]["steps"]["p50"]
            assert figures[f"{name}_p99_steps"] == s["latency"][name]["steps"]["p99"]
        assert figures["preemptions"] == s["preemption"]["num_preemptions"]
        assert not any(key.endswith("_ms") or key in ("throughput", "goodput") for key in figures)
    line = next(line for line in tables[0] if line.split()[:1] == ["48"]).split()
    assert line[1] == f"{got['variants'][0]['figures']['tokens_per_step']:,.2f}"
    assert line[3] == f"{got['variants'][0]['figures']['ttft_p99_steps']:,.1f}"
    for extra, message in [(["--slo", "ttft=1s"], "a step-exact sweep"),
                           (["--plot", str(tmp_path / "p.png"), "--plot-figure", "ttft_p99_ms"], "ttft_p99_steps")]:
        assert main(argv + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("tracengine: error:") and message in err and err.count("\n") == 1, err


def test_sweep_errors(tmp_path, roofline, capsys, monkeypatch):
    sample = str(DATA / "mooncake_sample.jsonl")
    base = ["simulate", sample, "--roofline", roofline, "--hardware", "H100", "--set", "num_kvcache_blocks=400"]
    for extra, message in [(["--sweep", "num_kvcache_blocks"], "NAME=V1,V2"),
                           (["--sweep", "bogus=1,2"], "unknown config field"),
                           (["--sweep", "max_num_seqs=1", "--sweep", "max_num_seqs=2"], "twice"),
                           (["--sweep", "max_num_seqs=1,2", "--record", str(tmp_path / "x.trace")], "many"),
                           (["--plot", str(tmp_path / "p.png")], "with --sweep"),
                           (["--sweep", "max_num_seqs=1,2", "--plot-figure", "bogus"], "--plot-figure")]:
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("tracengine: error:") and message in err and err.count("\n") == 1, (extra, err)
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # the optional extra, absent
    assert main(base + ["--sweep", "max_num_seqs=1,2", "--plot", str(tmp_path / "p.png")]) == 2
    assert "needs matplotlib" in capsys.readouterr().err


def test_synthetic_runner_tokens_hash_seed_seq_and_position():
    """Each token is xxh64 of "{seed}:{seq_id}:{position}" modulo the vocabulary (eos stepped over),
    whatever the batch; `eos_at` puts eos at a completion index."""
    import xxhash
    from tracengine.engine.sequence import Sequence
    from tracengine.sim.runners import SyntheticRunner
    seqs = []
    for seq_id, (num_tokens, num_cached, num_scheduled) in enumerate([(10, 9, 1), (30, 0, 30), (30, 0, 12), (5, 4, 1)]):
        seq = Sequence(seq_id, list(range(num_tokens)), 4)
        seq.num_cached_tokens, seq.num_scheduled_tokens = num_cached, num_scheduled
        seqs.append(seq)
    runner = SyntheticRunner(vocab_size=50, seed=7, eos=3)
    expected = [xxhash.xxh64_intdigest(f"7:{s.seq_id}:{s.num_cached_tokens + s.num_scheduled_tokens}".encode()) % 50
                for s in seqs]
    expected = [t if t != 3 else 4 for t in expected]
    assert runner.run(seqs, False) == expected
    assert [runner.run([s], False)[0] for s in reversed(seqs)] == expected[::-1]   # batching changes nothing
    seqs[3].num_completion_tokens = 2
    eos_runner = SyntheticRunner(vocab_size=50, seed=7, eos=3, eos_at={3: 2, 2: 0})
    # seq 3 is at its completion index 2; seq 2 computes a middle chunk, which samples no eos
    assert eos_runner.run(seqs, False) == expected[:3] + [3]


def test_progress_counts_finished_requests_and_simulated_time(roofline):
    """run_timed reports every PROGRESS_EVERY steps and at the end: finished requests never
    fall and end at all of them, the simulated time ends at the trace's own end; without a
    callback the events are the same."""
    from tracengine.engine.config import Config
    from tracengine.sim import engine as simulation
    from tracengine.sim.clock import PROGRESS_EVERY
    from tracengine.sim.roofline import ModelShape, RooflineStepTime
    from tracengine.engine.request import Request
    from tracengine.trace.views import without_wall_clock
    requests = [Request(list(range(i, i + 40)), 30 + i, arrival_step=0, ignore_eos=True, seq_id=i, arrival_ns=i * 2_000_000)
                for i in range(40)]
    config = Config(num_kvcache_blocks=64, kvcache_block_size=16, max_num_seqs=4, max_model_len=256)
    step_time = RooflineStepTime.for_hardware(ModelShape.from_hf_config(TINY, "tiny"), "H100")
    calls = []
    events = simulation.run_timed(config, requests, step_time, on_progress=lambda *call: calls.append(call))
    num_steps = sum(type(e).__name__ == "StepEnd" for e in events)
    assert num_steps > PROGRESS_EVERY     # more than one report before the last
    assert len(calls) == num_steps // PROGRESS_EVERY + 1
    finished = [n for n, _ in calls]
    assert finished == sorted(finished) and finished[-1] == len(requests) and finished[0] < len(requests)
    assert calls[-1][1] == int(round(stats(events)["steps"]["total_s"] * 1e9))
    plain = simulation.run_timed(config, requests, step_time)
    assert list(map(without_wall_clock, plain[1:])) == list(map(without_wall_clock, events[1:]))


def test_simulate_shows_progress_on_stderr_unless_quiet(tmp_path, roofline, capsys):
    argv = ["simulate", str(DATA / "mooncake_sample.jsonl"), "--roofline", roofline, "--hardware", "H100",
            "--set", "num_kvcache_blocks=400"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "Simulating" in captured.err and "4/4" in captured.err and "Simulating" not in captured.out
    assert main(argv + ["--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "simulated 4 requests" in captured.out


def test_simulated_arrivals_later_than_the_machine_clock_enter(monkeypatch):
    """A request arriving later in simulated time than the machine's clock reads (its time
    since boot) is let in at its simulated arrival, not held for a real time to come."""
    from tracengine.engine import llm_engine
    from tracengine.engine.config import Config
    from tracengine.engine.request import Request
    from tracengine.sim.engine import run_timed
    from tracengine.sim.steptime import LinearStepTime
    from tracengine.trace.events import RequestAdded
    from tests.test_steptime import TRUTH
    monkeypatch.setattr(llm_engine, "perf_counter_ns", lambda: 10**9)     # a machine up for one second
    hour = 3600 * 10**9
    requests = [Request([1, 2, 3, 4, 5], 3, ignore_eos=True, arrival_ns=t) for t in (0, hour, 2 * hour)]
    config = Config(num_kvcache_blocks=16, kvcache_block_size=4, eos=999)
    events = run_timed(config, requests, LinearStepTime(TRUTH))
    assert [e.arrival_ns for e in events if type(e) is RequestAdded] == [0, hour, 2 * hour]
    assert stats(events)["requests"]["num_finished"] == 3


def test_flags_that_one_would_silently_win_over_or_that_do_nothing_are_refused(tmp_path, roofline, capsys):
    """A value given twice, a field both --set and swept, an objective twice, and the sweep's
    flags on a replay without --sweep (where nothing read them) are one-line errors."""
    from tests.test_steptime import CONFIG, TRUTH, bursty_workload, write_trace
    from tracengine.sim.engine import run_timed
    from tracengine.sim.steptime import LinearStepTime
    trace = str(tmp_path / "run.trace")
    write_trace(trace, run_timed(CONFIG, bursty_workload(n=12), LinearStepTime(TRUTH, gap_ns=30_000)))
    sample = str(DATA / "mooncake_sample.jsonl")
    simulate = ["simulate", sample, "--roofline", roofline, "--hardware", "H100", "--set", "num_kvcache_blocks=400"]
    for argv, message in [
        (simulate + ["--sweep", "max_num_seqs=1,2,1"], "the value 1 twice"),
        (simulate + ["--sweep", "num_kvcache_blocks=400,800"], "--set and --sweep both name num_kvcache_blocks"),
        (["replay", trace, "--set", "block_size=8", "--sweep", "kvcache_block_size=4,16"],
         "both name kvcache_block_size"),
        (simulate + ["--sweep", "max_num_seqs=1,2", "--slo", "ttft=1s", "--slo", "TTFT=2s"], "--slo names ttft twice"),
        (["stats", trace, "--slo", "e2e=1s", "--slo", "e2e=2s"], "--slo names e2e twice"),
        (["replay", trace, "--set", "num_kvcache_blocks=48", "--slo", "ttft=20ms"], "go with --sweep"),
        (["replay", trace, "--plot", str(tmp_path / "p.png")], "go with --sweep"),
        (["replay", trace, "--arrivals", "steps", "--set", "num_kvcache_blocks=48", "--jobs", "2"], "go with --sweep"),
        (["replay", trace, "--state", "2", "--sweep", "num_kvcache_blocks=48,96"], "--state"),
        (simulate + ["--sweep", "max_num_seqs=1,2", "--plot-figure", "ttft_p50_ms"], "--plot-figure goes with --plot"),
        (simulate + ["--plot-figure", "ttft_p50_ms"], "--plot-figure goes with --plot"),
        (["replay", trace, "--sweep", "num_kvcache_blocks=48,96", "--plot-figure", "e2e_p50_ms"],
         "--plot-figure goes with --plot"),
        (["replay", trace, "--set", "num_kvcache_blocks=48", "--plot-figure", "e2e_p50_ms"], "--plot-figure goes with"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("tracengine: error:") and message in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "p.png").exists()


def test_the_workload_file_is_never_the_record_and_is_given_once(tmp_path, roofline, capsys):
    workload = tmp_path / "w.jsonl"
    workload.write_bytes((DATA / "mooncake_sample.jsonl").read_bytes())
    base = ["simulate", "--roofline", roofline, "--hardware", "H100", "--set", "num_kvcache_blocks=400"]
    for argv, message in [(["--workload", str(workload), "--record", str(workload), "--force"],
                           "is the workload file it reads"),
                          ([str(workload), "--workload", str(DATA / "azure_sample.csv")], "once")]:
        assert main(base + argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("tracengine: error:") and message in err and err.count("\n") == 1, (argv, err)
    assert workload.read_bytes() == (DATA / "mooncake_sample.jsonl").read_bytes()
    assert main(base + ["--workload", str(workload), "--quiet"]) == 0
    assert "simulated 4 requests" in capsys.readouterr().out


def test_no_output_overwrites_a_step_time_model_or_config_it_reads(tmp_path, roofline, capsys):
    """--record and --plot are checked against every input (the model and config too), even
    with --force; a --plot whose extension is not an image format is said before the runs."""
    from tracengine.sim.steptime import LinearStepTime, save
    from tests.test_steptime import TRUTH
    model = str(tmp_path / "st.json")
    save(LinearStepTime(TRUTH), model)
    kept = {path: Path(path).read_bytes() for path in (model, roofline)}
    sample = str(DATA / "mooncake_sample.jsonl")
    sweep = ["--sweep", "max_num_seqs=1,2", "--force"]
    for argv, message in [
        ([sample, "--step-time", model, "--set", "num_kvcache_blocks=400", "--record", model, "--force"],
         "is the step-time model it reads"),
        ([sample, "--roofline", roofline, "--hardware", "H100", "--set", "num_kvcache_blocks=400",
          "--record", roofline, "--force"], "is the model config it reads"),
        ([sample, "--roofline", str(Path(roofline).parent), "--hardware", "H100", "--set", "num_kvcache_blocks=400",
          *sweep, "--plot", roofline], "is the model config it reads"),
        ([sample, "--step-time", model, "--set", "num_kvcache_blocks=400", *sweep, "--plot", str(tmp_path / "p")],
         "name the image format by the extension"),
    ]:
        assert main(["simulate", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("tracengine: error:") and message in err and err.count("\n") == 1, (argv, err)
    assert {path: Path(path).read_bytes() for path in kept} == kept
    assert not (tmp_path / "p").exists() and not (tmp_path / "p.png").exists()


def test_vocab_size_and_a_cache_too_large_for_memory_are_one_line_errors(roofline, capsys, monkeypatch):
    base = ["simulate", "--num-prompts", "3", "--roofline", roofline, "--hardware", "H100",
            "--set", "num_kvcache_blocks=400", "--quiet"]
    for size in ("0", "-2"):     # 0 was taken as "not given", -2 a traceback from the token draw
        assert main(base + ["--vocab-size", size]) == 2
        assert capsys.readouterr().err == f"tracengine: error: --vocab-size must be positive, got {size}\n"

    def too_large(*args, **kwargs):     # what a list of 10**10 block ref counts raises
        raise MemoryError
    import tracengine.sim.engine
    monkeypatch.setattr(tracengine.sim.engine, "simulate_config", too_large)
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: out of memory") and err.count("\n") == 1


def test_an_impossible_variant_of_a_simulate_sweep_is_refused_before_any_run(roofline, capsys, monkeypatch):
    from tracengine.sim import sweep
    ran = []
    run = sweep.SimulateVariant.__call__
    monkeypatch.setattr(sweep.SimulateVariant, "__call__", lambda self, v: ran.append(v) or run(self, v))
    assert main(["simulate", str(DATA / "mooncake_sample.jsonl"), "--roofline", roofline, "--hardware", "H100",
                 "--sweep", "num_kvcache_blocks=400,2", "--jobs", "1", "--quiet"]) == 2
    assert "can never run" in capsys.readouterr().err and ran == []


def test_a_simulated_time_past_the_traces_integers_is_a_one_line_error(tmp_path, capsys):
    """A model whose loop gap is 10**30 ns: the run's times outgrow the trace's 64-bit fields;
    the recording stops with one line and ends at the last step it could write, saying why."""
    from tracengine.sim.steptime import LinearStepTime, save
    from tests.test_steptime import TRUTH
    model, out = str(tmp_path / "st.json"), str(tmp_path / "sim.trace")
    save(LinearStepTime(TRUTH, gap_ns=10**30), model)
    assert main(["simulate", "--num-prompts", "3", "--step-time", model, "--set", "num_kvcache_blocks=100",
                 "--quiet", "--record", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error:") and "64-bit" in err and err.count("\n") == 1
    assert main(["check", out]) == 4      # closed, saying the run failed (tests/test_run_end.py)


def test_a_sweep_of_a_trace_of_ones_own_policy_runs_it_under_replay_policy(tmp_path, capsys):
    """--policy reaches every variant, in simulated time and at the recorded steps; a swept
    scheduling_policy wins over it. Each row is the single what-if's."""
    from tests.test_steptime import CONFIG, TRUTH, bursty_workload, write_trace
    from tracengine.sim.engine import run_timed
    from tracengine.replay.timed import TimedReplay
    from tracengine.sim.steptime import LinearStepTime
    from tracengine.sim.sweep import row_of
    from user_policies import ShortestFirst
    trace = str(tmp_path / "own.trace")
    events = run_timed(CONFIG, bursty_workload(n=24), LinearStepTime(TRUTH, gap_ns=30_000), policy=ShortestFirst)
    write_trace(trace, events)
    policy = ["--policy", "user_policies:ShortestFirst", "--jobs", "1"]
    assert main(["replay", trace, "--sweep", "num_kvcache_blocks=48,96", *policy]) == 0
    out = capsys.readouterr().out
    timed = TimedReplay(events)
    alone = row_of(stats(timed.run(timed.config({"num_kvcache_blocks": 48}), ShortestFirst)[0]))
    assert next(line for line in out.splitlines() if line.split()[:1] == ["48"]).split()[3] == \
        f"{alone['ttft_p99_ms']:,.2f}"
    assert main(["replay", trace, "--arrivals", "steps", "--sweep", "num_kvcache_blocks=48,96", *policy]) == 0
    assert main(["replay", trace, "--sweep", "scheduling_policy=mixed,prefill_first", *policy]) == 0
    assert "mixed" in capsys.readouterr().out


def test_an_impossible_variant_of_a_step_exact_sweep_is_refused_before_any_run(tmp_path, capsys, monkeypatch):
    from tests.test_steptime import CONFIG, TRUTH, bursty_workload, write_trace
    from tracengine.replay import timed as sweep
    from tracengine.sim.engine import run_timed
    from tracengine.sim.steptime import LinearStepTime
    trace = str(tmp_path / "run.trace")
    write_trace(trace, run_timed(CONFIG, bursty_workload(n=12), LinearStepTime(TRUTH, gap_ns=30_000)))
    ran = []
    run = sweep.StepVariant.__call__
    monkeypatch.setattr(sweep.StepVariant, "__call__", lambda self, v: ran.append(v) or run(self, v))
    assert main(["replay", trace, "--arrivals", "steps", "--sweep", "num_kvcache_blocks=96,2", "--jobs", "1"]) == 2
    assert "can never run" in capsys.readouterr().err and ran == []


def test_a_run_leaves_nothing_for_the_collector(tmp_path):
    """The engine, scheduler, block manager and event sinks make no reference cycle: with the
    collector off, as a simulation runs, a run's pool of blocks and its live fold go when it
    ends, not at the collector's next pass (which would walk 100,000-slot lists and every step)."""
    import gc
    from tracengine.analysis.timeline import RequestTimeline
    from tracengine.analysis.timeline_sink import RequestTimelineSink
    from tracengine.engine.block_manager import BlockManager
    from tracengine.engine.config import Config
    from tracengine.engine.llm_engine import LLMEngine
    from tracengine.engine.sampling_params import SamplingParams
    from tracengine.sim.runners import SyntheticRunner, run_workload
    from tracengine.engine.request import Request
    from tracengine.sim.engine import run_timed
    from tracengine.sim.steptime import LinearStepTime
    from tracengine.trace.tracelog import TraceWriter, make_header
    from tests.test_steptime import TRUTH

    def alive(kind):
        return [o for o in gc.get_objects() if type(o) is kind]

    config = Config(num_kvcache_blocks=12, kvcache_block_size=4, max_num_batched_tokens=16, eos=999)
    requests = [Request(list(range(i, i + 9)), 6, ignore_eos=True, arrival_ns=i * 1000) for i in range(5)]
    collecting = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        assert not alive(BlockManager) and not alive(RequestTimeline)
        with TraceWriter(tmp_path / "sim.trace", make_header(config), deflate=False) as writer:
            sink = RequestTimelineSink(make_header(config), writer)
            run_timed(config, requests, LinearStepTime(TRUTH), sink=sink)
        assert sink.timeline.num_steps and not alive(BlockManager)
        assert stats(tmp_path / "sim.trace")["preemption"]["num_preemptions"] > 0     # the pool ran out
        del sink
        assert not alive(RequestTimeline)
        run_workload(config, requests, SyntheticRunner(eos=999))
        engine = LLMEngine(config, SyntheticRunner(eos=999))
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=4))
        engine.step()
        assert engine.scheduler.block_manager.blocks[0].ref_count == 1    # the views still read the pool
        del engine
        assert not alive(BlockManager)
    finally:
        if collecting:
            gc.enable()
