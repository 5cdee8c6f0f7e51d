"""Scheduling policies: `mixed` (vLLM V1's FCFS with chunked prefill) on the
canned workloads and the real engine, what-if to it, and policies of a user's
own loaded by import path (tests/user_policies.py)."""
import json
from pathlib import Path

import pytest

from tracengine import LLM, SamplingParams
from tracengine.cli.main import main
from tracengine.engine.config import Config
from tracengine.engine.policies import MixedScheduler, load_policy, policy_path
from tracengine.engine.scheduler import Scheduler
from tracengine.errors import ConfigError
from tracengine.replay.reexec import reexecute
from tracengine.analysis.render import render_steps
from tracengine.sim.runners import run_workload
from tracengine.testing import CANNED_WORKLOADS, canned_workload
from tracengine.trace.events import Preempt, ScheduleDecision, TokenSample, prefill_flags
from tracengine.trace.tracelog import TraceReader

from user_policies import AtMostTwoRunning, MixedPreemptingHead, ShortestFirst
from helpers import batched_and_alone

SNAPSHOT_DIR = Path(__file__).parent / "snapshots"
TRACES = Path(__file__).parent.parent / "traces"


def run(name, policy="mixed", **changes):
    config, requests, runner = canned_workload(name)
    return run_workload(config.replace(**changes), requests, runner, policy=policy)


def decisions(events):
    return [e for e in events if type(e) is ScheduleDecision]


def kinds(decision):
    return [(s.seq_id, s.num_tokens, "p" if p else "d") for s, p in zip(decision.seqs, prefill_flags(decision))]


@pytest.mark.parametrize("name", CANNED_WORKLOADS)
def test_mixed_step_table(snapshot, name):
    snapshot.snapshot_dir = SNAPSHOT_DIR
    snapshot.assert_match(render_steps(run(name)), f"mixed_{name}.txt")


@pytest.mark.parametrize("name", CANNED_WORKLOADS)
def test_mixed_runs_replay_and_record_their_policy(name):
    events = run(name)
    assert events[0].config["scheduling_policy"] == "mixed"
    result = reexecute(events)
    assert result.ok, result.divergence
    assert result.num_events == len(events) - 1


def test_mixed_decodes_beside_the_chunks_of_a_long_prompt():
    first = decisions(run("long_prompt_during_decode", "prefill_first"))
    mixed = decisions(run("long_prompt_during_decode"))
    # prefill_first: the 40-token prompt takes steps 2-4 alone (16 + 16 + 8), s0 and s1 wait
    assert [kinds(d) for d in first[2:5]] == [[(2, 16, "p")], [(2, 16, "p")], [(2, 8, "p")]]
    # mixed: s0 and s1 decode first, the chunk gets the rest of the budget of 16
    assert [kinds(d) for d in mixed[2:5]] == [[(0, 1, "d"), (1, 1, "d"), (2, 14, "p")]] * 2 + [
        [(0, 1, "d"), (1, 1, "d"), (2, 12, "p")]]
    assert [d.phase for d in mixed[2:5]] == ["mixed"] * 3
    assert [d.stop_reason for d in mixed[2:5]] == ["budget_exhausted", "budget_exhausted", "waiting_empty"]
    # the sequences already decoding finish sooner: no step without a token for them
    def finish_step(events, seq_id):
        return max(e.step for e in events if type(e) is TokenSample and e.seq_id == seq_id)
    assert finish_step(run("long_prompt_during_decode"), 0) < finish_step(run("long_prompt_during_decode",
                                                                              "prefill_first"), 0)


def test_mixed_worked_example_schedules_as_prefill_first():
    """All three prompts arrive together and nothing decodes while they prefill, so mixed
    makes prefill_first's decisions: 20 of s0, then its 5 and s1, s2; then decode."""
    first, mixed = decisions(run("worked_example", "prefill_first")), decisions(run("worked_example"))
    assert [kinds(d) for d in mixed] == [kinds(d) for d in first]
    assert [(s.seq_id, s.num_tokens) for s in mixed[1].seqs] == [(0, 5), (1, 8), (2, 6)]


def test_mixed_preempts_the_tail_and_admits_nobody_that_step():
    events = run("preemption_tail")
    preempts = [e for e in events if type(e) is Preempt]
    assert (preempts[0].step, preempts[0].seq_id, preempts[0].by_seq_id) == (1, 3, 1)
    d = decisions(events)[1]
    assert d.stop_reason == "preempted" and [s.seq_id for s in d.seqs] == [0, 1, 2]


