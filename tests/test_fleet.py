"""A fleet in simulated time (docs/cluster.md): replicas of the real scheduler behind a
router, disaggregated prefill and decode; its trace replays, reads per replica and diffs."""
import dataclasses
import json
import random

import msgspec
import pytest

from tracengine.fleet.stats import fleet_stats, replica_streams
from tracengine.cli.main import main
from tracengine.engine.config import Config
from tracengine.fleet.replay import reexecute_fleet
from tracengine.sim.engine import simulate
from tracengine.fleet.engine import simulate_fleet
from tracengine.fleet.spec import FleetSpec
from tracengine.fleet.routers import BUILTIN_ROUTERS
from tracengine.engine.request import Request
from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime
from tracengine.trace.events import (BlockAllocate, KVTransfer, ReplicaScope, RequestAdded, RouteDecision,
                                     ScheduleDecision, StepEnd)
from tracengine.trace.tracelog import TraceReader
from user_routers import LastReplica, RoundRobinButSeven

BLOCK = 4


def fixed_step_time(prefill_ns=2_000_000, decode_ns=1_000_000, gap_ns=0) -> LinearStepTime:
    """Every prefill step `prefill_ns`, every decode step `decode_ns`, whatever its shape."""
    def part(ns):
        return {p: [ns if p == "model_ns" else 0] + [0] * (len(FEATURES) - 1) for p in PARTS}
    return LinearStepTime({"prefill": part(prefill_ns), "decode": part(decode_ns)}, gap_ns)


