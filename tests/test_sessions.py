"""Sessions (workload/sessions.py, docs/workloads.md): a later turn is sent its think time after
the turns of its session it depends on finished, after the session's history; the simulator,
the what-ifs (in simulated time and in steps), fleets and generate release turns by that one
rule, so a slower server makes later turns arrive later."""
import json
from pathlib import Path

import pytest

from tracengine.analysis.stats import stats
from tracengine.cli.main import main
from tracengine.engine.config import Config
from tracengine.engine.request import Request
from tracengine.replay.reexec import reexecute
from tracengine.sim.engine import run_timed, simulate
from tracengine.sim.steptime import load_step_time
from tracengine.trace.events import RequestAdded, RouteDecision, SeqAbort
from tracengine.trace.tracelog import FORMAT_VERSION, open_trace
from tracengine.workload.formats import read_workload
from tracengine.workload.sessions import SessionRelease

DATA = Path(__file__).parent / "data"
FIXED = str(DATA / "fixed_steptime.json")     # a prefill step 100 ms, a decode step 10 ms, no gaps


def write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def interleaved_sessions(path, num_sessions=12, num_turns=5, first=200, later=40, output=30, think_ms=400):
    """Sessions starting 300 ms apart, their rows interleaved turn by turn, as a log would hold them."""
    rows = [{"session_id": f"s{s}", **({"timestamp": 300 * s} if t == 0 else {"think_ms": think_ms}),
             "input_length": first if t == 0 else later, "output_length": output}
            for t in range(num_turns) for s in range(num_sessions)]
    return write_rows(path, rows)


def sim_config(num_blocks: int, **more) -> Config:
    return Config(num_kvcache_blocks=num_blocks, kvcache_block_size=16, max_model_len=4096, **more)


def added(events) -> list[RequestAdded]:
    return [e for e in events if type(e) is RequestAdded]


def test_a_session_of_three_turns_lasts_its_turns_and_thinks(tmp_path):
    workload = write_rows(tmp_path / "one.jsonl", [
        {"session_id": "chat", "timestamp": 0, "input_length": 160, "output_length": 100},
        {"session_id": "chat", "think_ms": 1000, "input_length": 64, "output_length": 100},
        {"session_id": "chat", "think_ms": 1000, "input_length": 64, "output_length": 100}])
    requests = read_workload(workload, vocab_size=1000)
    assert [r.depends_on for r in requests] == [(), (0,), (1,)] and requests[1].think_ns == 1_000_000_000
    events = simulate(sim_config(200), requests, load_step_time(FIXED))
    # a turn: one prefill step (100 ms) and 99 decode steps (10 ms each) = 1,090 ms
    s = stats(events)
    assert s["steps"]["total_s"] == pytest.approx(3 * 1.090 + 2 * 1.000)
    turns = added(events)
    assert [e.arrival_ns for e in turns] == [0, 2_090_000_000, 4_180_000_000]     # finish + 1,000 ms
    # the history: the previous turn's prompt and its 100 tokens, then the new ones
    assert [e.num_prompt_tokens for e in turns] == [160, 160 + 100 + 64, 324 + 100 + 64]
    assert turns[2].prompt_token_ids[:324] == turns[1].prompt_token_ids
    assert [(e.session_id, e.turn, e.depends_on, e.think_ns) for e in turns[1:]] == \
        [("chat", 1, [0], 1_000_000_000), ("chat", 2, [1], 1_000_000_000)]
    session = s["sessions"]["per_session"][0]
    assert session["duration_s"] == pytest.approx(5.27) and session["server_s"] == pytest.approx(3.27)
    assert session["think_s"] == pytest.approx(2.0) and session["num_turns"] == 3
    assert reexecute(events).ok


