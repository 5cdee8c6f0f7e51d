"""Block pool, ref counts and the prefix cache."""
import random
from collections import deque

import pytest
import xxhash

from tracengine.engine.block_hasher import compute_hash, compute_hashes, pack_tokens
from tracengine.engine.block_manager import BlockManager
from tracengine.engine.block_pool import BlockPool
from tracengine.engine.free_block_queue import FreeKVCacheBlockQueue
from tracengine.engine.prefix_cache import PrefixCache
from tracengine.trace.events import BlockAllocate, BlockHash
from tracengine.trace.sinks import ListSink
from tracengine.engine.sequence import Sequence

from helpers import allocate_with_hits, blocks_needed


def seq_of(seq_id, token_ids, block_size=4):
    return Sequence(seq_id, token_ids, block_size)


def fill(manager, seq):
    """Allocate and compute the whole prompt, registering its full blocks."""
    num_cached_blocks, _ = blocks_needed(manager, seq)
    allocate_with_hits(manager, seq, num_cached_blocks)
    seq.num_scheduled_tokens = seq.num_tokens - seq.num_cached_tokens
    manager.hash_blocks(seq)
    seq.num_cached_tokens = seq.num_tokens
    seq.num_scheduled_tokens = 0


def test_hash_layout_is_chained_xxh64_over_little_endian_int64():
    parent = compute_hash([1, 2, 3, 4])
    expected = xxhash.xxh64(parent.to_bytes(8, "little") + b"".join(t.to_bytes(8, "little") for t in [5, 6, 7, 8]))
    assert compute_hash([5, 6, 7, 8], parent) == expected.intdigest()
    assert compute_hash([1, 2, 3, 4]) == xxhash.xxh64(b"".join(t.to_bytes(8, "little") for t in [1, 2, 3, 4])).intdigest()


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_compute_hashes_equals_the_chain_of_compute_hash(block_size):
    rng = random.Random(block_size)
    token_ids = [rng.randrange(-2**40, 2**40) for _ in range(6 * block_size - 1)]   # 5 full blocks and a partial one
    chain, parent = [], -1
    for i in range(5):
        parent = compute_hash(token_ids[i * block_size:(i + 1) * block_size], parent)
        chain.append(parent)
    assert compute_hashes(token_ids, block_size) == chain
    assert compute_hashes(token_ids, block_size, chain[1], start=2 * block_size) == chain[2:]   # resumed mid-chain
    assert compute_hashes(token_ids[:block_size - 1], block_size) == []


def test_free_block_queue_keeps_the_order_of_a_deque():
    """Random popleft/append/remove and their batches (popleft_n, append_n, prepend_n) against
    collections.deque: same order, same length."""
    rng = random.Random(0)
    queue, reference, taken = FreeKVCacheBlockQueue(50), deque(range(50)), []
    for _ in range(4000):
        op = rng.randrange(6)
        if op == 0 and reference:
            assert queue.head() == reference[0]
            taken.append(queue.popleft())
            assert taken[-1] == reference.popleft()
        elif op == 1 and taken:
            block_id = taken.pop(rng.randrange(len(taken)))
            queue.append(block_id)
            reference.append(block_id)
        elif op == 2 and reference:
            block_id = rng.choice(reference)
            queue.remove(block_id)
            taken.append(block_id)
            reference.remove(block_id)
        elif op == 3:                    # popleft_n: as that many poplefts
            n = rng.randrange(len(reference) + 1)
            got = queue.popleft_n(n)
            assert got == [reference.popleft() for _ in range(n)]
            taken += got
        elif op == 4:                    # append_n: as that many appends
            rng.shuffle(taken)
            n = rng.randrange(len(taken) + 1)
            back, taken = taken[:n], taken[n:]
            queue.append_n(back)
            reference.extend(back)
        elif op == 5:                    # prepend_n: at the head, the first handed out first
            n = rng.randrange(len(taken) + 1)
            front, taken = taken[:n], taken[n:]
            queue.prepend_n(front)
            reference.extendleft(reversed(front))
        assert len(queue) == len(reference) and list(queue) == list(reference)
        assert all((b in queue) == (b in reference) for b in range(50))
    assert list(queue.copy()) == list(reference)
    with pytest.raises(ValueError, match="not free"):
        queue.remove(taken[0] if taken else 50)
    with pytest.raises(ValueError, match="not free"):
        queue.remove(-1)
    with pytest.raises(ValueError, match="already free"):
        queue.append(reference[0] if reference else 0)
    with pytest.raises(IndexError):
        queue.popleft_n(len(queue) + 1)