def workload(n=30, seed=0) -> list[Request]:
    """Conversations that share prefixes, arriving every 0.7 ms."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(24)] for _ in range(3)]
    return [Request(prefixes[i % 3][:rng.randrange(4, 24)] + [rng.randrange(1000) for _ in range(rng.randrange(3, 30))],
                    rng.randrange(2, 12), i * 700_000, ignore_eos=True, seq_id=i)
            for i in range(n)]


CONFIG = Config(num_kvcache_blocks=48, kvcache_block_size=BLOCK, max_num_batched_tokens=48, max_num_seqs=6,
                max_model_len=80)


@pytest.mark.parametrize("router", sorted(BUILTIN_ROUTERS) + ["user_routers:LastReplica"])
def test_one_replica_with_any_router_is_todays_simulation_event_for_event(router):
    step_time = fixed_step_time()
    alone = simulate(CONFIG, workload(), step_time)
    fleet = simulate_fleet(CONFIG, workload(), step_time, FleetSpec(1, router))
    assert fleet[0].fleet == {} and msgspec.structs.replace(fleet[0], created_at=0) == \
        msgspec.structs.replace(alone[0], created_at=0)
    assert fleet[1:] == alone[1:]
    assert not any(type(e) in (ReplicaScope, RouteDecision) for e in fleet)


@pytest.mark.parametrize("spec", [FleetSpec(3, "prefix_aware"), FleetSpec(4, "random", router_seed=3),
                                  FleetSpec(2, "least_loaded"),
                                  FleetSpec(num_prefill_replicas=2, num_decode_replicas=2, router="round_robin",
                                            decode_router="least_loaded", kv_bytes_per_token=64,
                                            kv_transfer_gbps=1, kv_transfer_latency_ns=300_000)],
                         ids=["prefix_aware", "random", "least_loaded", "disaggregated"])
def test_a_fleet_trace_replays_exactly_from_its_file(tmp_path, spec, capsys):
    events = simulate_fleet(CONFIG, workload(), fixed_step_time(), spec)
    assert reexecute_fleet(events).ok
    path = tmp_path / "fleet.trace"
    with_writer(path, events)
    assert main(["replay", str(path)]) == 0
    assert "reproduced exactly" in capsys.readouterr().out
    assert main(["check", str(path)]) == 0


def with_writer(path, events):
    from tracengine.trace.tracelog import TraceWriter
    with TraceWriter(path, events[0]) as writer:
        for e in events[1:]:
            writer.emit(e)


def test_every_request_is_routed_once_and_served_on_its_replica():
    events = simulate_fleet(CONFIG, workload(), fixed_step_time(), FleetSpec(3, "round_robin"))
    routes = [e for e in events if type(e) is RouteDecision]
    assert [r.seq_id for r in routes] == list(range(30))
    assert [r.replica for r in routes] == [i % 3 for i in range(30)]     # in turn
    assert routes[1].scores == [2.0, 0.0, 1.0]       # replica 1 is next: 0 turns away; 0 is 2 away
    _, streams = replica_streams(events)
    for r in range(3):
        added = [e.seq_id for e in streams[r] if type(e) is RequestAdded]
        assert added == [i for i in range(30) if i % 3 == r]
        steps = [e.step for e in streams[r] if type(e) is StepEnd]
        assert steps == list(range(len(steps)))     # each replica counts its own steps


def test_prefix_aware_sends_a_shared_prefix_to_the_replica_that_caches_it():
    step_time = fixed_step_time()
    prefix = list(range(100, 124))     # 6 blocks
    requests = [Request(prefix + [i, i + 1, i + 2], 4, i * 50_000_000, ignore_eos=True, seq_id=i)
                for i in range(4)]
    events = simulate_fleet(CONFIG, requests, step_time, FleetSpec(3, "prefix_aware", load_weight=0.0))
    routes = [e for e in events if type(e) is RouteDecision]
    assert len({r.replica for r in routes}) == 1     # all where the first one left its prefix
    # the second request: 7 blocks, 6 cached on the chosen replica -> 1 to prefill, 7 elsewhere
    assert sorted(routes[1].scores) == [1.0, 7.0, 7.0]
    s = fleet_stats(events)
    assert s["requests_per_replica"].count(4) == 1 and s["request_imbalance"] == 3.0


def test_a_planted_routing_change_is_found_at_its_request():
    events = simulate_fleet(CONFIG, workload(), fixed_step_time(), FleetSpec(3, "round_robin"))
    result = reexecute_fleet(events, routers={"all": RoundRobinButSeven})
    d = result.divergence
    assert d is not None and d.seq_id == 7 and d.replica is None
    assert type(d.expected) is RouteDecision and d.expected.replica == 1 and d.actual.replica == 2
    # a trace whose decision was changed after the fact: the same request
    planted = [msgspec.structs.replace(e, replica=0) if type(e) is RouteDecision and e.seq_id == 5 else e
               for e in events]
    d = reexecute_fleet(planted).divergence
    assert d.seq_id == 5 and d.reason == "the replay emitted a different event"


def test_a_scheduling_change_on_one_replica_is_found_there():
    events = simulate_fleet(CONFIG, workload(), fixed_step_time(), FleetSpec(2, "round_robin"))
    d = reexecute_fleet(events, policy="mixed").divergence
    assert d is not None and d.seq_id is None and d.replica in (0, 1)
    assert type(d.expected) is ScheduleDecision


@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
def test_a_zero_cost_transfer_lands_the_prompt_as_computed_on_the_decode_side(policy):
    spec = FleetSpec(num_prefill_replicas=1, num_decode_replicas=2, router="round_robin")
    requests = workload(12)
    events = simulate_fleet(CONFIG.replace(scheduling_policy=policy), requests, fixed_step_time(), spec)
    transfers = {e.seq_id: e for e in events if type(e) is KVTransfer}
    assert set(transfers) == set(range(12)) and all(t.duration_ns == 0 for t in transfers.values())
    _, streams = replica_streams(events)
    for r in (1, 2):
        added = {e.seq_id: e for e in streams[r] if type(e) is RequestAdded}
        for seq_id, e in added.items():
            prompt = requests[seq_id].prompt
            assert e.prompt_token_ids[:-1] == prompt and e.max_tokens == requests[seq_id].max_tokens - 1
            allocate = next(a for a in streams[r] if type(a) is BlockAllocate and a.seq_id == seq_id)
            assert allocate.num_cached_blocks == len(prompt) // BLOCK        # every full block of the prompt
            first = next(d for d in streams[r] if type(d) is ScheduleDecision
                         and any(s.seq_id == seq_id for s in d.seqs))
            computed = next(s.num_tokens for s in first.seqs if s.seq_id == seq_id)
            assert computed == 1 and (seq_id, len(prompt)) in [(s.seq_id, s.num_cached_tokens) for s in first.seqs]
            # (the whole prompt computed: the full blocks cached, the partial block's tokens transferred)
    # TTFT is the prefill side's: its first token, and the fleet counts every token once
    s = fleet_stats(events)
    prefill = {r["seq_id"]: r for r in s["replicas"][0]["stats"]["per_request"]}
    for r in s["per_request"]:
        assert r["ttft_s"] == prefill[r["seq_id"]]["ttft_s"]
        assert r["num_completion_tokens"] == requests[r["seq_id"]].max_tokens


def test_a_transfer_takes_latency_plus_bytes_over_bandwidth():
    spec = FleetSpec(num_prefill_replicas=1, num_decode_replicas=1, kv_bytes_per_token=1000,
                     kv_transfer_gbps=2.0, kv_transfer_latency_ns=100_000)
    requests = workload(3)
    events = simulate_fleet(CONFIG, requests, fixed_step_time(), spec)
    s = fleet_stats(events)
    decode = {r["seq_id"]: r for r in s["replicas"][1]["stats"]["per_request"]}
    prefill = {r["seq_id"]: r for r in s["replicas"][0]["stats"]["per_request"]}
    for e in (e for e in events if type(e) is KVTransfer):
        n = len(requests[e.seq_id].prompt)
        assert e.num_bytes == n * 1000 and e.duration_ns == 100_000 + n * 1000 // 2   # 2 GB/s: 2 bytes a ns
        # it lands on the decode side when the prefill's step ends plus the transfer
        landed_s = prefill[e.seq_id]["arrival_s"] + prefill[e.seq_id]["ttft_s"] + e.duration_ns / 1e9
        assert decode[e.seq_id]["arrival_s"] == pytest.approx(landed_s)


def test_fleet_stats_count_each_replica_and_the_fleet(tmp_path, capsys):
    events = simulate_fleet(CONFIG, workload(), fixed_step_time(), FleetSpec(3, "least_loaded"))
    path = tmp_path / "f.trace"
    with_writer(path, events)
    assert main(["stats", str(path), "--json", "--slo", "ttft=3ms"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert sum(s["requests_per_replica"]) == 30 == s["requests"]["num_finished"]
    assert [p["replica"] for p in s["replicas"]] == [0, 1, 2]
    assert s["goodput"]["num_good_requests"] <= 30 and s["latency"]["ttft"]["count"] == 30
    # the fleet's duration is its last replica's end, its TTFT the replicas' pooled
    assert s["duration_s"] == max(p["stats"]["steps"]["total_s"] for p in s["replicas"])
    pooled = sorted(r["ttft_s"] for p in s["replicas"] for r in p["stats"]["per_request"])
    assert s["latency"]["ttft"]["p50"] == pytest.approx(pooled[14] / 2 + pooled[15] / 2)
    assert main(["stats", str(path)]) == 0 and "3 replicas, router least_loaded" in capsys.readouterr().out


@pytest.mark.parametrize("spec", [FleetSpec(3, "least_loaded"), FleetSpec(num_prefill_replicas=1,
                                                                     num_decode_replicas=2)])
def test_a_fleet_folded_live_keeps_no_steps_and_gives_the_figures_of_its_trace(spec):
    """simulate folds a fleet's run as it goes, lean (what stats reads: no steps, no token steps):
    its figures are those of the whole trace folded afterwards."""
    from tracengine.fleet.engine import fleet_header
    from tracengine.fleet.stats import FleetTimelines
    config, step_time = CONFIG, fixed_step_time()
    header = fleet_header(config, step_time, spec)
    live = FleetTimelines(header, lean=True)
    # with no writer behind, it takes kept tokens without their events, and no block-level events
    assert live.replica_sink(0).token_kept is not None and not live.block_events
    simulate_fleet(config, workload(), step_time, spec, live, header)
    assert all(t.lean and not t.steps and not any(r.token_steps for r in t.requests.values())
               for t in live.timelines.values())
    events = simulate_fleet(config, workload(), step_time, spec)
    assert fleet_stats(live) == fleet_stats(events)


def test_a_fleet_folded_live_gives_each_replica_its_timelines_own_sink_unless_a_writer_is_behind():
    """With nothing behind the live fold, a replica's events go straight into its timeline (no
    ReplicaScope needed to say whose they are); with a writer, through the fleet's sink, in order."""
    from tracengine.fleet.engine import fleet_header
    from tracengine.fleet.stats import FleetTimelines
    from tracengine.trace.sinks import ListSink
    header = fleet_header(CONFIG, fixed_step_time(), FleetSpec(2, "round_robin"))
    live = FleetTimelines(header, lean=True)
    sink = live.replica_sink(1)
    assert sink.enabled and not sink.block_events and not sink.decode_seqs
    assert sink.token_kept == live.timelines[1].token_kept
    sink.emit(RequestAdded(0, 7, [1, 2, 3], 4, 0.0, True))
    assert list(live.timelines[1].requests) == [7] and not live.timelines[0].requests
    written = FleetTimelines(header, ListSink(), lean=True)
    assert written.replica_sink(1) is written


