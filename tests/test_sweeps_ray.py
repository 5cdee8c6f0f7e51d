"""Sweeps on a real Ray cluster (local, two CPUs, started once for the module): a sweep on
Ray equals the local one row for row, whatever executor, worker or order ran each variant;
the capacity search's answer holds at its rate and fails one step above; a cached re-run
computes nothing; a timed-out variant says so. Ray is the 'ray' extra, which CI installs."""
import json

import pytest

ray = pytest.importorskip("ray", reason="Ray is the 'ray' extra: pip install -e \".[ray]\"")

from tests.helpers import SWEEP_MODEL, good_share, simulate_argv, sweep_of, table_of, write_mooncake
from tracengine.cli.main import main
from tracengine.sim.executors import LocalExecutor, RayExecutor, run_variants
from tracengine.sim.search import search_rates
from tracengine.sim.spec import PreparedSources, Variant
from tracengine.sim.sweep import parse_sweep


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture
def roofline(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SWEEP_MODEL))
    return str(path)


@pytest.fixture
def workload(tmp_path):
    return write_mooncake(tmp_path / "mooncake.jsonl")


def test_a_ray_sweep_equals_the_local_one_row_for_row_in_any_order(workload, roofline):
    spec, source, _ = sweep_of(workload, roofline)
    variants = [Variant(v) for v in parse_sweep(["max_num_seqs=1,4", "max_num_batched_tokens=256,2048"])]
    here = run_variants(spec, source, variants, LocalExecutor(1), PreparedSources()).rows
    forked = run_variants(spec, source, variants, LocalExecutor(2), PreparedSources()).rows
    with RayExecutor() as executor:
        assert not executor.started          # the module's cluster, kept
        on_ray = run_variants(spec, source, variants, executor, PreparedSources()).rows
        backwards = run_variants(spec, source, variants[::-1], executor, PreparedSources()).rows
    assert on_ray == forked == here
    assert backwards[::-1] == here
    assert len({row["ttft_p99_ms"] for row in here}) > 1       # the variants differ


def test_simulate_and_replay_sweeps_with_executor_ray_print_the_local_rows(workload, roofline, tmp_path, capsys):
    argv = simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,4,8", "--no-cache")
    assert main(argv) == 0
    local = capsys.readouterr().out
    assert main(argv + ["--executor", "ray"]) == 0
    on_ray = capsys.readouterr().out
    assert table_of(on_ray) == table_of(local)
    assert "3 variants in " in on_ray and " ray worker" in on_ray
    # a trace's what-ifs in simulated time, by --json's exact figures
    from tests.test_steptime import CONFIG, TRUTH, bursty_workload, write_trace
    from tracengine.sim.engine import run_timed
    from tracengine.sim.steptime import LinearStepTime
    trace = str(tmp_path / "run.trace")
    write_trace(trace, run_timed(CONFIG, bursty_workload(n=30), LinearStepTime(TRUTH, gap_ns=30_000)))
    replay = ["replay", trace, "--sweep", "num_kvcache_blocks=48,96", "--slo", "ttft=20ms", "--json", "--no-cache"]
    results = []
    for executor in ("local", "ray"):
        assert main(replay + ["--executor", executor]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["variants"] == results[1]["variants"]
    assert [r["executor"] for r in results] == ["local", "ray"]


def test_a_cached_rerun_on_ray_computes_nothing_new(tmp_path, capsys):
    from tests.test_steptime import CONFIG, TRUTH, bursty_workload, write_trace
    from tracengine.sim.engine import run_timed
    from tracengine.sim.steptime import LinearStepTime
    trace = str(tmp_path / "run.trace")
    write_trace(trace, run_timed(CONFIG, bursty_workload(n=30), LinearStepTime(TRUTH, gap_ns=30_000)))
    argv = ["replay", trace, "--arrivals", "steps", "--sweep", "num_kvcache_blocks=48,96", "--json",
            "--executor", "ray", "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["num_cached"], first["num_computed"]) == (0, 2)
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["num_cached"], again["num_computed"]) == (2, 0)
    assert again["variants"] == first["variants"]
    # on the local executor the cache is the same: the figures do not depend on where they ran
    assert main(argv[:-4] + ["--cache-dir", str(tmp_path / "cache")]) == 0
    local = json.loads(capsys.readouterr().out)
    assert (local["executor"], local["num_computed"]) == ("local", 0)


def test_a_timed_out_variant_on_ray_is_reported_as_such(workload, roofline, tmp_path, capsys):
    argv = simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,4", "--executor", "ray",
                         "--variant-timeout", "1e-6", "--cache-dir", str(tmp_path / "cache"))
    assert main(argv) == 0
    rows = [line for line in table_of(capsys.readouterr().out) if line.split()[:1] in (["1"], ["4"])]
    assert len(rows) == 2 and all(line.endswith("timed out (1e-06 s)") for line in rows)


def test_the_search_on_ray_meets_the_goodput_at_its_rate_and_fails_one_step_above(workload, roofline):
    spec, source, prepared = sweep_of(workload, roofline)
    configs = [{"max_num_seqs": 1}, {"max_num_seqs": 4}]
    precision = 1.0
    with RayExecutor() as executor:
        on_ray = search_rates(spec, source, configs, executor, prepared, 0.9, precision, 50.0)
    local = search_rates(spec, source, configs, LocalExecutor(1), PreparedSources(), 0.9, precision, 50.0)
    for result in on_ray.results:
        assert good_share(spec, source, prepared, result.overrides, result.rate) >= 0.9
        assert good_share(spec, source, prepared, result.overrides, result.rate + precision) < 0.9
    assert [(r.rate, r.row, r.probes) for r in on_ray.results] == [(r.rate, r.row, r.probes) for r in local.results]


def test_a_fleet_traces_sweep_on_ray_equals_the_local_one(tmp_path, capsys):
    from tests.test_fleet import CONFIG, fixed_step_time, step_time_file, with_writer, workload
    from tracengine.fleet.engine import simulate_fleet
    from tracengine.fleet.spec import FleetSpec
    trace = str(tmp_path / "fleet.trace")
    with_writer(trace, simulate_fleet(CONFIG, workload(), fixed_step_time(), FleetSpec(num_prefill_replicas=1,
                                                                                      num_decode_replicas=2)))
    argv = ["replay", trace, "--step-time", step_time_file(tmp_path), "--sweep", "decode_replicas=1,2", "--sweep",
            "decode.max_num_seqs=1,4", "--json", "--no-cache"]
    results = []
    for executor in ("local", "ray"):
        assert main(argv + ["--executor", executor]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["variants"] == results[1]["variants"] and len(results[0]["variants"]) == 4
    assert [r["executor"] for r in results] == ["local", "ray"]