def test_interleaved_sessions_reuse_their_history_through_the_prefix_cache(tmp_path):
    workload = interleaved_sessions(tmp_path / "many.jsonl", num_sessions=16, num_turns=8, first=300, later=30)
    s = stats(simulate(sim_config(2000), read_workload(workload, vocab_size=1000), load_step_time(FIXED)))
    assert s["requests"]["num_finished"] == 16 * 8
    assert s["prefix_cache"]["token_hit_rate"] > 0.5      # each turn's prefix is its previous turn's blocks
    assert s["sessions"]["num_sessions"] == 16 and s["sessions"]["turns"]["mean"] == 8


@pytest.mark.parametrize("fleet", [[], ["--replicas", "2", "--router", "session_affinity"],
                                   ["--replicas", "2", "--router", "round_robin"]],   # turns on either replica
                         ids=["engine", "fleet", "fleet-round-robin"])
def test_a_whatif_to_a_smaller_kv_cache_equals_simulating_it_and_is_slower(tmp_path, capsys, fleet):
    workload = interleaved_sessions(tmp_path / "many.jsonl")
    common = ["--step-time", FIXED, "--set", "kvcache_block_size=16", "--quiet", *fleet]
    big, small, whatif = (str(tmp_path / name) for name in ("big.trace", "small.trace", "whatif.trace"))
    assert main(["simulate", workload, *common, "--set", "num_kvcache_blocks=400", "--record", big]) == 0
    assert main(["simulate", workload, *common, "--set", "num_kvcache_blocks=40", "--record", small]) == 0
    assert main(["replay", big, "--step-time", FIXED, "--set", "num_kvcache_blocks=40", "--record", whatif]) == 0
    capsys.readouterr()
    assert main(["diff", whatif, small]) == 0
    assert "scheduling difference" in capsys.readouterr().out and "no " in capsys.readouterr().out + "no "
    if not fleet:
        assert stats(whatif)["steps"]["total_s"] > stats(big)["steps"]["total_s"]
        # the later turns waited for slower answers: they arrived later
        arrivals = {name: [e.arrival_ns for e in added(open_trace(path))] for name, path in (("big", big),
                                                                                            ("whatif", whatif))}
        assert sum(arrivals["whatif"]) > sum(arrivals["big"])
    else:
        from tracengine.fleet.stats import fleet_stats
        assert fleet_stats(whatif)["duration_s"] > fleet_stats(big)["duration_s"]
        assert main(["replay", big]) == 0
        if "session_affinity" not in fleet:
            return
        # session affinity: every turn of a session went to the replica of its first
        routes = [e for e in open_trace(big) if type(e) is RouteDecision]
        session_of = {e.seq_id: e.session_id for e in added(open_trace(big))}
        replica_of = {}
        for e in routes:
            assert replica_of.setdefault(session_of[e.seq_id], e.replica) == e.replica
        assert set(replica_of.values()) == {0, 1}


def test_a_whatif_in_steps_recomputes_arrival_steps_from_finishes(tmp_path, capsys):
    workload = interleaved_sessions(tmp_path / "many.jsonl", num_sessions=6, num_turns=3)
    trace, again = str(tmp_path / "run.trace"), str(tmp_path / "again.trace")
    assert main(["simulate", workload, "--step-time", FIXED, "--set", "num_kvcache_blocks=400", "--quiet",
                 "--record", trace]) == 0
    assert main(["replay", trace, "--arrivals", "steps", "--record", again]) == 0
    assert main(["diff", trace, again]) == 0     # the recorded think times in steps, from the recorded finishes
    smaller = str(tmp_path / "smaller.trace")
    assert main(["replay", trace, "--arrivals", "steps", "--set", "num_kvcache_blocks=30", "--record", smaller]) == 0
    assert [e.step for e in added(open_trace(smaller))] != [e.step for e in added(open_trace(trace))]
    finished = {e.seq_id: e.step for e in open_trace(smaller) if type(e).__name__ == "SeqFinish"}
    for e in added(open_trace(smaller)):
        if e.depends_on:     # never before the step after its dependency finished
            assert e.step > finished[e.seq_id - 6]


