"""A fleet's what-ifs swept, and fleets whose pools or replicas differ in config
(fleet/overrides.py, docs/cluster.md): `replay FLEET.trace --sweep ...` over fleet fields,
every replica's config fields and a pool's or a replica's; `--set decode.max_num_seqs=...`,
`--set replica[2].num_kvcache_blocks=...`."""
import dataclasses
import json

import pytest

from tracengine.fleet.stats import fleet_stats, replica_streams
from tracengine.cli.main import main
from tracengine.engine.config import Config
from tracengine.fleet.replay import reexecute_fleet
from tracengine.fleet.whatif import fleet_whatif
from tracengine.sim.engine import simulate
from tracengine.fleet.engine import simulate_fleet
from tracengine.fleet.spec import FleetSpec
from tracengine.fleet.overrides import replica_configs
from tracengine.fleet.sweep import fleet_row_of
from tracengine.trace.events import ScheduleDecision, StepEnd
from tracengine.trace.tracelog import TraceReader
from test_fleet import CONFIG, fixed_step_time, step_time_file, with_writer, workload

PD = FleetSpec(num_prefill_replicas=1, num_decode_replicas=2, kv_bytes_per_token=64, kv_transfer_gbps=1)


@pytest.fixture
def fleet_trace(tmp_path):
    path = tmp_path / "fleet.trace"
    with_writer(path, simulate_fleet(CONFIG, workload(), fixed_step_time(), FleetSpec(2, "round_robin")))
    return str(path)


@pytest.fixture
def pd_trace(tmp_path):
    path = tmp_path / "pd.trace"
    with_writer(path, simulate_fleet(CONFIG, workload(), fixed_step_time(), PD))
    return str(path)


def events_of(path) -> list:
    with TraceReader(path) as reader:
        return list(reader.events())


