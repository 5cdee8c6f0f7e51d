"""Re-execution: the engine's own scheduler and block manager, fed a trace's
requests and tokens, emit the recorded events; any difference is reported at
its step, and `tracengine replay` exits 1."""
from pathlib import Path

import msgspec
import pytest
from pytest_snapshot.plugin import Snapshot

from tracengine.cli import main
from tracengine.errors import TraceError
from tracengine.trace.events import BlockHash, Preempt, ScheduleDecision, SeqFinish, StepEnd, TokenSample
from tracengine.replay.reexec import reexecute
from tracengine.analysis.render import format_event, render_steps
from tracengine.testing import CANNED_WORKLOADS
from tracengine.engine.scheduler import Scheduler
from tracengine.trace.tracelog import TraceReader

from helpers import cut_like_a_kill, run_canned, write_trace

SNAPSHOT_DIR = Path(__file__).parent / "snapshots"


def replace_first(events, cls, **changes):
    i = next(i for i, e in enumerate(events) if type(e) is cls)
    return events[:i] + [msgspec.structs.replace(events[i], **changes)] + events[i + 1:]


def preempt_head_of_running(monkeypatch):
    """A deliberate scheduler change: the head of running gives way instead of the tail."""
    original = Scheduler.preempt

    def preempt(self, seq, by):
        if seq is not by and self.running:
            self.running.append(seq)          # undo the scheduler's choice of the tail
            seq = self.running.popleft()
        original(self, seq, by)

    monkeypatch.setattr(Scheduler, "preempt", preempt)


@pytest.mark.parametrize("name", CANNED_WORKLOADS)
def test_canned_workloads_reproduce(name):
    events = run_canned(name)
    result = reexecute(events)
    assert result.ok
    assert result.num_steps == sum(type(e) is StepEnd for e in events)
    assert result.num_events == len(events) - 1       # all but the header
    assert result.num_unfinished == 0


def test_replay_command_reproduces_a_trace_file(tmp_path, capsys):
    path = write_trace(tmp_path / "run.trace", run_canned("preemption_tail"))
    assert main(["replay", path]) == 0
    out = capsys.readouterr().out
    assert "11 steps and" in out and "reproduced exactly" in out


def test_a_changed_decision_is_reported_at_its_step():
    events = replace_first(run_canned("worked_example"), ScheduleDecision, stop_reason="chunk_gate")
    d = reexecute(events).divergence
    assert (d.step, d.index) == (0, 4)           # 3 RequestAdded, 1 BlockAllocate, then the decision
    assert d.expected.stop_reason == "chunk_gate" and d.actual.stop_reason == "budget_exhausted"
    assert d.reason == "the replay emitted a different event"
    assert d.state.waiting == [0, 1, 2] and d.state.seqs[0].block_table == [0, 1, 2, 3, 4, 5, 6]


def test_a_changed_token_shows_up_where_its_block_is_hashed():
    events = run_canned("worked_example")
    # s2's kept token of step 1 is its 7th token, in its 2nd block (tokens 4-7), which step 3 hashes
    i = next(i for i, e in enumerate(events) if type(e) is TokenSample and e.seq_id == 2)
    events[i] = msgspec.structs.replace(events[i], token_id=events[i].token_id + 1)
    d = reexecute(events).divergence
    assert d.step == 3
    assert type(d.expected) is BlockHash and type(d.actual) is BlockHash
    assert (d.actual.seq_id, d.actual.block_id) == (2, 10) and d.actual.hash != d.expected.hash


def test_a_dropped_middle_chunk_sample_changes_nothing():
    events = run_canned("worked_example")
    i = next(i for i, e in enumerate(events) if type(e) is TokenSample and not e.kept)
    events[i] = msgspec.structs.replace(events[i], token_id=events[i].token_id + 1)
    assert reexecute(events).ok


def test_wall_clock_fields_are_not_compared():
    events = run_canned("self_preemption")
    events = [msgspec.structs.replace(e, schedule_ns=e.schedule_ns + 123) if type(e) is StepEnd else e
              for e in events]
    assert reexecute(events).ok


def test_an_event_the_replay_does_not_emit():
    events = run_canned("max_tokens_one")
    extra = Preempt(0, 0, 0, [], 0)
    i = next(i for i, e in enumerate(events) if type(e) is StepEnd)
    d = reexecute(events[:i] + [extra] + events[i:]).divergence
    assert d.step == 0 and d.expected == extra and type(d.actual) is StepEnd


def test_an_event_the_trace_does_not_have():
    events = run_canned("max_tokens_one")
    i = next(i for i, e in enumerate(events) if type(e) is SeqFinish)
    d = reexecute(events[:i] + events[i + 1:]).divergence
    assert d.step == 0 and d.expected == events[i + 1] and d.actual == events[i]


def test_a_trace_cut_short_reproduces_what_it_has():
    events = run_canned("head_of_line")
    cut = next(i for i, e in enumerate(events) if type(e) is StepEnd and e.step == 4) + 1
    result = reexecute(events[:cut])
    assert result.ok and result.num_steps == 5 and result.num_unfinished == 3


