"""The prefill loop's exits, chunked prefill and postprocess, from the seeds."""
import msgspec
import pytest

from tracengine.errors import ConfigError, RequestError
from tracengine.trace.events import AnyEvent, ScheduledSeq, ScheduleDecision, SeqFinish, TokenSample
from tracengine.engine.sequence import SequenceStatus

from helpers import EOS, make_scheduler, make_seqs, step_scheduler as step


def decisions(sink):
    return [e for e in sink.events if isinstance(e, ScheduleDecision)]



def test_seed_worked_example(sink):
    # budget 20; prompts of 25, 8 and 6 tokens
    scheduler = make_scheduler(sink, max_num_batched_tokens=20)
    a, b, c = make_seqs([25, 8, 6])
    for seq in (a, b, c):
        scheduler.add(seq)

    seqs, is_prefill = scheduler.schedule()
    assert is_prefill and seqs == [a]
    assert a.num_scheduled_tokens == 20            # chunk: 20 of 25
    assert list(scheduler.waiting) == [a, b, c]    # a stays at the head of waiting
    assert decisions(sink)[-1].stop_reason == "budget_exhausted"
    scheduler.postprocess(seqs, [7], is_prefill)
    assert a.num_cached_tokens == 20 and a.num_tokens == 25   # middle-chunk sample dropped

    seqs, is_prefill = scheduler.schedule()
    assert is_prefill and seqs == [a, b, c]
    assert [s.num_scheduled_tokens for s in seqs] == [5, 8, 6]   # 25 - 20 = 5, then 15 left: 8 + 6 fit
    assert decisions(sink)[-1].stop_reason == "waiting_empty"
    assert list(scheduler.running) == [a, b, c] and not scheduler.waiting
    scheduler.postprocess(seqs, [7, 7, 7], is_prefill)
    assert [s.num_completion_tokens for s in (a, b, c)] == [1, 1, 1]

    seqs, is_prefill = scheduler.schedule()
    assert not is_prefill and seqs == [a, b, c]
    assert [s.num_scheduled_tokens for s in seqs] == [1, 1, 1]
    assert decisions(sink)[-1].stop_reason == "running_empty"
    samples = [e for e in sink.events if isinstance(e, TokenSample)]
    assert [(e.seq_id, e.kept) for e in samples] == [(0, False), (0, True), (1, True), (2, True)]


def test_chunk_gate_stops_a_second_long_prompt(sink):
    scheduler = make_scheduler(sink, max_num_batched_tokens=20)
    a, b = make_seqs([8, 16])
    scheduler.add(a)
    scheduler.add(b)
    seqs, _ = scheduler.schedule()
    assert seqs == [a]          # 20 - 8 = 12 left < 16: only the first seq may be chunked
    last = decisions(sink)[-1]
    assert last.stop_reason == "chunk_gate" and last.blocked_seq_id == b.seq_id


def test_head_of_line_blocking(sink):
    # 6 blocks of 4 tokens; the head needs 5 blocks, the one behind it only 1
    scheduler = make_scheduler(sink, num_kvcache_blocks=6, max_num_batched_tokens=64)
    running, = make_seqs([8], max_tokens=4)
    scheduler.add(running)
    step(scheduler)                         # running holds 2 blocks: 4 free
    head, small = make_seqs([20, 3], start_id=1, max_tokens=4)
    scheduler.add(head)
    scheduler.add(small)
    seqs, is_prefill = scheduler.schedule()
    assert not is_prefill and seqs == [running]   # the small one would fit but waits behind the head
    last = decisions(sink)[-1]
    assert last.phase == "decode"
    assert last.blocked_seq_id == head.seq_id
    assert last.num_blocks_needed == 5 and last.num_free_blocks == 4


def test_no_free_blocks_stop_reason_in_prefill(sink):
    scheduler = make_scheduler(sink, num_kvcache_blocks=5)
    a, b = make_seqs([12, 12])          # 3 blocks each; 5 blocks: b does not fit
    scheduler.add(a)
    scheduler.add(b)
    seqs, _ = scheduler.schedule()
    assert seqs == [a]
    assert decisions(sink)[-1].stop_reason == "no_free_blocks"