def test_a_sweep_of_a_fleet_trace_gives_each_variant_its_what_ifs_figures(tmp_path, fleet_trace, capsys):
    st = step_time_file(tmp_path)
    assert main(["replay", fleet_trace, "--step-time", st, "--sweep", "replicas=2,3", "--sweep",
                 "router=round_robin,prefix_aware", "--set", "max_num_seqs=4", "--slo", "ttft=5ms", "--json",
                 "--jobs", "1", "--no-cache"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [v["set"] for v in out["variants"]] == [{"replicas": n, "router": r} for n in (2, 3)
                                                   for r in ("round_robin", "prefix_aware")]
    assert out["fleet"]["num_replicas"] == 2 and out["overrides"] == {"max_num_seqs": 4}
    events = events_of(fleet_trace)
    for variant in out["variants"]:
        v = variant["set"]
        alone = fleet_whatif(events, FleetSpec(v["replicas"], v["router"]), {"max_num_seqs": 4}, fixed_step_time())
        assert variant["figures"] == fleet_row_of(fleet_stats(alone.events, {"ttft": 0.005}))
    assert len({v["figures"]["ttft_p99_ms"] for v in out["variants"]}) > 1      # the variants differ
    # the table, as one engine's sweep prints it
    assert main(["replay", fleet_trace, "--step-time", st, "--sweep", "prefix_weight=0.5,2", "--router",
                 "prefix_aware", "--jobs", "1", "--no-cache"]) == 0
    text = capsys.readouterr().out
    assert "through a fleet in simulated time (from the recorded one: 2 replicas, router round_robin)" in text
    assert "prefix_weight" in text and "2 variants in" in text


def test_a_sweep_of_a_pools_and_a_replicas_fields_on_a_pd_trace(tmp_path, pd_trace, capsys):
    st = step_time_file(tmp_path)
    assert main(["replay", pd_trace, "--step-time", st, "--sweep", "decode.max_num_seqs=1,4", "--sweep",
                 "replica[0].max_num_batched_tokens=16,48", "--set", "max_model_len=80", "--json", "--jobs", "2", "--no-cache"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["variants"]) == 4
    events = events_of(pd_trace)
    for variant in out["variants"]:
        v = variant["set"]
        spec = dataclasses.replace(PD, replica_config=dict(v))
        alone = fleet_whatif(events, spec, {"max_model_len": 80}, fixed_step_time())
        assert variant["figures"] == fleet_row_of(fleet_stats(alone.events))
    rows = {(v["set"]["decode.max_num_seqs"], v["set"]["replica[0].max_num_batched_tokens"]): v["figures"]
            for v in out["variants"]}
    assert rows[(1, 48)]["tpot_p99_ms"] > rows[(4, 48)]["tpot_p99_ms"]     # one decode a step on each replica


def test_one_engines_trace_swept_through_fleets(tmp_path, capsys):
    alone = tmp_path / "one.trace"
    with_writer(alone, simulate(CONFIG, workload(), fixed_step_time()))
    assert main(["replay", str(alone), "--step-time", step_time_file(tmp_path), "--sweep", "replicas=1,3",
                 "--json", "--jobs", "1", "--no-cache"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fleet"]["num_replicas"] == 1 and [v["set"] for v in out["variants"]] == [{"replicas": 1},
                                                                                          {"replicas": 3}]
    one, three = (v["figures"] for v in out["variants"])
    assert three["ttft_p99_ms"] < one["ttft_p99_ms"]


@pytest.mark.parametrize("flags, message", [
    (["--sweep", "replicas=0,2"], "--replicas must be positive"),
    (["--sweep", "replica[2].max_num_seqs=1,2"], "replica[2].max_num_seqs: the fleet has replicas 0..1"),
    (["--sweep", "decode.max_num_seqs=1,2"], "has no decode pool"),
    (["--sweep", "router=round_robin,nowhere"], "router 'nowhere'"),
    (["--sweep", "replicas=x,2"], "replicas expects an int"),
    (["--sweep", "router=round_robin,random", "--router", "random"], "--router and --sweep both name router"),
    (["--sweep", "prefill_replicas=1,2"], "both positive"),       # and no decode pool to go with it
])
def test_a_bad_fleet_sweep_is_refused_before_any_run(tmp_path, fleet_trace, capsys, flags, message):
    argv = ["replay", fleet_trace, "--step-time", step_time_file(tmp_path), "--jobs", "1", "--no-cache"]
    assert main(argv + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: ") and message in err and err.count("\n") == 1


def test_simulate_sweeps_fleet_fields_too(tmp_path, capsys):
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 5 * i, "input_length": 40 + i, "output_length": 6,
                                        "hash_ids": [i % 3]}) + "\n" for i in range(24)))
    assert main(["simulate", str(path), "--step-time", step_time_file(tmp_path), "--set", "num_kvcache_blocks=200",
                 "--quiet", "--sweep", "replicas=1,2", "--sweep", "router=round_robin,least_loaded", "--jobs", "1",
                 "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "4 variants in" in out and "least_loaded" in out


# -- a pool's or a replica's own config --------------------------------------------------------


def test_the_most_specific_field_wins_a_replica_then_its_pool_then_every_replica():
    spec = FleetSpec(num_prefill_replicas=1, num_decode_replicas=2,
                     replica_config={"decode.max_num_seqs": 2, "replica[2].max_num_seqs": 1,
                                     "prefill.num_kvcache_blocks": 40})
    configs = replica_configs(CONFIG, spec)
    assert [c.max_num_seqs for c in configs] == [6, 2, 1]
    assert [c.num_kvcache_blocks for c in configs] == [40, 48, 48]
    assert FleetSpec.from_dict(spec.to_dict()) == spec      # flat in a header, and back


def test_a_heterogeneous_fleet_runs_each_replica_under_its_config_and_replays(tmp_path, fleet_trace, capsys):
    out = str(tmp_path / "het.trace")
    assert main(["replay", fleet_trace, "--step-time", step_time_file(tmp_path), "--set",
                 "replica[1].num_kvcache_blocks=24", "--set", "replica[0].scheduling_policy=mixed", "--record",
                 out]) == 0
    text = capsys.readouterr().out
    assert "fleet replica[1].num_kvcache_blocks - -> 24" in text
    events = events_of(out)
    assert events[0].fleet["replica[1].num_kvcache_blocks"] == 24 and events[0].config["num_kvcache_blocks"] == 48
    _, streams = replica_streams(events)
    assert Config.from_dict(streams[1][0].config).num_kvcache_blocks == 24
    assert max(e.num_free_blocks for e in streams[1] if type(e) is StepEnd) <= 24
    assert max(e.num_free_blocks for e in streams[0] if type(e) is StepEnd) > 24
    phases = {r: {e.phase for e in streams[r] if type(e) is ScheduleDecision} for r in (0, 1)}
    assert "mixed" in phases[0] and "mixed" not in phases[1]
    assert reexecute_fleet(events).ok
    assert main(["replay", out]) == 0 and main(["check", out]) == 0
    capsys.readouterr()
    assert main(["stats", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"]["num_finished"] == 30
    from tracengine.tui.fleet_app import FleetView
    view = FleetView(out)
    try:
        from tracengine.tui.fleet_app import FleetTraceApp
        index = view.index(1)
        assert index.num_blocks == 24 and index.num_steps == sum(1 for e in streams[1] if type(e) is StepEnd)
        assert FleetTraceApp(index, view, 1).replica_note.startswith("replica 1 of 2 (all, num_kvcache_blocks=24)")
        index.close()
    finally:
        view.close()


def test_a_pd_fleets_decode_pool_of_its_own_config_from_simulate(tmp_path, capsys):
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 0, "input_length": 40 + i, "output_length": 8,
                                        "hash_ids": [i % 3]}) + "\n" for i in range(20)))
    out = str(tmp_path / "pd.trace")
    assert main(["simulate", str(path), "--step-time", step_time_file(tmp_path), "--set", "num_kvcache_blocks=200",
                 "--quiet", "--prefill-replicas", "1", "--decode-replicas", "2", "--set", "decode.max_num_seqs=1",
                 "--record", out]) == 0
    events = events_of(out)
    _, streams = replica_streams(events)
    assert max(len(e.seqs) for e in streams[1] + streams[2] if type(e) is ScheduleDecision) == 1
    assert max(len(e.seqs) for e in streams[0] if type(e) is ScheduleDecision) > 1
    capsys.readouterr()
    assert main(["replay", out]) == 0 and main(["check", out]) == 0


@pytest.mark.parametrize("sets, message", [
    (["replica[2].max_num_seqs=2"], "replica[2].max_num_seqs: the fleet has replicas 0..1"),
    (["prefill.max_num_seqs=2"], "has no prefill pool"),
    (["replica[0].kvcache_block_size=8"], "kvcache_block_size is one for the whole fleet"),
    (["replica[0].no_such_field=8"], "unknown config field 'no_such_field'"),
    (["replica[-1].max_num_seqs=2"], "a pool's or a replica's field is prefill.FIELD"),
    (["replica[0].max_num_seqs=two"], "max_num_seqs expects an int"),
])
def test_a_bad_replica_field_is_a_one_line_error(tmp_path, fleet_trace, capsys, sets, message):
    argv = ["replay", fleet_trace, "--step-time", step_time_file(tmp_path)]
    assert main(argv + [a for s in sets for a in ("--set", s)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: ") and message in err and err.count("\n") == 1


def test_a_reshaped_what_if_drops_the_recorded_fields_of_replicas_it_no_longer_has(tmp_path, capsys):
    spec = FleetSpec(3, "round_robin", replica_config={"replica[2].max_num_seqs": 1, "replica[0].max_num_seqs": 2})
    path = tmp_path / "three.trace"
    with_writer(path, simulate_fleet(CONFIG, workload(), fixed_step_time(), spec))
    assert main(["replay", str(path), "--step-time", step_time_file(tmp_path), "--replicas", "2", "--json"]) == 0
    changes = {c["name"]: (c["old"], c["new"]) for c in json.loads(capsys.readouterr().out)["changes"]}
    assert changes["fleet replica[2].max_num_seqs"] == (1, None) and "fleet replica[0].max_num_seqs" not in changes
