"""Sweeps on the local executor: the result cache, the per-variant timeout, the capacity
search and their flags (the same on Ray: tests/test_sweeps_ray.py)."""
import json
import subprocess
import sys

import pytest

from tests.helpers import SLOW_DEVICE, SWEEP_MODEL, good_share, simulate_argv, sweep_of, table_of, write_mooncake
from tracengine.cli.main import main
from tracengine.sim.executors import LocalExecutor
from tracengine.sim.search import search_rates
from tracengine.sim.spec import Variant

@pytest.fixture
def roofline(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SWEEP_MODEL))
    return str(path)


@pytest.fixture
def workload(tmp_path):
    return write_mooncake(tmp_path / "mooncake.jsonl")


def test_a_rerun_reads_the_cache_and_an_extended_sweep_computes_only_what_is_new(workload, roofline, tmp_path,
                                                                                   capsys):
    cache = ["--cache-dir", str(tmp_path / "cache")]
    argv = simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,4", *cache)
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "2 variants in " in first and "from the cache" not in first
    assert main(argv) == 0
    again = capsys.readouterr().out
    assert "2 variants in " in again and "(2 from the cache)" in again
    assert table_of(again) == table_of(first)
    assert main(simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,4,8", *cache)) == 0
    extended = capsys.readouterr().out
    assert "3 variants in " in extended and "(2 from the cache)" in extended
    assert table_of(extended)[:4] == table_of(first)[:4]
    # another objective is another spec: nothing of it is in the cache
    assert main(simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,4", "--slo", "e2e=1s", *cache)) == 0
    assert "from the cache" not in capsys.readouterr().out
    # --no-cache reads nothing and writes nothing
    assert main(simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,4", "--no-cache")) == 0
    assert "from the cache" not in capsys.readouterr().out


def test_a_damaged_cache_entry_is_run_again(workload, roofline, tmp_path, capsys):
    cache_dir = tmp_path / "cache"
    argv = simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,4", "--cache-dir", str(cache_dir))
    assert main(argv) == 0
    first = capsys.readouterr().out
    entries = sorted(cache_dir.rglob("*.json"))
    assert len(entries) == 2
    entries[0].write_text("{not json")
    assert main(argv) == 0
    again = capsys.readouterr().out
    assert "(1 from the cache)" in again and table_of(again) == table_of(first)
    assert json.loads(entries[0].read_text())["row"]     # written again, whole


def test_the_cache_key_holds_the_source_the_spec_and_the_code(workload, roofline, tmp_path):
    from tracengine.sim.cache import variant_key
    spec, source, _ = sweep_of(workload, roofline)
    key = variant_key(spec, Variant({"max_num_seqs": 4}))
    assert key == variant_key(spec, Variant({"max_num_seqs": 4}))
    other = write_mooncake(tmp_path / "other.jsonl", seed=1)
    spec_other, _, _ = sweep_of(other, roofline)
    assert variant_key(spec_other, Variant({"max_num_seqs": 4})) != key      # another workload's bytes
    assert variant_key(spec, Variant({"max_num_seqs": 8})) != key
    assert variant_key(spec, Variant({"max_num_seqs": 4}, 10.0)) != key      # a search's probe
    import dataclasses
    assert variant_key(dataclasses.replace(spec, slo={"ttft": 1.0}), Variant({"max_num_seqs": 4})) != key


def test_a_variant_past_its_timeout_is_reported_and_the_sweep_goes_on(workload, roofline, tmp_path, capsys):
    cache = ["--cache-dir", str(tmp_path / "cache")]
    # a microsecond: no simulation of 60 requests ends before its alarm
    assert main(simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,4", "--variant-timeout", "1e-6",
                              "--jobs", "2", *cache)) == 0
    out = capsys.readouterr().out
    rows = [line for line in table_of(out) if line.split()[:1] in (["1"], ["4"])]
    assert len(rows) == 2 and all(line.endswith("timed out (1e-06 s)") for line in rows), out
    # a timed-out row is no figure of the variant: nothing was stored, the next run computes both
    assert main(simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,4", *cache)) == 0
    out = capsys.readouterr().out
    assert "from the cache" not in out and "timed out" not in out


def test_the_search_meets_the_goodput_at_its_rate_and_fails_one_step_above(workload, roofline):
    spec, source, prepared = sweep_of(workload, roofline)
    prepared.runner(spec, source, None)
    configs = [{"max_num_seqs": 1}, {"max_num_seqs": 4}]
    precision = 1.0
    search = search_rates(spec, source, configs, LocalExecutor(2), prepared, 0.9, precision, 50.0)
    for result in search.results:
        assert result.rate is not None and result.next_rate == pytest.approx(result.rate + precision)
        assert good_share(spec, source, prepared, result.overrides, result.rate) >= 0.9
        assert good_share(spec, source, prepared, result.overrides, result.next_rate) < 0.9
        assert result.row["good_request_share"] >= 0.9 > result.next_row["good_request_share"]
    # one sequence at a time serves fewer requests a second than four
    assert search.results[0].rate < search.results[1].rate


def test_search_on_the_command_line_prints_each_configs_rate_and_plots(workload, roofline, tmp_path, capsys):
    png = tmp_path / "capacity.png"
    argv = simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,4", "--search", "request_rate",
                         "--goodput", "0.9", "--search-precision", "2", "--plot", str(png),
                         "--cache-dir", str(tmp_path / "cache"))
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "the highest rate at which 90.0% of the requests meet ttft 200 ms, tpot 20 ms, to 2 requests/s" in out
    header = next(line for line in out.splitlines() if line.startswith("max_num_seqs"))
    assert header.split()[:3] == ["max_num_seqs", "max", "req/s"]
    rates = [float(line.split()[1].replace(",", "")) for line in out.splitlines() if line.split()[:1] in (["1"], ["4"])]
    assert len(rates) == 2 and rates[0] < rates[1] and all(r % 2 == 0 for r in rates)
    assert png.stat().st_size > 0 and f"wrote {png}" in out
    # run again, every probe is in the cache and the answer is the same
    assert main(argv[:-4] + ["--cache-dir", str(tmp_path / "cache")]) == 0
    again = capsys.readouterr().out
    probes = next(line for line in again.splitlines() if " probes (" in line).split()
    assert probes[0] == probes[2].lstrip("(")           # "N probes (N from the cache)"
    assert [line for line in again.splitlines() if line.split()[:1] in (["1"], ["4"])] == \
        [line for line in out.splitlines() if line.split()[:1] in (["1"], ["4"])]


def test_a_synthetic_workload_is_searched_at_its_own_rate(roofline, capsys):
    argv = ["simulate", "--num-prompts", "30", "--input-len", "64:256", "--output-len", "8:32", "--roofline",
            roofline, *SLOW_DEVICE, "--set", "num_kvcache_blocks=400", "--set", "max_num_batched_tokens=256",
            "--slo", "ttft=5ms", "--search", "request_rate",
            "--goodput", "0.9", "--search-precision", "5", "--no-cache"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if "max req/s" in line)
    rate = float(out[header + 1].split()[0].replace(",", ""))
    assert rate > 0 and rate % 5 == 0


def test_sweep_and_search_flags_are_checked(workload, roofline, tmp_path, capsys):
    for extra, message in [
        (["--executor", "ray"], "go with --sweep"),
        (["--no-cache"], "go with --sweep"),
        (["--sweep", "max_num_seqs=1,2", "--ray-address", "auto"], "--ray-address goes with --executor ray"),
        (["--sweep", "max_num_seqs=1,2", "--no-cache", "--cache-dir", str(tmp_path)], "one of --cache-dir"),
        (["--sweep", "max_num_seqs=1,2", "--executor", "ray", "--ray-address", "auto", "--jobs", "2"],
         "has its own CPUs"),
        (["--sweep", "max_num_seqs=1,2", "--variant-timeout", "0"], "--variant-timeout must be a positive"),
        (["--search", "request_rate", "--goodput", "1.5"], "--goodput is a share"),
        (["--sweep", "max_num_seqs=1,2", "--goodput", "0.9"], "go with --search"),
        (["--search", "request_rate", "--search-precision", "0"], "--search-precision must be a positive"),
        (["--search", "request_rate", "--record", str(tmp_path / "x.trace")], "a --search makes many"),
        (["--search", "request_rate", "--plot", str(tmp_path / "p.png"), "--plot-figure", "goodput"],
         "no --plot-figure"),
    ]:
        assert main(simulate_argv(workload, roofline, *extra)) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("tracengine: error:") and message in err and err.count("\n") == 1, (extra, err)
    argv = ["simulate", workload, "--roofline", roofline, "--hardware", "H100", "--set", "num_kvcache_blocks=400",
            "--search", "request_rate"]
    assert main(argv) == 2
    assert "--search needs an objective" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(simulate_argv(workload, roofline, "--sweep", "max_num_seqs=1,2", "--cache-dir",
                              str(tmp_path / "file"))) == 2
    assert "not a directory" in capsys.readouterr().err


def test_a_local_sweep_imports_no_ray(workload, roofline, tmp_path):
    code = ("import sys; from tracengine.cli.main import main; "
            f"rc = main({simulate_argv(workload, roofline, '--sweep', 'max_num_seqs=1,4', '--no-cache')!r}); "
            "assert rc == 0, rc; assert 'ray' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_a_schedulers_makers_are_named_by_path_and_resolve_to_its_record():
    """A worker makes a variant from its maker's `module:RECORD.method` path, so each record's
    label is its own name in its module, and the path resolves to the record's method."""
    from tracengine.engine.user_classes import resolve
    from tracengine.replay import scheduler_backends
    for record in (scheduler_backends.VLLM, scheduler_backends.SGLANG):
        assert getattr(scheduler_backends, record.label) is record
        for maker, method in ((record.TIMED, "timed_runner"), (record.STEPS, "step_runner"),
                              (record.SIMULATE, "simulate_runner")):
            assert resolve(maker) == getattr(record, method)
        for path in (record.timed, record.steps, record.simulation, record.check_version, record.reexecute):
            assert callable(resolve(path))