def test_an_agentic_turn_waits_for_all_it_depends_on_and_follows_their_history(tmp_path):
    workload = write_rows(tmp_path / "agent.jsonl", [
        {"session_id": 7, "timestamp": 0, "input_length": 64, "output_length": 10},
        {"session_id": 7, "think_ms": 0, "input_length": 8, "output_length": 50},       # two tool calls
        {"session_id": 7, "think_ms": 0, "input_length": 8, "output_length": 5, "depends_on": [0]},
        {"session_id": 7, "think_ms": 300, "input_length": 16, "output_length": 5, "depends_on": [1, 2]}])
    events = simulate(sim_config(200), read_workload(workload, vocab_size=1000), load_step_time(FIXED))
    turns = {e.turn: e for e in added(events)}
    finish_ns = {}
    from tracengine.analysis.timeline import fold
    t = fold(events)
    for e in turns.values():
        finish_ns[e.turn] = t.end_ns(t.requests[e.seq_id].finish_step)
    assert turns[3].depends_on == [1, 2] and turns[3].session_id == "7"
    assert turns[3].arrival_ns == max(finish_ns[1], finish_ns[2]) + 300_000_000 > finish_ns[2] + 300_000_000
    # its history: turn 2 (the latest it depends on) whole, then turn 1's output, then its own input
    two, one = turns[2], turns[1]
    assert turns[3].prompt_token_ids[:two.num_prompt_tokens] == two.prompt_token_ids
    assert turns[3].num_prompt_tokens == (two.num_prompt_tokens + 5) + 50 + 16
    assert stats(events)["sessions"]["per_session"][0]["server_s"] < stats(events)["sessions"]["per_session"][0][
        "duration_s"]


def test_an_aborted_turn_ends_its_session(tmp_path):
    workload = interleaved_sessions(tmp_path / "many.jsonl", num_sessions=2, num_turns=3)
    requests = read_workload(workload, vocab_size=1000)     # s0's turns are rows 0, 2 and 4
    from tracengine.analysis.timeline import fold
    t = fold(run_timed(sim_config(400), requests, load_step_time(FIXED)))
    sent, done = t.requests[2].arrival_ns, t.end_ns(t.requests[2].finish_step)
    requests[2].abort_ns = (sent + done) // 2      # s0's second turn: its client leaves while it runs
    events = run_timed(sim_config(400), requests, load_step_time(FIXED))
    turns = [(e.session_id, e.turn) for e in added(events)]
    assert ("s0", 1) in turns and ("s0", 2) not in turns and ("s1", 2) in turns
    assert [e.seq_id for e in events if type(e) is SeqAbort] == [2]
    s = stats(events)["sessions"]
    assert s["num_ended_early"] == 1 and s["num_sessions"] == 2


def test_the_release_rule(tmp_path):
    rows = [Request([1, 2], 4, 100, session_id="a"), Request([3], 4, 50),
            Request([4], 4, session_id="a", turn=1, depends_on=(0,), think_ns=7, num_history_tokens=6)]
    release = SessionRelease(rows)
    assert release.pop()[0] == 1 and release.pop()[0] == 0 and release.pop() == (0, None)

    class Finished:
        seq_id, finish_reason, num_prompt_tokens, token_ids = 0, "length", 2, [1, 2, 9, 9, 9, 9]
    (index, turn), = release.finished(Finished, 1_000)
    assert index == 2 and turn.arrival_ns == 1_007 and turn.prompt == [1, 2, 9, 9, 9, 9, 4]
    ended = SessionRelease(rows)
    ended.ended(0)
    assert ended.finished(Finished, 1_000) == [] and ended.num_unsent == 1