def test_empty_free_block_queue():
    queue = FreeKVCacheBlockQueue(0)
    assert not queue and list(queue) == []
    with pytest.raises(IndexError):
        queue.popleft()


def test_the_pool_counts_references_and_frees_a_block_when_none_is_left():
    pool = BlockPool(6)
    a = pool.get_new_blocks(3)                  # [0, 1, 2]
    # a count for each block handed out so far: the others, never used, have none and cost nothing
    assert a == [0, 1, 2] and list(pool.ref_counts) == [1, 1, 1] and pool.num_free_blocks == 3
    pool.free_blocks(a[::-1])                   # tail first: 2, 1, 0 join the queue in that order
    assert list(pool.free_block_queue) == [3, 4, 5, 2, 1, 0]
    pool.touch([1])                             # a hit on a free block takes it out of the middle
    pool.touch([1])                             # and a second table shares it
    assert pool.ref_counts[1] == 2 and list(pool.free_block_queue) == [3, 4, 5, 2, 0]
    pool.free_blocks([1])
    assert pool.ref_counts[1] == 1 and 1 not in pool.free_block_queue     # still held once
    pool.free_blocks([1])
    assert list(pool.free_block_queue) == [3, 4, 5, 2, 0, 1]
    with pytest.raises(ValueError, match="freed more often"):
        pool.free_blocks([1])


def test_shared_prefix_is_shared_with_ref_counts():
    manager = BlockManager(8, 4)
    a = seq_of(0, list(range(10)))              # blocks [0..3] [4..7] [8 9]
    fill(manager, a)
    b = seq_of(1, list(range(8)) + [50, 51])
    assert blocks_needed(manager, b) == (2, 1)   # two full leading blocks hit
    allocate_with_hits(manager, b, 2)
    assert b.block_table[:2] == a.block_table[:2]
    assert [manager.blocks[i].ref_count for i in a.block_table[:2]] == [2, 2]
    assert b.num_cached_tokens == 8
    manager.deallocate(a)
    assert [manager.blocks[i].ref_count for i in b.block_table[:2]] == [1, 1]


def test_last_block_is_never_matched_so_one_token_is_computed():
    manager = BlockManager(8, 4)
    a = seq_of(0, list(range(8)))
    fill(manager, a)
    same = seq_of(1, list(range(8)))
    assert blocks_needed(manager, same)[0] == 1   # block 1 is full and hashed, but it is the last


def test_freed_blocks_keep_their_hash_until_reused():
    manager = BlockManager(4, 4)
    a = seq_of(0, list(range(9)))
    fill(manager, a)
    manager.deallocate(a)
    assert list(manager.free_block_ids) == [3, 2, 1, 0]   # tail first
    again = seq_of(1, list(range(9)))
    assert blocks_needed(manager, again) == (2, 3)   # both full blocks still cached while free
    allocate_with_hits(manager, again, 2)
    assert again.block_table == [0, 1, 3]
    assert list(manager.free_block_ids) == [2]


def test_reusing_a_block_drops_its_stale_hash():
    manager = BlockManager(2, 4)
    a = seq_of(0, [1, 2, 3, 4, 5])
    fill(manager, a)
    h = manager.blocks[a.block_table[0]].hash
    manager.deallocate(a)
    b = seq_of(1, [9, 9, 9, 9, 9, 9, 9, 9])
    allocate_with_hits(manager, b, blocks_needed(manager, b)[0])
    assert h not in manager.hash_to_block_id


def test_free_cached_blocks_count_against_the_free_pool():
    manager = BlockManager(3, 4)
    a = seq_of(0, list(range(9)))
    fill(manager, a)
    manager.deallocate(a)
    b = seq_of(1, list(range(8)) + [7, 7, 7, 7, 7])   # 4 blocks: more than the pool
    num_cached_blocks, num_new_blocks = blocks_needed(manager, b)
    assert num_cached_blocks == 2 and num_new_blocks == 4 > manager.num_free_blocks