def test_a_fleets_replicas_ask_who_leaves_only_where_a_client_does():
    from tracengine.fleet.engine import Fleet
    from tracengine.sim.engine import SimulatedEngine
    from tracengine.sim.runners import SyntheticRunner
    step_time = fixed_step_time()
    fleet = Fleet(CONFIG, FleetSpec(2, "round_robin"),
                  lambda i, c: SimulatedEngine(c, SyntheticRunner(), step_time), step_time=step_time)
    requests = workload()
    fleet.set_departures(requests)
    assert all(r.leaving is None for r in fleet.replicas)
    fleet.set_departures([dataclasses.replace(requests[0], seq_id=0, abort_ns=5)])
    assert [r.leaving(10) for r in fleet.replicas] == [[], []]     # routed nowhere yet: held by none


@pytest.fixture
def mooncake(tmp_path):
    rng = random.Random(2)
    path = tmp_path / "mc.jsonl"
    lines = []
    for i in range(24):     # a conversation's turns grow its prompt: one 512-token block, its own
        conv, turn = i % 4, i // 4 + 1
        lines.append(json.dumps({"timestamp": 20 * i, "input_length": 16 * (turn + 1) - rng.randrange(8),
                                 "output_length": rng.randrange(2, 10), "hash_ids": [100 * conv]}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def step_time_file(tmp_path) -> str:
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps(fixed_step_time().to_dict()))
    return str(path)


def test_simulate_a_fleet_from_the_command_line(tmp_path, mooncake, capsys):
    st = step_time_file(tmp_path)
    common = ["simulate", mooncake, "--step-time", st, "--set", "num_kvcache_blocks=200",
              "--set", "kvcache_block_size=16", "--quiet"]
    a, b = str(tmp_path / "a.trace"), str(tmp_path / "b.trace")
    assert main(common + ["--replicas", "2", "--router", "round_robin", "--record", a]) == 0
    out = capsys.readouterr().out
    assert "2 replicas, router round_robin: 24 requests (24 finished)" in out
    assert main(common + ["--replicas", "2", "--router", "user_routers:LastReplica", "--record", b]) == 0
    with TraceReader(b) as reader:
        assert reader.header.fleet["router"] == "user_routers:LastReplica"
        assert {e.replica for e in reader.events() if type(e) is RouteDecision} == {1}
    capsys.readouterr()
    assert main(["diff", a, b]) == 1
    out = capsys.readouterr().out
    assert "first routing difference, decision #0: a s0 to replica 0" in out and "b s0 to replica 1" in out
    assert main(["diff", a, a]) == 0
    capsys.readouterr()
    assert main(["render", a, "--steps", "0:1"]) == 0       # each replica's step table
    out = capsys.readouterr().out
    assert out.count("# replica ") == 2 and out.index("# replica 0") < out.index("# replica 1")
    # a router of one's own is replayed only when given
    assert main(["replay", b]) == 2
    assert "router 'user_routers:LastReplica', which is not built in" in capsys.readouterr().err
    assert main(["replay", b, "--router", "user_routers:LastReplica"]) == 0
    capsys.readouterr()
    assert main(["replay", a, "--router", "user_routers:LastReplica", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)["divergence"]
    assert d["seq_id"] == 0 and d["expected"]["replica"] == 0 and d["actual"]["replica"] == 1


@pytest.mark.parametrize("flags, message", [
    (["--replicas", "0"], "--replicas must be positive"),
    (["--router", "nowhere"], "router 'nowhere'"),
    (["--router", "user_routers:Nothing"], "cannot load router"),
    (["--router", "user_policies:ShortestFirst"], "is not a tracengine.fleet.routers.Router subclass"),
    (["--prefill-replicas", "2"], "both positive"),
    (["--replicas", "2", "--prefill-replicas", "1", "--decode-replicas", "1"], "not both"),
    (["--decode-router", "random"], "goes with --prefill-replicas"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-transfer-gbps", "5"], "--kv-bytes-per-token"),
])
def test_bad_fleet_flags_are_one_line_errors(tmp_path, mooncake, capsys, flags, message):
    assert main(["simulate", mooncake, "--step-time", step_time_file(tmp_path), "--set", "num_kvcache_blocks=200",
                 "--quiet"] + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: ") and message in err and err.count("\n") == 1


def test_export_gives_each_replica_its_processes_and_each_transfer_a_flow(tmp_path, capsys):
    spec = FleetSpec(num_prefill_replicas=1, num_decode_replicas=2, kv_bytes_per_token=100, kv_transfer_gbps=1.0)
    events = simulate_fleet(CONFIG, workload(8), fixed_step_time(), spec)
    path, out = tmp_path / "pd.trace", tmp_path / "pd.json"
    with_writer(path, events)
    assert main(["export", str(path), "--perfetto", str(out)]) == 0
    doc = json.loads(out.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in doc if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "router", 1: "replica 0", 2: "replica 0 requests", 3: "replica 1", 4: "replica 1 requests",
                     5: "replica 2", 6: "replica 2 requests"}
    starts = {e["id"]: e for e in doc if e["ph"] == "s"}
    ends = {e["id"]: e for e in doc if e["ph"] == "f"}
    assert len(starts) == len(ends) == 8 and set(starts) == set(ends)
    for i, s in starts.items():
        f = ends[i]
        assert s["pid"] == 2 and f["pid"] in (4, 6) and s["tid"] == f["tid"]   # prefill requests -> decode's
        # the transfer's duration, floored to whole microseconds at each end
        assert f["ts"] - s["ts"] in (s["args"]["duration_ns"] // 1000, s["args"]["duration_ns"] // 1000 + 1)
    assert sum(1 for e in doc if e["ph"] == "i" and e["pid"] == 0) == 16    # 8 requests, routed twice each


@pytest.fixture
def fleet_view(tmp_path):
    from tracengine.tui.fleet_app import FleetView
    spec = FleetSpec(num_prefill_replicas=1, num_decode_replicas=2, kv_bytes_per_token=100, kv_transfer_gbps=1.0)
    path = tmp_path / "pd.trace"
    with_writer(path, simulate_fleet(CONFIG, workload(8), fixed_step_time(), spec))
    view = FleetView(path)
    yield view
    view.close()


async def test_the_tui_shows_one_replica_and_switches_with_a_key(fleet_view):
    from tracengine.tui.fleet_app import FleetTraceApp
    index = fleet_view.index(1)
    app = FleetTraceApp(index, fleet_view, 1, step=3, seq_id=2)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.step == 3 and "replica 1 of 3 (decode)" in app.note
        assert {s.seq_id for s in app.view.state.seqs.values()} <= {e for e in range(8)}
        await pilot.press("r")
        await pilot.pause()
    index.close()
    replica, step, seq_id = app.switch_to
    assert replica == 2 and seq_id == 2
    # the step of replica 2 running when replica 1's step 3 began
    assert fleet_view.starts[2][step] <= fleet_view.starts[1][3]


async def test_the_tui_shows_the_fleet_and_the_routing_of_the_selected_request(fleet_view):
    from tracengine.tui.fleet_app import FleetTraceApp, TextScreen
    index = fleet_view.index(0)
    app = FleetTraceApp(index, fleet_view, 0, seq_id=5)
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.press("w")
        await pilot.pause()
        assert isinstance(app.screen, TextScreen)
        text = str(app.screen.renderable)
        assert "prefill pool" in text and "decode pool" in text and "KV transfer from replica 0" in text
        await pilot.press("escape")
        await pilot.press("F")
        await pilot.pause()
        assert isinstance(app.screen, TextScreen) and app.screen.title_text.endswith("the fleet")
    index.close()


def test_the_tui_refuses_to_follow_a_fleet_trace(tmp_path, capsys):
    path = tmp_path / "f.trace"
    with_writer(path, simulate_fleet(CONFIG, workload(4), fixed_step_time(), FleetSpec(2)))
    assert main(["tui", str(path), "--follow"]) == 2
    assert "--follow follows one engine's" in capsys.readouterr().err


@pytest.mark.parametrize("spec", [FleetSpec(3, "prefix_aware"),
                                  FleetSpec(num_prefill_replicas=1, num_decode_replicas=2, kv_bytes_per_token=64,
                                            kv_transfer_gbps=1, kv_transfer_latency_ns=200_000)],
                         ids=["aggregated", "disaggregated"])
def test_a_fleet_whatif_of_no_change_is_the_recorded_run_again(spec):
    from tracengine.fleet.whatif import fleet_whatif
    events = simulate_fleet(CONFIG, workload(), fixed_step_time(), spec)
    result = fleet_whatif(events, spec, {}, fixed_step_time())
    assert result.changes == [] and result.events[1:] == events[1:]
    assert result.new["latency"] == result.recorded["latency"]


def test_a_fleet_whatif_changes_replicas_router_and_config_from_the_command_line(tmp_path, capsys):
    st = step_time_file(tmp_path)
    path, out = tmp_path / "f.trace", str(tmp_path / "w.trace")
    with_writer(path, simulate_fleet(CONFIG, workload(), fixed_step_time(), FleetSpec(2, "round_robin")))
    assert main(["replay", str(path), "--step-time", st, "--replicas", "3", "--router", "least_loaded",
                 "--set", "max_num_seqs=2", "--record", out]) == 0
    text = capsys.readouterr().out
    assert "max_num_seqs 6 -> 2" in text and "fleet num_replicas 2 -> 3" in text
    assert "fleet router round_robin -> least_loaded" in text and "TTFT p99 ms" in text
    with TraceReader(out) as reader:
        assert reader.header.fleet["num_replicas"] == 3 and reader.header.config["max_num_seqs"] == 2
    assert main(["replay", out]) == 0        # the what-if's trace re-executes
    # one engine's trace through a fleet: its workload, at its arrival times
    alone = tmp_path / "one.trace"
    with_writer(alone, simulate(CONFIG, workload(), fixed_step_time()))
    capsys.readouterr()
    assert main(["replay", str(alone), "--step-time", st, "--prefill-replicas", "1", "--decode-replicas", "1",
                 "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["what_if"]["num_replicas"] == 2 and j["what_if"]["kv_transfer"]["num_transfers"] == 30
    assert j["recorded"]["requests"] == j["what_if"]["requests"] == {"num_requests": 30, "num_finished": 30,
                                                                      "num_aborted": 0}
    # and back: a disaggregated trace through an aggregated fleet (its decode router goes with its pool)
    pd = tmp_path / "pd.trace"
    with_writer(pd, simulate_fleet(CONFIG, workload(), fixed_step_time(), FleetSpec(
        num_prefill_replicas=1, num_decode_replicas=2, decode_router="least_loaded")))
    assert main(["replay", str(pd), "--step-time", st, "--replicas", "2", "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["what_if"]["num_replicas"] == 2 and j["what_if"]["kv_transfer"]["num_transfers"] == 0
    assert j["recorded"]["kv_transfer"]["num_transfers"] == 30


def test_a_sweep_of_a_fleet_gives_each_variant_the_fleets_figures(tmp_path, mooncake, capsys):
    from tracengine.fleet.sweep import fleet_row_of
    from tracengine.sim.steptime import load_step_time
    from tracengine.workload import read_workload
    from tracengine.sim.engine import simulate_config
    from tracengine.fleet.sweep import FleetVariant
    st = step_time_file(tmp_path)
    assert main(["simulate", mooncake, "--step-time", st, "--set", "num_kvcache_blocks=200", "--quiet",
                 "--replicas", "2", "--router", "least_loaded", "--sweep", "max_num_seqs=1,4", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "a fleet of 2 replicas" in out and "2 variants in" in out
    # a row is the fleet's figures of that run made alone
    requests = read_workload(mooncake, vocab_size=151_936, time_scale=20)   # arrivals 1 ms apart
    variant = FleetVariant(requests, {"num_kvcache_blocks": 200}, load_step_time(st), FleetSpec(2, "least_loaded"))
    config = simulate_config({"num_kvcache_blocks": 200, "max_num_seqs": 4}, requests)
    alone = fleet_stats(simulate_fleet(config, requests, load_step_time(st), FleetSpec(2, "least_loaded")))
    assert variant({"max_num_seqs": 4}) == fleet_row_of(alone)
    assert variant({"max_num_seqs": 1})["e2e_p99_ms"] > fleet_row_of(alone)["e2e_p99_ms"]   # one decode a step