def test_max_num_seqs_exit_in_prefill_and_decode(sink):
    scheduler = make_scheduler(sink, max_num_seqs=2)
    for seq in make_seqs([4, 4, 4]):
        scheduler.add(seq)
    seqs, _ = scheduler.schedule()
    assert [s.seq_id for s in seqs] == [0, 1]
    assert decisions(sink)[-1].stop_reason == "max_num_seqs"
    scheduler.postprocess(seqs, [7, 7], True)
    seqs, _ = scheduler.schedule()
    assert [s.seq_id for s in seqs] == [2]
    scheduler.postprocess(seqs, [7], True)
    seqs, is_prefill = scheduler.schedule()
    assert not is_prefill and [s.seq_id for s in seqs] == [0, 1]
    assert decisions(sink)[-1].stop_reason == "max_num_seqs"
    assert [s.seq_id for s in scheduler.running] == [0, 1, 2]   # the unscheduled one stays behind


def test_finish_on_eos_unless_ignore_eos(sink):
    scheduler = make_scheduler(sink)
    stops, ignores = make_seqs([4])[0], make_seqs([4], ignore_eos=True, start_id=1)[0]
    scheduler.add(stops)
    scheduler.add(ignores)
    step(scheduler, token=EOS)
    assert stops.is_finished and stops.finish_reason == "eos"
    assert not ignores.is_finished
    assert list(scheduler.running) == [ignores]
    finishes = [e for e in sink.events if isinstance(e, SeqFinish)]
    assert [(e.seq_id, e.reason, e.num_completion_tokens) for e in finishes] == [(0, "eos", 1)]


def test_max_tokens_one_finishes_on_its_prefill_step(sink):
    scheduler = make_scheduler(sink)
    seq, = make_seqs([6], max_tokens=1)
    scheduler.add(seq)
    step(scheduler)
    assert seq.is_finished and seq.finish_reason == "length"
    assert scheduler.is_finished()
    assert scheduler.block_manager.num_free_blocks == 64


def test_max_model_len_ends_generation_with_length():
    scheduler = make_scheduler(max_model_len=10)
    seq, = make_seqs([8], max_tokens=50)
    scheduler.add(seq)
    while not scheduler.is_finished():
        step(scheduler)
    assert seq.num_tokens == 10 and seq.finish_reason == "length"


@pytest.mark.parametrize("length, max_tokens, match", [
    (0, 4, "empty prompt"),
    (2000, 4, "longer than max_model_len=1024"),
    (200, 100, "needs 75 KV blocks of 4 tokens; the cache has 64"),   # (200 + 100) / 4 = 75
])
def test_requests_that_can_never_run_are_refused(length, max_tokens, match):
    scheduler = make_scheduler()
    from tracengine.engine.sequence import Sequence
    from tracengine.engine.sampling_params import SamplingParams
    seq = Sequence(0, list(range(length)), 4, SamplingParams(max_tokens=max_tokens))
    with pytest.raises(RequestError, match=match):
        scheduler.add(seq)
    assert not scheduler.waiting


def test_unresolved_block_count_is_a_config_error():
    with pytest.raises(ConfigError, match="num_kvcache_blocks"):
        make_scheduler(num_kvcache_blocks=-1)


def test_status_moves_waiting_running_finished():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    seq, = make_seqs([6], max_tokens=2)
    scheduler.add(seq)
    step(scheduler)
    assert seq.status == SequenceStatus.WAITING      # 4 of 6 prefilled
    step(scheduler)
    assert seq.status == SequenceStatus.RUNNING
    step(scheduler)
    assert seq.status == SequenceStatus.FINISHED


def test_a_misspelt_phase_or_stop_reason_does_not_decode():
    good = ScheduleDecision(0, "prefill", [ScheduledSeq(0, 3, 0)], 3, "waiting_empty")
    encoded = msgspec.msgpack.encode(good)
    assert msgspec.msgpack.decode(encoded, type=AnyEvent) == good
    for typo in (msgspec.structs.replace(good, phase="prefil"), msgspec.structs.replace(good, stop_reason="budget")):
        with pytest.raises(msgspec.ValidationError):
            msgspec.msgpack.decode(msgspec.msgpack.encode(typo), type=AnyEvent)