def test_may_append_takes_a_block_only_at_a_boundary_and_events():
    sink = ListSink()
    manager = BlockManager(4, 4, sink)
    a = seq_of(0, [1, 2, 3, 4])
    fill(manager, a)
    a.append_token(5)                           # 5 tokens: the 5th starts block 1
    assert manager.can_append(a)
    manager.may_append(a)
    assert len(a.block_table) == 2
    a.append_token(6)
    manager.may_append(a)
    assert len(a.block_table) == 2
    types = [type(e).__name__ for e in sink.events]
    assert types == ["BlockAllocate", "BlockHash", "BlockAppend"]
    allocate = sink.events[0]
    assert isinstance(allocate, BlockAllocate) and allocate.block_ids == [0]
    assert isinstance(sink.events[1], BlockHash) and sink.events[1].hash == compute_hash([1, 2, 3, 4])


def position_digest(data: bytes) -> int:
    """A digest of a block's position alone (bytes: its parent's digest, then 4 tokens of 8
    bytes): every prompt's block i hashes to i + 1, whatever its tokens."""
    return 1 if len(data) == 32 else int.from_bytes(data[:8], "little") + 1


@pytest.mark.patches_core     # patches xxhash, which the compiled hasher does not call
@pytest.mark.parametrize("colliding", [0, 1, 2])
def test_a_hash_collision_ends_the_hits_at_the_block_whose_tokens_differ(colliding, monkeypatch):
    """A cached block under the prompt's hash but holding other tokens (a collision: here every
    prompt's block i has the same hash) is a miss, and so is every block after it."""
    monkeypatch.setattr(xxhash, "xxh64_intdigest", position_digest)
    manager = BlockManager(16, 4)
    a = seq_of(0, list(range(17)))               # 4 full blocks and a partial one
    fill(manager, a)
    other = list(range(17))
    other[colliding * 4] = 99                    # block `colliding` holds other tokens
    b = seq_of(1, other)
    assert b.block_hashes == a.block_hashes
    assert blocks_needed(manager, b)[0] == colliding
    allocate_with_hits(manager, b, colliding)
    assert b.block_table[:colliding] == a.block_table[:colliding]
    assert not set(b.block_table[colliding:]) & set(a.block_table)