def test_events_without_a_header_are_refused():
    with pytest.raises(TraceError, match="TraceHeader"):
        reexecute(run_canned("worked_example")[1:])
    # one check, one message, in every reader of an event stream
    from tracengine.replay.diff import diff_traces
    from tracengine.replay.fold import Fold
    from tracengine.replay.whatif import whatif
    events = run_canned("worked_example")
    for read in (reexecute, lambda e: whatif(e, {}), lambda e: diff_traces(events, e), Fold):
        with pytest.raises(TraceError, match="^a trace starts with a TraceHeader, not RequestAdded$"):
            read(events[1:])
    for read in (reexecute, lambda e: whatif(e, {}), lambda e: diff_traces(events, e)):   # a Fold waits for more
        with pytest.raises(TraceError, match="^a trace starts with a TraceHeader, not nothing$"):
            read([])


@pytest.mark.patches_core
def test_a_scheduler_change_makes_replay_exit_1_at_the_right_step(tmp_path, capsys, monkeypatch):
    # recorded by the real scheduler: at step 1, s1 needs a block and the tail s3 gives way
    path = write_trace(tmp_path / "run.trace", run_canned("preemption_tail"))
    preempt_head_of_running(monkeypatch)
    assert main(["replay", path]) == 1
    out = capsys.readouterr().out
    assert "replay diverges at step 1" in out
    assert "expected:      1  Preempt           seq_id=3 by_seq_id=1 " in out
    assert "actual:        1  Preempt           seq_id=2 by_seq_id=1 " in out
    assert "recorded state before the step:" in out and "replayed state at the divergence:" in out
    assert "running:" in out and "blocks [" in out


@pytest.mark.patches_core
def test_a_scheduler_change_fails_the_snapshot_with_a_readable_diff(monkeypatch):
    preempt_head_of_running(monkeypatch)
    text = render_steps(run_canned("preemption_tail"))
    snapshot = Snapshot(False, False, SNAPSHOT_DIR)      # compare only, even under --snapshot-update
    with pytest.raises(AssertionError) as failure:
        snapshot.assert_match(text, "preemption_tail.txt")
    message = str(failure.value)
    assert "value does not match the expected value in snapshot" in message
    assert "preemption_tail.txt" in message
    assert "preempt s2(by s1, recompute 8)" in message    # the patched run's line in the diff
    assert "preempt s3(by s1, recompute 8)" in message    # the recorded one


def test_a_file_that_is_not_a_trace_exits_2(tmp_path, capsys):
    path = tmp_path / "not.trace"
    path.write_bytes(b"hello")
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: ") and err.count("\n") == 1


GOLDEN = ("worked_example", "preemption", "default_mix", "online", "hash_ids", "hash_ids_v7", "sessions")
TRACES = Path(__file__).parent.parent / "traces"


def read_trace(name):
    with TraceReader(TRACES / f"{name}.trace") as reader:
        events = list(reader.events())
        assert reader.torn_tail is None
    return events


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_traces_reproduce_and_keep_their_step_table(name, snapshot):
    events = read_trace(name)
    result = reexecute(events)
    assert result.ok, format_event(result.divergence.expected)
    assert result.num_events == len(events) - 1 and result.num_unfinished == 0
    snapshot.snapshot_dir = SNAPSHOT_DIR
    snapshot.assert_match(render_steps(events), f"golden_{name}.txt")


def test_golden_worked_example_is_the_seeds_example():
    decisions = [e for e in read_trace("worked_example") if type(e) is ScheduleDecision]
    assert [(s.seq_id, s.num_tokens) for s in decisions[0].seqs] == [(0, 20)]
    assert decisions[0].stop_reason == "budget_exhausted"
    assert [(s.seq_id, s.num_tokens) for s in decisions[1].seqs] == [(0, 5), (1, 8), (2, 6)]
    assert all(d.phase == "decode" for d in decisions[2:])


@pytest.mark.patches_core
def test_a_scheduler_change_makes_a_golden_trace_diverge(monkeypatch, capsys):
    preempt_head_of_running(monkeypatch)
    assert main(["replay", str(TRACES / "preemption.trace")]) == 1
    out = capsys.readouterr().out
    # step 3: s2 needs a block and only s3 is behind it, head and tail alike; step 19: s0 needs one,
    # behind it s1 (head) and s2 (tail)
    assert "replay diverges at step 19" in out
    assert "expected:     19  Preempt           seq_id=2 by_seq_id=0 " in out
    assert "actual:       19  Preempt           seq_id=1 by_seq_id=0 " in out
    # caught inside the step: s0 (being scheduled) and s1 (being preempted) are in neither queue
    in_flight = out[out.index("state in the middle of step 19"):]
    assert "in flight (out of the queues in the middle of the step):\n    s0 " in in_flight
    assert "\n    s1 " in in_flight


def test_a_torn_tail_is_noted_and_the_complete_steps_reproduce(tmp_path, capsys):
    path = write_trace(tmp_path / "run.trace", run_canned("head_of_line"))
    cut_like_a_kill(path, 5)
    assert main(["replay", path]) == 0
    captured = capsys.readouterr()
    assert "11 steps and" in captured.out and "reproduced exactly" in captured.out
    assert "the trace ends before 1 of its sequences finished" in captured.out
    assert "torn last frame: " in captured.err