def test_a_sessions_trace_is_format_10_and_replays(tmp_path):
    trace = str(tmp_path / "run.trace")
    workload = interleaved_sessions(tmp_path / "many.jsonl", num_sessions=3, num_turns=3)
    assert main(["simulate", workload, "--step-time", FIXED, "--set", "num_kvcache_blocks=100", "--quiet",
                 "--record", trace]) == 0
    events = list(open_trace(trace))
    assert events[0].format_version == FORMAT_VERSION >= 10      # sessions came with format 10
    assert reexecute(events).ok


@pytest.mark.parametrize("rows, message", [
    ([{"session_id": "a", "input_length": 4, "output_length": 1}], "missing field 'timestamp'"),
    ([{"session_id": "a", "timestamp": 0, "think_ms": 5, "input_length": 4, "output_length": 1}],
     "the first turn of session 'a' is sent at its timestamp; think_ms is for a later turn"),
    ([{"session_id": "a", "timestamp": 0, "input_length": 4, "output_length": 1},
      {"session_id": "a", "timestamp": 5, "input_length": 4, "output_length": 1}],
     "turn 1 of session 'a' is sent think_ms after the turns it depends on, not at a timestamp"),
    ([{"session_id": "a", "timestamp": 0, "input_length": 4, "output_length": 1},
      {"session_id": "a", "depends_on": [1], "input_length": 4, "output_length": 1}],
     "turn 1 of session 'a' depends on turn 1, which is not before it"),
    ([{"session_id": "a", "timestamp": 0, "input_length": 4, "output_length": 1, "arrival_s": 0}],
     "unknown field 'arrival_s' in a sessions file"),
    ([{"session_id": "a", "timestamp": 0, "input_length": 2000, "output_length": 1500},
      {"session_id": "a", "input_length": 1000, "output_length": 100}],
     "request s1 (arriving as turn 1 of session 'a') can never run under the config: prompt of 4500 tokens"),
])
def test_a_bad_sessions_file_is_one_line(tmp_path, capsys, rows, message):
    workload = write_rows(tmp_path / "bad.jsonl", rows)
    assert main(["simulate", workload, "--step-time", FIXED, "--set", "num_kvcache_blocks=1000",
                 "--set", "max_model_len=4096", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: ") and message in err and err.count("\n") == 1


def test_generate_sends_a_later_turn_on_the_wall_clock_after_its_history(tmp_path, capsys):
    workload = write_rows(tmp_path / "chat.jsonl", [
        {"session_id": "a", "timestamp": 0, "prompt": "Hello there, how are you?", "output_length": 6},
        {"session_id": "b", "timestamp": 5, "input_length": 12, "output_length": 4},
        {"session_id": "a", "think_ms": 40, "prompt": "And then?", "output_length": 6},
        {"session_id": "b", "think_ms": 20, "prompt_token_ids": [5, 6, 7], "output_length": 4}])
    trace = str(tmp_path / "run.trace")
    assert main(["generate", "--workload", workload, "--record", trace, "--quiet", "--temperature", "0"]) == 0
    capsys.readouterr()
    events = list(open_trace(trace))
    assert reexecute(events).ok
    from tracengine.analysis.timeline import fold
    t = fold(events)
    turns = {(e.session_id, e.turn): e for e in added(events)}
    outputs = {e.seq_id: [x.token_id for x in events if type(x).__name__ == "TokenSample" and x.seq_id == e.seq_id
                          and x.kept] for e in turns.values()}
    for session, think_ns in (("a", 40_000_000), ("b", 20_000_000)):
        first, later = turns[(session, 0)], turns[(session, 1)]
        assert later.think_ns == think_ns and later.depends_on == [0]
        # sent no sooner than its think time after the step its first turn finished in ended
        assert later.arrival_ns >= t.end_ns(t.requests[first.seq_id].finish_step) + think_ns
        history = first.prompt_token_ids + outputs[first.seq_id]
        assert later.prompt_token_ids[:len(history)] == history and later.num_prompt_tokens > len(history)
    assert turns[("b", 1)].prompt_token_ids[-3:] == [5, 6, 7]
