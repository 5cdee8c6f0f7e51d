"""Scheduler.abort (an extension of the seeds, as vLLM's abort_request) and its SeqAbort event:
recorded between steps, re-executed at the same point, folded, counted by stats."""
from tracengine.analysis.stats import stats
from tracengine.engine.llm_engine import LLMEngine
from tracengine.engine.sampling_params import SamplingParams
from tracengine.replay.fold import Fold
from tracengine.replay.reexec import reexecute
from tracengine.sim.runners import SyntheticRunner
from tracengine.replay.state import live_state
from tracengine.trace.events import BlockFree, SeqAbort
from tracengine.trace.sinks import ListSink
from tracengine.trace.tracelog import TraceWriter, make_header, open_trace

from helpers import make_config, make_scheduler, make_seqs, step_scheduler as step


def test_abort_takes_a_running_sequence_out_and_frees_its_blocks(sink):
    scheduler = make_scheduler(sink, num_kvcache_blocks=8)
    a, b = make_seqs([6, 5])          # 2 blocks each of 4 tokens
    scheduler.add(a)
    scheduler.add(b)
    step(scheduler)                   # both prefilled, both running
    assert scheduler.block_manager.num_free_blocks == 8 - 4
    assert scheduler.abort(a.seq_id, "client") is a
    assert list(scheduler.running) == [b] and a.is_finished and a.finish_reason == "abort"
    assert scheduler.block_manager.num_free_blocks == 8 - 2
    abort, free = sink.events[-2:]
    assert abort == SeqAbort(0, a.seq_id, "client", "running", 6, 1)
    assert type(free) is BlockFree and free.block_ids == [1, 0]     # tail first, as deallocate does
    seqs, _ = step(scheduler)
    assert seqs == [b]


def test_abort_of_a_waiting_sequence_without_blocks_frees_nothing(sink):
    scheduler = make_scheduler(sink, max_num_batched_tokens=8)
    a, b = make_seqs([8, 8])
    scheduler.add(a)
    scheduler.add(b)
    step(scheduler)                   # budget 8: a prefilled, b waits with no blocks
    num_events = len(sink.events)
    assert scheduler.abort(b.seq_id, "shutdown") is b
    assert sink.events[num_events:] == [SeqAbort(0, b.seq_id, "shutdown", "waiting", 8, 0)]
    assert not scheduler.waiting


def test_abort_of_a_middle_chunk_frees_its_blocks(sink):
    scheduler = make_scheduler(sink, max_num_batched_tokens=8, num_kvcache_blocks=8)
    (a,) = make_seqs([20])
    scheduler.add(a)
    step(scheduler)                   # 8 of 20 computed; a holds its 5 blocks and stays waiting
    assert list(scheduler.waiting) == [a] and len(a.block_table) == 5
    scheduler.abort(a.seq_id, "client")
    assert scheduler.block_manager.num_free_blocks == 8 and scheduler.is_finished()


def test_abort_of_an_unknown_or_finished_sequence_is_none(sink):
    scheduler = make_scheduler(sink)
    (a,) = make_seqs([4], max_tokens=1)
    scheduler.add(a)
    step(scheduler)                   # max_tokens=1: finished at its prefill
    num_events = len(sink.events)
    assert scheduler.abort(a.seq_id, "client") is None
    assert scheduler.abort(99, "client") is None
    assert len(sink.events) == num_events


def run_with_aborts(sink):
    """Four requests; s1 is aborted while running, s3 while waiting behind the budget, s2 after the
    last step (as a server shutting down would)."""
    config = make_config(num_kvcache_blocks=16, max_num_batched_tokens=16)
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos), sink)
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    for n in (6, 7):
        engine.add_request(list(range(100 * n, 100 * n + n)), sp)
    engine.step()
    engine.step()
    engine.add_request(list(range(300, 312)), sp)
    engine.abort_request(1, "client")
    engine.add_request(list(range(400, 416)), sp)   # 12 + 16 > 16: waits a step
    engine.step()
    assert engine.abort_request(3, "client") is not None
    engine.step()
    engine.step()
    assert engine.abort_request(2, "shutdown") is not None
    return engine


def test_a_trace_with_aborts_replays_folds_and_counts_them(tmp_path):
    path = tmp_path / "aborts.trace"
    config = make_config(num_kvcache_blocks=16, max_num_batched_tokens=16)
    with TraceWriter(path, make_header(config)) as writer:
        engine = run_with_aborts(writer)
    events = list(open_trace(path))
    aborts = [e for e in events if type(e) is SeqAbort]
    assert [(e.seq_id, e.reason, e.status) for e in aborts] == [(1, "client", "running"), (3, "client", "waiting"),
                                                                 (2, "shutdown", "running")]
    # s1's abort sits between the RequestAdded of s2 and of s3 at step 2: replay injects it there
    at_2 = [type(e).__name__ for e in events if getattr(e, "step", None) == 2][:4]
    assert at_2 == ["RequestAdded", "SeqAbort", "BlockFree", "RequestAdded"]
    result = reexecute(events)
    assert result.ok, result.divergence
    assert result.num_events == len(events) - 1 and result.num_unfinished == 1    # s0 still running

    fold = Fold(events)      # checks each StepEnd's free-block count against the folded pool
    state = fold.state_at(2)
    assert state.seqs[1].finish_reason == "abort" and 1 not in state.running + state.waiting
    state = fold.state_at(fold.num_steps - 1)
    assert state.running == [0, 2] and state.waiting == []          # s2's abort follows the last step
    assert [type(e) for e in fold.events_at(fold.num_steps)] == [SeqAbort, BlockFree]
    live = live_state(engine.scheduler, fold.num_steps)
    assert live.running == [0] and live.num_free_blocks == state.num_free_blocks + len(state.seqs[2].block_table)

    figures = stats(str(path))
    assert figures["requests"]["num_aborted"] == 3
    assert figures["requests"]["num_unfinished"] == 1 and figures["requests"]["num_finished"] == 0


def test_replay_reports_an_abort_of_a_sequence_it_does_not_have():
    import msgspec
    sink = ListSink()
    run_with_aborts(sink)
    config = make_config(num_kvcache_blocks=16, max_num_batched_tokens=16)
    events = [make_header(config), *sink.events]
    i = next(i for i, e in enumerate(events) if type(e) is SeqAbort)
    events[i] = msgspec.structs.replace(events[i], seq_id=7)
    result = reexecute(events)
    assert not result.ok and result.divergence.step == 2
    assert result.divergence.reason == "the replay has no sequence 7 to abort"
