"""Decode preemption by recomputation: the running tail, then itself."""
from tracengine.trace.events import BlockFree, Preempt

from helpers import make_scheduler, make_seqs, step_scheduler as run_step



def test_running_tail_is_preempted_and_goes_to_head_of_waiting(sink):
    # 4 blocks of 4 tokens; two prompts of 8 tokens fill them (2 blocks each)
    scheduler = make_scheduler(sink, num_kvcache_blocks=4)
    a, b = make_seqs([8, 8], max_tokens=4)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)             # prefill both; each gets its first token: 9 tokens, needs a 3rd block
    seqs, is_prefill = scheduler.schedule()
    assert not is_prefill and seqs == [a]        # a needed a block; b (the tail) gave its 2 up
    assert list(scheduler.waiting) == [b] and b.block_table == [] and b.num_cached_tokens == 0
    assert b.num_preemptions == 1
    preempt, = [e for e in sink.events if isinstance(e, Preempt)]
    assert (preempt.seq_id, preempt.by_seq_id) == (b.seq_id, a.seq_id)
    assert preempt.num_computed_tokens == 8
    assert [e for e in sink.events if isinstance(e, BlockFree)][-1].seq_id == b.seq_id


def test_self_preemption_when_the_rest_of_running_is_already_scheduled(sink):
    # 5 blocks of 4 tokens; a and b hold 2 each, 1 is free
    scheduler = make_scheduler(sink, num_kvcache_blocks=5)
    a, b = make_seqs([8, 8], max_tokens=4)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)             # both now hold 9 tokens: each needs a 3rd block to decode
    seqs, is_prefill = scheduler.schedule()
    # a takes the last free block; b finds running empty (a was popped) and preempts itself
    assert not is_prefill and seqs == [a]
    preempt, = [e for e in sink.events if isinstance(e, Preempt)]
    assert preempt.seq_id == preempt.by_seq_id == b.seq_id
    assert list(scheduler.running) == [a] and list(scheduler.waiting) == [b]
    assert b.block_table == [] and b.num_preemptions == 1
    scheduler.postprocess(seqs, [7], is_prefill)
    # b (9 tokens, 3 blocks) is back at the head of waiting: 2 free blocks, it must wait
    seqs, is_prefill = scheduler.schedule()
    assert not is_prefill and seqs == [a]


def test_preempted_sequence_recomputes_and_hits_the_prefix_cache(sink):
    scheduler = make_scheduler(sink, num_kvcache_blocks=4)
    a, b = make_seqs([8, 8], max_tokens=2)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)             # both prefilled; both blocks of each hashed
    run_step(scheduler)             # b preempted by a; a finishes (2 tokens), frees its blocks
    assert a.is_finished and list(scheduler.waiting) == [b]
    seqs, is_prefill = scheduler.schedule()
    assert is_prefill and seqs == [b]
    # b has 9 tokens: 3 blocks; its first 2 are still hashed in the free list
    # a's decode block was b's freed tail block (3), so only b's first block (2) is still cached
    assert b.num_cached_tokens == 4 and b.num_scheduled_tokens == 5   # 9 - 4 = 5