def test_mixed_head_of_line_block_names_the_head():
    d = decisions(run("head_of_line"))[1]
    assert (d.phase, d.stop_reason, d.blocked_seq_id, d.num_blocks_needed) == ("decode", "no_free_blocks", 1, 6)


def test_mixed_caps_running_at_max_num_seqs():
    events = run("eos_vs_length", max_num_seqs=2)
    d0 = decisions(events)[0]
    assert [s.seq_id for s in d0.seqs] == [0, 1] and d0.stop_reason == "max_num_seqs"


# -- policies by name, and of a user's own ---------------------------------------------------

def test_policy_names_and_paths():
    assert load_policy("prefill_first") is Scheduler and load_policy("mixed") is MixedScheduler
    assert policy_path(MixedScheduler) == "mixed"
    assert policy_path(ShortestFirst) == "user_policies:ShortestFirst"
    assert load_policy("user_policies:ShortestFirst") is ShortestFirst
    for bad, message in (("no_such_module:X", "cannot load scheduling policy"),
                         ("user_policies:Nothing", "cannot load scheduling policy"),
                         ("tracengine.engine.config:Config", "is not a Scheduler subclass")):
        with pytest.raises(ConfigError, match=message):
            load_policy(bad)
    with pytest.raises(ConfigError, match="scheduling_policy must be"):
        Config(scheduling_policy="fastest")


def test_shortest_first_serves_short_prompts_first():
    config, requests, runner = canned_workload("eos_vs_length")    # prompts of 5, 6, 4 and 4 tokens
    events = run_workload(config.replace(max_num_seqs=1), requests, runner, policy=ShortestFirst)
    assert events[0].config["scheduling_policy"] == "user_policies:ShortestFirst"
    prefills = [d.seqs[0].seq_id for d in decisions(events) if d.phase == "prefill"]
    assert prefills == [2, 3, 0, 1]
    assert reexecute(events, ShortestFirst).ok


def test_admit_hook_stops_admission_with_its_reason():
    events = run("eos_vs_length", AtMostTwoRunning)
    d0 = decisions(events)[0]
    assert [s.seq_id for s in d0.seqs] == [0, 1]
    assert (d0.stop_reason, d0.blocked_seq_id) == ("not_admitted", -1)   # a refusal, not a blocked head
    assert all(d.blocked_seq_id == -1 for d in decisions(events))
    assert reexecute(events, AtMostTwoRunning).ok