def chain_of(token_ids, block_size, digest):
    """The chained hashes of token_ids' full blocks, one block at a time, under `digest`."""
    hashes, parent = [], -1
    for i in range(len(token_ids) // block_size):
        data = pack_tokens(token_ids[i * block_size:(i + 1) * block_size])
        parent = digest((b"" if parent == -1 else parent.to_bytes(8, "little")) + data)
        hashes.append(parent)
    return hashes


@pytest.mark.patches_core     # patches xxhash, which the compiled hasher does not call
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("colliding", [False, True])
def test_a_sequences_block_hashes_are_the_chain_as_tokens_append(block_size, colliding, monkeypatch):
    """The prompt's full blocks are hashed when the sequence is made, each block filled by a
    decoded token when it is asked for: each hash equals the chain block by block, also
    when the digest collides everywhere (4 values)."""
    real = xxhash.xxh64_intdigest
    digest = (lambda data: real(data) & 3) if colliding else real
    monkeypatch.setattr(xxhash, "xxh64_intdigest", digest)
    rng = random.Random(block_size * 2 + colliding)
    for seq_id in range(60):
        prompt = [rng.randrange(50) for _ in range(rng.randrange(1, 8 * block_size))]
        seq = Sequence(seq_id, prompt, block_size)
        assert seq.block_hashes == chain_of(prompt, block_size, digest)
        for _ in range(rng.choice([0, 1, 2 * block_size + 1])):
            seq.append_token(rng.randrange(50))
            if rng.random() < 0.3:
                assert seq.hash_full_blocks() == chain_of(seq.token_ids, block_size, digest)
        assert seq.hash_full_blocks() == chain_of(seq.token_ids, block_size, digest)


@pytest.mark.parametrize("first_miss", [0, 1, 63, 64, 65, 131, None])
def test_the_hits_end_at_the_first_miss(first_miss):
    """The hits are the cached blocks up to the first one missing, and none after it though
    the blocks after it are still cached (as when that one block alone was reused)."""
    num_blocks = 138
    manager = BlockManager(4 * num_blocks, 1)
    a = seq_of(0, list(range(num_blocks + 1)), block_size=1)
    fill(manager, a)
    if first_miss is not None:      # what reusing that one block does to the prefix cache
        manager.prefix_cache.evict([a.block_table[first_miss]])
    hits = num_blocks if first_miss is None else first_miss
    b = seq_of(1, list(range(num_blocks + 1)), block_size=1)
    assert blocks_needed(manager, b) == (hits, b.num_blocks - hits)
    allocate_with_hits(manager, b, hits)
    assert b.block_table[:hits] == a.block_table[:hits]
    assert not set(b.block_table[hits:]) & set(a.block_table)


def test_a_hash_filled_twice_maps_to_the_later_block():
    """Two sequences with the same prompt prefilled in one step both fill its blocks: the map
    keeps the later one's, as a plain update would, and a third prompt gets those."""
    manager = BlockManager(64, 4)
    prompt = list(range(17))
    a, b = seq_of(0, prompt), seq_of(1, prompt)
    for seq in (a, b):          # both looked up and allocated before either is computed
        allocate_with_hits(manager, seq, blocks_needed(manager, seq)[0])
    assert not set(a.block_table) & set(b.block_table)
    for seq in (a, b):
        seq.num_scheduled_tokens = seq.num_tokens
        manager.hash_blocks(seq)
    assert [manager.hash_to_block_id[h] for h in a.block_hashes] == b.block_table[:4]
    assert [manager.blocks[i].hash for i in a.block_table[:4]] == a.block_hashes      # the earlier keep theirs
    c = seq_of(2, prompt + [5])
    assert blocks_needed(manager, c)[0] == 4
    allocate_with_hits(manager, c, 4)
    assert c.block_table[:4] == b.block_table[:4]


def test_a_sequence_without_tokens_is_matched_on_its_hashes_alone():
    """The hit rule for hash-only lookups (a workload of block hashes): hits up to the first
    miss, no tokens compared; a block registered without tokens does not stop a sequence
    that has them."""
    cache = PrefixCache(8, 2)
    cache.insert([5, 6], [11, 12], [1, 2, 3, 4])       # registered with their tokens
    cache.insert([7], [13])                            # and one without
    assert cache.lookup([11, 12, 13, 14]) == [5, 6, 7]
    assert cache.lookup([11, 12, 13], lambda start, end: [1, 2, 3, 4, 9, 9][start:end]) == [5, 6, 7]
    assert cache.lookup([11, 12, 13], lambda start, end: [1, 2, 3, 9, 9, 9][start:end]) == [5]
    cache.evict([6])
    assert cache.lookup([11, 12, 13]) == [5] and cache.hashes[6] is None


@pytest.mark.patches_core     # patches xxhash, which the compiled hasher does not call
def test_a_hash_that_repeats_within_a_prompt_hits_its_block_twice(monkeypatch):
    """With a digest that collides everywhere and equal tokens, both full blocks of a prompt
    map to one block: the table holds it twice, with two references, and it is freed once."""
    monkeypatch.setattr(xxhash, "xxh64_intdigest", lambda data: 7)
    manager = BlockManager(8, 4)
    a = seq_of(0, [0] * 9)
    fill(manager, a)
    shared = a.block_table[1]                         # the later block registered under 7
    manager.deallocate(a)
    b = seq_of(1, [0] * 9)
    assert blocks_needed(manager, b) == (2, 3)     # 3 - 2 hits + the free hit, counted once per hit
    allocate_with_hits(manager, b, 2)
    assert b.block_table[:2] == [shared, shared] and manager.blocks[shared].ref_count == 2
    manager.deallocate(b)
    assert list(manager.free_block_ids).count(shared) == 1 and manager.num_free_blocks == 8


def test_blocks_never_handed_out_cost_nothing():
    """A pool of 10**12 blocks holds slots for the blocks it has handed out only: the fresh
    ones are one run of the free queue, taken in id order, and a fold that takes one from
    the middle of the run (where the events say) splits it."""
    manager = BlockManager(10**12, 4)
    a, b = seq_of(0, list(range(10))), seq_of(1, list(range(10)) + [7])
    fill(manager, a)
    fill(manager, b)                                   # hits a's two full blocks
    assert a.block_table == [0, 1, 2] and b.block_table == [0, 1, 3] and manager.num_free_blocks == 10**12 - 4
    pool, cache = manager.pool, manager.prefix_cache
    assert len(pool.ref_counts) == len(cache.hashes) == 4 and set(cache.token_ids) == {0, 1}   # the full blocks' tokens
    # the queue's slots: for the blocks handed out and as many again at most, and the sentinel's and the fresh run's
    assert 4 + 2 <= len(pool.free_block_queue.prev) <= 2 * 4 + 2
    manager.deallocate(b)
    manager.deallocate(a)
    assert manager.free_block_ids.head() == 4 and 5 in manager.free_block_ids and 3 in manager.free_block_ids
    queue = FreeKVCacheBlockQueue(10)
    queue.popleft_n(2)
    queue.remove(6)                                    # from the middle of the run
    queue.append_n([0, 6])
    assert list(queue) == [2, 3, 4, 5, 7, 8, 9, 0, 6] and queue.popleft_n(8) == [2, 3, 4, 5, 7, 8, 9, 0]
    queue.remove(6)
    assert list(queue) == [] and len(queue) == 0


def test_pool_applies_a_recorded_allocation_by_its_own_rules():
    """The fold's operations (replay/projection.py): a recorded block must be the one the pool
    hands out next; a copy changes apart from the pool; a vLLM-rules pool's copy reads its cache copy."""
    from tracengine.engine.prefix_cache import VllmPrefixCache
    from tracengine.engine.vllm_block_manager import VllmBlockPool
    pool = BlockPool(4)
    pool.hold_every_block()
    pool.take_next_block(0)
    with pytest.raises(ValueError, match="not the next free block 1"):
        pool.take_next_block(2)
    pool.take_block(3)                     # wherever it is in the free queue
    assert list(pool.ref_counts) == [1, 0, 0, 1] and list(pool.free_block_queue) == [1, 2]
    copy = pool.copy()
    pool.free_blocks([3, 0])
    assert list(pool.free_block_queue) == [1, 2, 3, 0] and list(copy.free_block_queue) == [1, 2]
    assert list(copy.ref_counts) == [1, 0, 0, 1]
    cache = VllmPrefixCache(4, 2)
    cache.hold_every_block()
    vllm_pool = VllmBlockPool(4, cache.hashes)
    vllm_pool.hold_every_block()
    vllm_pool.take_next_block(0)
    vllm_pool.take_next_block(1)
    cache.insert([0, 1], [7, 7])           # the first registered is found, the later kept
    cache_copy = cache.copy()
    pool_copy = vllm_pool.copy(cache_copy)
    cache.evict([0])
    assert cache.hash_to_block_id == {7: 1} and cache_copy.hash_to_block_id == {7: 0}
    assert cache_copy.later_block_ids == {7: [1]} and pool_copy.hashes is cache_copy.hashes
    pool_copy.free_blocks([1, 0])         # both hold a hash: to the tail, in order
    assert list(pool_copy.free_block_queue) == [2, 3, 1, 0]


def test_free_block_queue_grows_past_a_chunk_of_slots():
    """Slots are given to thousands of blocks at once (the arrays grow from a chunk of 4,096 NOT_FREE
    slots, whole and in part): the queue still keeps a deque's order."""
    queue, reference = FreeKVCacheBlockQueue(20_000), deque(range(20_000))
    taken = queue.popleft_n(5_000)
    assert taken == [reference.popleft() for _ in range(5_000)]
    queue.remove(13_000)                              # fresh blocks up to it get slots: 8,001 of them
    reference.remove(13_000)
    queue.append_n(taken[::-1])
    reference.extend(taken[::-1])
    assert list(queue) == list(reference) and len(queue) == len(reference) == 19_999
    assert queue.popleft_n(19_999) == list(reference)
