"""The fold: scheduler and block-manager state at any step from the events
alone, equal to the live state, reached through keyframes, handed out as values."""
import copy
from pathlib import Path

import pytest

from tracengine.cli import main
from tracengine.errors import TraceError
from tracengine.trace.events import BlockAllocate, StepEnd
from tracengine.trace.sinks import ListSink
from tracengine.replay.fold import Fold
from tracengine.replay.state import live_state
from tracengine.analysis.render import render_state
from tracengine.sim.runners import run_workload
from tracengine.testing import CANNED_WORKLOADS, canned_workload
from tracengine.trace.tracelog import TraceWriter

SNAPSHOT_DIR = Path(__file__).parent / "snapshots"
SEQ_FIELDS = ("status", "num_prompt_tokens", "num_tokens", "num_cached_tokens", "block_table", "num_preemptions")


def run_with_live_states(name):
    """The events of a canned workload and the live state after every step."""
    config, requests, runner = canned_workload(name)
    live = []
    events = run_workload(config, requests, runner, sink=ListSink(),
                          on_step=lambda engine: live.append(live_state(engine.scheduler, engine.num_steps - 1)))
    return events, live


def assert_same_state(folded, live):
    assert (folded.step, folded.waiting, folded.running) == (live.step, live.waiting, live.running)
    assert folded.ref_counts == live.ref_counts
    assert folded.hashes == live.hashes
    assert folded.free_block_ids == live.free_block_ids
    assert folded.hash_to_block_id == live.hash_to_block_id
    for seq_id, seq in live.seqs.items():
        assert {f: getattr(folded.seqs[seq_id], f) for f in SEQ_FIELDS} == {f: getattr(seq, f) for f in SEQ_FIELDS}
    # and the sequences the live scheduler no longer holds have finished
    assert all(s.status == "finished" for i, s in folded.seqs.items() if i not in live.seqs)


@pytest.mark.parametrize("keyframe_interval", [1, 3, 256])
@pytest.mark.parametrize("name", CANNED_WORKLOADS)
def test_fold_equals_the_live_state_at_every_step(name, keyframe_interval):
    events, live = run_with_live_states(name)
    fold = Fold(events, keyframe_interval=keyframe_interval)
    assert fold.num_steps == len(live)
    for state in live:
        assert_same_state(fold.state_at(state.step), state)


def test_following_a_growing_trace_gives_the_same_states():
    events, live = run_with_live_states("preemption_tail")
    fold = Fold(events[:1], keyframe_interval=2)
    for event in events[1:]:
        fold.append([event])
    assert fold.num_steps == len(live)
    for state in live:
        assert_same_state(fold.state_at(state.step), state)


def test_states_are_values():
    events, _ = run_with_live_states("preemption_tail")
    cut = next(i for i, e in enumerate(events) if type(e) is StepEnd and e.step == 2) + 1
    fold = Fold(events[:cut], keyframe_interval=2)
    states = [fold.state_at(step) for step in range(-1, 3)]
    before = copy.deepcopy([(s.waiting, s.running, s.seqs, s.ref_counts, s.free_block_ids) for s in states])
    fold.append(events[cut:])
    for step in range(fold.num_steps):
        fold.state_at(step)
    assert [(s.waiting, s.running, s.seqs, s.ref_counts, s.free_block_ids) for s in states] == before


def test_initial_state_and_before_step():
    events, _ = run_with_live_states("worked_example")
    fold = Fold(events)
    initial = fold.state_at(-1)
    assert initial.waiting == [] and initial.seqs == {} and initial.decision is None
    assert initial.free_block_ids == list(range(64)) and initial.num_free_blocks == 64
    assert fold.state_at(before_step=1).step == 0
    with pytest.raises(IndexError):
        fold.state_at(fold.num_steps)
    with pytest.raises(IndexError):
        fold.state_at(-2)


def test_sequence_history():
    fold = Fold(run_with_live_states("preemption_tail")[0])
    seqs = fold.state_at(fold.num_steps - 1).seqs
    s2, s3 = seqs[2], seqs[3]
    assert (s2.arrival_step, s2.first_token_step, s2.finish_step, s2.finish_reason) == (0, 0, 6, "length")
    assert (s2.num_preemptions, s3.num_preemptions) == (1, 1)
    assert s2.num_tokens == 8 + 6 and s2.num_completion_tokens == 6


def test_scheduled_tokens_belong_to_their_step():
    fold = Fold(run_with_live_states("worked_example")[0])
    assert fold.state_at(0).seqs[0].num_scheduled_tokens == 20
    assert [fold.state_at(1).seqs[i].num_scheduled_tokens for i in range(3)] == [5, 8, 6]
    assert [fold.state_at(3).seqs[i].num_scheduled_tokens for i in range(3)] == [1, 1, 1]
    assert fold.state_at(1).decision.stop_reason == "waiting_empty"


def test_shared_blocks_have_two_owners():
    fold = Fold(run_with_live_states("shared_prefix")[0])
    state = fold.state_at(2)       # s1 has just taken s0's two prefix blocks
    shared = [b for b in state.blocks if b.ref_count == 2]
    assert [(b.block_id, b.owners) for b in shared] == [(0, [0, 1]), (1, [0, 1])]
    assert all(state.hash_to_block_id[b.hash] == b.block_id for b in shared)


def test_events_at():
    events = run_with_live_states("worked_example")[0]
    fold = Fold(events)
    assert fold.header == events[0]
    assert fold.events_at(1) == [e for e in events[1:] if e.step == 1]
    assert type(fold.events_at(1)[-1]) is StepEnd


def test_inconsistent_events_are_a_trace_error():
    events = run_with_live_states("worked_example")[0]
    i = next(i for i, e in enumerate(events) if type(e) is BlockAllocate and e.seq_id == 1)
    with pytest.raises(TraceError, match="step 1"):
        Fold(events[:i] + events[i + 1:])


def test_a_header_without_a_block_pool_is_refused():
    events = run_with_live_states("worked_example")[0]
    header = events[0]
    bad = type(header)(**{**{f: getattr(header, f) for f in header.__struct_fields__},
                          "config": {**header.config, "num_kvcache_blocks": -1}})
    with pytest.raises(TraceError, match="num_kvcache_blocks=-1"):
        Fold([bad])


def test_from_trace_and_the_state_command(tmp_path, capsys, snapshot):
    events = run_with_live_states("shared_prefix")[0]
    path = tmp_path / "run.trace"
    with TraceWriter(path, events[0]) as writer:
        for event in events[1:]:
            writer.emit(event)
    assert Fold.from_trace(path).num_steps == 7
    assert main(["replay", str(path), "--state", "2"]) == 0
    snapshot.snapshot_dir = SNAPSHOT_DIR
    snapshot.assert_match(capsys.readouterr().out, "state_shared_prefix_step2.txt")
    assert render_state(Fold(events).state_at(2)) == (SNAPSHOT_DIR / "state_shared_prefix_step2.txt").read_text()
    assert main(["replay", str(path), "--state", "7"]) == 2
    assert "no step 7" in capsys.readouterr().err