def test_a_user_policy_trace_needs_the_policy_to_replay(tmp_path, capsys):
    trace = tmp_path / "short.trace"
    assert main(["generate", "--prompt-lens", "12,3,7", "--max-tokens", "3", "--max-num-seqs", "1",
                 "--temperature", "0", "--scheduling-policy", "user_policies:ShortestFirst",
                 "--record", str(trace), "--quiet"]) == 0
    with TraceReader(trace) as reader:
        events = list(reader.events())
    assert events[0].config["scheduling_policy"] == "user_policies:ShortestFirst"
    assert [d.seqs[0].seq_id for d in decisions(events) if d.phase == "prefill"] == [1, 2, 0]
    capsys.readouterr()
    assert main(["replay", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'user_policies:ShortestFirst'" in err and "--policy" in err
    assert main(["replay", str(trace), "--policy", "user_policies:ShortestFirst"]) == 0
    # another policy given: the replay names where it departs from the trace
    assert main(["replay", str(trace), "--policy", "prefill_first"]) == 1
    assert "replay diverges at step 0" in capsys.readouterr().out
    # a what-if to a user policy names it with --set (so it is imported); its trace needs it to replay
    whatif = tmp_path / "whatif.trace"
    first = tmp_path / "first.trace"
    assert main(["generate", "--prompt-lens", "12,3,7", "--max-tokens", "3", "--max-num-seqs", "1",
                 "--temperature", "0", "--record", str(first), "--quiet"]) == 0
    assert main(["replay", str(first), "--set", "scheduling_policy=user_policies:ShortestFirst",
                 "--arrivals", "steps", "--record", str(whatif)]) == 0
    capsys.readouterr()
    assert main(["replay", str(whatif)]) == 2
    assert main(["replay", str(whatif), "--policy", "user_policies:ShortestFirst"]) == 0
    assert main(["diff", str(whatif), str(trace)]) == 0


def test_llm_takes_a_policy_class():
    llm = LLM("", num_kvcache_blocks=32, kvcache_block_size=4, max_num_seqs=1, scheduling_policy=ShortestFirst)
    try:
        assert type(llm.scheduler) is ShortestFirst
        assert llm.config.scheduling_policy == "user_policies:ShortestFirst"
        sp = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        llm.generate([[5] * 9, [6] * 2], sp, use_tqdm=False)
    finally:
        llm.close()


# -- what-if to mixed, and a deliberate change to mixed ---------------------------------------

def test_whatif_to_mixed_equals_running_mixed(tmp_path, capsys):
    common = ["--prompt-lens", "30,9,17,5", "--max-num-batched-tokens", "12", "--max-tokens", "6",
              "--ignore-eos", "--temperature", "0", "--block-size", "4", "--num-kvcache-blocks", "24", "--quiet"]
    first, whatif, mixed = tmp_path / "first.trace", tmp_path / "whatif.trace", tmp_path / "mixed.trace"
    assert main(["generate", *common, "--record", str(first)]) == 0
    assert main(["generate", *common, "--scheduling-policy", "mixed", "--record", str(mixed)]) == 0
    assert main(["replay", str(first), "--set", "scheduling_policy=mixed", "--record", str(whatif)]) == 0
    capsys.readouterr()
    assert main(["diff", str(whatif), str(mixed)]) == 0
    assert "no scheduling difference" in capsys.readouterr().out
    with TraceReader(mixed) as reader:
        phases = {d.phase for d in decisions(reader.events())}
    assert "mixed" in phases                          # the workload does mix
    assert main(["diff", str(first), str(mixed)]) == 1


def test_whatif_of_the_default_run_to_mixed_equals_running_mixed(tmp_path, capsys):
    # The default workload's text prompts are tokenized and added before step 0 starts, so they
    # arrive over the engine's start-up: step 0 meets all of them, in simulated time as recorded.
    first, whatif, mixed = tmp_path / "first.trace", tmp_path / "whatif.trace", tmp_path / "mixed.trace"
    selfcheck = tmp_path / "self.trace"
    assert main(["generate", "--quiet", "--record", str(first)]) == 0
    assert main(["generate", "--quiet", "--scheduling-policy", "mixed", "--record", str(mixed)]) == 0
    assert main(["replay", str(first), "--set", "scheduling_policy=mixed", "--record", str(whatif)]) == 0
    assert main(["replay", str(first), "--arrivals", "time", "--record", str(selfcheck)]) == 0
    capsys.readouterr()
    assert main(["diff", str(whatif), str(mixed)]) == 0
    assert main(["diff", str(selfcheck), str(first)]) == 0     # the self-check is the recorded schedule
    with TraceReader(first) as reader:
        decision = decisions(reader.events())[0]
    assert decision.num_waiting + decision.num_running == 14    # every request had arrived by step 0


def test_a_change_to_mixed_makes_its_golden_trace_diverge(capsys):
    assert main(["replay", str(TRACES / "mixed.trace")]) == 0
    capsys.readouterr()
    assert main(["replay", str(TRACES / "mixed.trace"), "--policy", "user_policies:MixedPreemptingHead"]) == 1
    out = capsys.readouterr().out
    with TraceReader(TRACES / "mixed.trace") as reader:
        events = list(reader.events())
    # steps 0-7 reproduce (step 3's preemption is s7's own); at step 8 s3 needs a block with s4, s5
    # and s6 behind it in running: the recorded victim is the tail s6, the variant takes the head s4
    assert "replay diverges at step 8 " in out
    assert "Preempt           seq_id=6 by_seq_id=3" in out.split("expected:")[1].split("\n")[0]
    assert "Preempt           seq_id=4 by_seq_id=3" in out.split("actual:")[1].split("\n")[0]
    assert "8 steps and" in out


# -- the real engine -------------------------------------------------------------------------

def test_mixed_batches_on_the_real_engine_give_each_request_its_tokens_alone():
    prompts = [[1 + (13 * i + 5 * j) % 500 for j in range(4 + 9 * i)] for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=5 + 2 * i, ignore_eos=True) for i in range(6)]
    llm = LLM("", num_kvcache_blocks=64, kvcache_block_size=4, max_num_batched_tokens=16,
              scheduling_policy="mixed")
    try:
        batched, alone = batched_and_alone(llm, prompts, params)
        assert llm.last_run["steps"]["num_mixed_steps"] > 3
    finally:
        llm.close()
    assert batched == alone


def test_mixed_golden_trace_reproduces_and_keeps_its_step_table(snapshot):
    with TraceReader(TRACES / "mixed.trace") as reader:
        events = list(reader.events())
    result = reexecute(events)
    assert result.ok and result.num_events == len(events) - 1 and result.num_unfinished == 0
    assert {"prefill", "mixed", "decode"} <= {d.phase for d in decisions(events)}
    snapshot.snapshot_dir = SNAPSHOT_DIR
    snapshot.assert_match(render_steps(events), "golden_mixed.txt")


# -- downstream: stats, export, the TUI's strip and sentence, events ----------------------------

def mixed_events():
    return run("long_prompt_during_decode")


def test_stats_of_a_mixed_run_split_its_tokens_by_kind():
    from tracengine.analysis.stats import stats
    s = stats(mixed_events())
    assert s["steps"]["num_mixed_steps"] == 3
    # prompts 6 + 4 + 40; decode: s0 and s1 seven tokens each after their first, s2 one
    assert (s["tokens"]["num_prefill_tokens"], s["tokens"]["num_decode_tokens"]) == (50, 15)
    # decoding sequences get a token every step under mixed: ITL of one step, never stalled
    assert s["latency"]["itl"]["steps"]["p99"] == 1
    first = stats(run("long_prompt_during_decode", "prefill_first"))
    assert first["latency"]["itl"]["steps"]["p99"] == 4 and first["steps"]["num_mixed_steps"] == 0


def test_perfetto_export_names_mixed_steps_and_each_request_its_own_phase(tmp_path):
    from tracengine.analysis.export_stream import export_perfetto
    export_perfetto(mixed_events(), tmp_path / "out.json")
    doc = json.loads((tmp_path / "out.json").read_text())
    steps = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert steps[2:5] == ["mixed"] * 3
    spans = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["pid"] == 2:
            spans.setdefault(e["args"]["seq_id"], []).append(e["name"])
    assert spans[0] == ["waiting", "prefill", "decode"]       # one decode span over steps 1-7: never paused
    assert spans[2][-4:] == ["prefill", "prefill", "prefill", "decode"]
    export_perfetto(run("long_prompt_during_decode", "prefill_first"), tmp_path / "first.json")
    doc = json.loads((tmp_path / "first.json").read_text())
    assert [e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 2
            and e["args"]["seq_id"] == 0] == ["waiting", "prefill", "decode", "paused", "decode"]


def test_tui_strip_colours_mixed_steps_and_the_sentence_says_why_it_stopped(tmp_path):
    from tracengine.replay.fold import Fold
    from tracengine.trace.views import iter_steps
    from tracengine.trace.tracelog import TraceWriter
    from tracengine.tui.explain import explain_step
    from tracengine.tui.trace_index import TraceIndex
    events = mixed_events()
    path = tmp_path / "mixed.trace"
    with TraceWriter(path, events[0]) as writer:
        for e in events[1:]:
            writer.emit(e)
    index = TraceIndex(path)
    try:
        assert index.num_steps == 8       # the first slice holds them all
        assert [index.column_summary(i, i + 1)[1] for i in range(8)] == (
            ["prefill", "decode", "mixed", "mixed", "mixed", "decode", "decode", "decode"])
        assert index.column_summary(0, 2)[1] == "prefill" and index.column_summary(0, 8)[1] == "mixed"
        # s2's three chunks are prefill milestones of its own, beside the decodes of s0 and s1
        assert [(m.step, m.kind, m.num_tokens) for m in index.milestones(2) if m.kind == "prefill"] == [
            (2, "prefill", 14), (3, "prefill", 14), (4, "prefill", 12)]
        assert [m.kind for m in index.milestones(0)] == ["arrive", "prefill", "finish"]
    finally:
        index.close()
    fold = Fold(events)
    step2 = list(iter_steps(events[1:]))[2]
    text = explain_step(step2, fold.state_at(2).seqs, fold.state_at(1).num_free_blocks, 16, 16)
    assert text.startswith("mixed batch: decode 2 seqs, 1 token each, beside prefill seq 2 got 14 of 40 tokens")
    assert text.endswith("the token budget of 16 tokens is used up")


def test_events_listing_shows_a_mixed_decision(tmp_path, capsys):
    from tracengine.trace.tracelog import TraceWriter
    events = mixed_events()
    path = tmp_path / "mixed.trace"
    with TraceWriter(path, events[0]) as writer:
        for e in events[1:]:
            writer.emit(e)
    assert main(["events", str(path), "--type", "ScheduleDecision", "--step", "2"]) == 0
    out = capsys.readouterr().out
    assert "mixed" in out and "num_decode_seqs=2" in out


def test_the_server_runs_the_mixed_policy(tmp_path):
    """Concurrent clients of `tracengine serve` under mixed get each request's tokens alone;
    its trace has mixed steps and replays."""
    import threading

    import openai

    from tracengine.serve.server import ServeApp
    prompts = ["The scheduler decides which sequences run at every step", "hello", "prefix caching shares",
               "one two three four five six seven eight nine ten eleven twelve"]
    llm = LLM("", scheduling_policy="mixed", max_model_len=128, num_kvcache_blocks=48, kvcache_block_size=4,
              max_num_batched_tokens=8, max_num_seqs=8)
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    try:
        alone = [llm.generate([p], greedy, use_tqdm=False)[0]["token_ids"] for p in prompts]
        path = tmp_path / "served.trace"
        llm.start_recording(str(path))
        app = ServeApp(llm, "127.0.0.1", 0, "embedded", api_key="k").start()
        try:
            client = openai.OpenAI(base_url=app.url + "/v1", api_key="k", max_retries=0, timeout=60)
            got = [None] * len(prompts)

            def ask(i):
                got[i] = client.completions.create(model="embedded", prompt=prompts[i], max_tokens=10,
                                                   temperature=0, extra_body={"return_token_ids": True,
                                                                              "ignore_eos": True}
                                                   ).choices[0].token_ids
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            app.stop()
    finally:
        llm.close()
    assert got == alone
    with TraceReader(path) as reader:
        events = list(reader.events())
    assert events[0].config["scheduling_policy"] == "mixed"
    assert "mixed" in {d.phase for d in decisions(events)}
    assert reexecute(events).ok


def test_a_time_aware_whatif_runs_a_policy_given_by_name():
    from tracengine.replay.timed import timed_whatif
    with TraceReader(TRACES / "mixed.trace") as reader:
        events = list(reader.events())
    result = timed_whatif(events, {"scheduling_policy": "user_policies:MixedPreemptingHead"})
    assert result.new[0].config["scheduling_policy"] == "user_policies:MixedPreemptingHead"
    assert reexecute(result.self_check).ok                       # the recorded policy, in simulated time
    assert reexecute(result.new, MixedPreemptingHead).ok
    with pytest.raises(ConfigError, match="user_policies:MixedPreemptingHead"):
        reexecute(result.new)                                     # never imported on its own


def test_a_scheduler_is_handed_its_block_manager_and_mixed_runs_the_rules_of_the_one_it_has():
    """The block rules are the block manager's: mixed schedules a chunk's slots per step with
    vLLM's (VllmBlockManager), a whole prompt at admission with nano-vllm's (BlockManager)."""
    from tracengine.engine.block_manager import BlockManager
    from tracengine.engine.policies import MixedScheduler
    from tracengine.engine.sequence import Sequence
    from tracengine.engine.vllm_block_manager import VllmBlockManager
    from tracengine.trace.events import BlockAllocate
    from tracengine.trace.sinks import ListSink
    config = Config(num_kvcache_blocks=16, kvcache_block_size=4, max_num_batched_tokens=8, max_num_seqs=4,
                    max_model_len=64, scheduling_policy="mixed")
    allocated = {}
    for manager_class in (VllmBlockManager, BlockManager):
        sink = ListSink()
        manager = manager_class(16, 4, sink)
        scheduler = MixedScheduler(config, sink, block_manager=manager)
        assert scheduler.block_manager is manager
        scheduler.add(Sequence(0, list(range(20)), 4))
        scheduler.schedule()
        allocated[manager_class] = [len(e.block_ids) for e in sink.events if type(e) is BlockAllocate]
    assert allocated == {VllmBlockManager: [2], BlockManager: [5]}    # the 8-token chunk's slots, or all 20
    assert type(MixedScheduler(config).block_manager) is VllmBlockManager
    assert type(MixedScheduler(config.replace(block_rules="nano-vllm")).block_manager) is BlockManager
