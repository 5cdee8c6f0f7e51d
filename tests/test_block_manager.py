"""Block pool, ref counts and the prefix cache."""
import random
from collections import deque

import pytest
import xxhash

from tracengine.engine.block_manager import (LOOKUP_RUN, BlockManager, FreeBlockQueue, compute_hash, compute_hashes,
                                            pack_tokens)
from tracengine.trace.events import BlockAllocate, BlockHash, ListSink
from tracengine.trace.encoded import EncodedTokens, encoded_items
from tracengine.engine.sequence import Sequence


def seq_of(seq_id, token_ids, block_size=4):
    return Sequence(seq_id, token_ids, block_size)


def fill(manager, seq):
    """Allocate and compute the whole prompt, registering its full blocks."""
    num_cached_blocks, _ = manager.num_blocks_needed(seq)
    manager.allocate(seq, num_cached_blocks)
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
    """Random popleft/append/remove and the batches that count references (acquire, release)
    against collections.deque: same order, same length."""
    rng = random.Random(0)
    queue, reference, taken = FreeBlockQueue(50), deque(range(50)), []
    ref_counts = [0] * 50      # what acquire and release count; the blocks taken one by one hold 1
    for _ in range(2000):
        op = rng.randrange(7)
        if op == 5 and reference:        # acquire of free blocks: as that many removes
            gone = rng.sample(list(reference), rng.randrange(len(reference) + 1))
            shared = rng.sample(taken, rng.randrange(len(taken) + 1))     # they gain a reference
            order = gone + shared
            rng.shuffle(order)
            queue.acquire(order, ref_counts)
            for block_id in gone:
                reference.remove(block_id)
            assert all(ref_counts[b] == 1 for b in gone) and all(ref_counts[b] == 2 for b in shared)
            queue.release(shared, ref_counts)     # back to one reference: none joins the queue
            assert all(ref_counts[b] == 1 for b in shared)
            taken += gone
        elif op == 3 and reference:        # popleft_many: as that many poplefts
            n = rng.randrange(len(reference) + 1)
            got = queue.popleft_many(n)
            assert got == [reference.popleft() for _ in range(n)]
            for block_id in got:
                ref_counts[block_id] = 1
            taken += got
        elif op == 4 and taken:          # release of blocks held once: as that many appends
            rng.shuffle(taken)
            n = rng.randrange(len(taken) + 1)
            back, taken = taken[:n], taken[n:]
            queue.release(back, ref_counts)
            reference.extend(back)
            assert all(ref_counts[b] == 0 for b in back)
        elif op == 0 and reference:
            assert queue.head() == reference[0]
            taken.append(queue.popleft())
            ref_counts[taken[-1]] = 1
            assert taken[-1] == reference.popleft()
        elif op == 1 and taken:
            block_id = taken.pop(rng.randrange(len(taken)))
            queue.append(block_id)
            ref_counts[block_id] = 0
            reference.append(block_id)
        elif op == 2 and reference:
            block_id = rng.choice(reference)
            queue.remove(block_id)
            ref_counts[block_id] = 1
            taken.append(block_id)
            reference.remove(block_id)
        elif op == 6 and taken:          # a block released twice in one batch: the second refused
            block_id = rng.choice(taken)
            before = list(queue)
            with pytest.raises(ValueError, match="released more often"):
                queue.release([block_id, block_id], ref_counts)
            taken.remove(block_id)
            reference.append(block_id)
            assert list(queue) == before + [block_id] and ref_counts[block_id] == 0
        assert len(queue) == len(reference) and list(queue) == list(reference)
        assert [b for b in range(50) if not ref_counts[b]] == sorted(reference)
    assert list(queue.copy()) == list(reference)
    with pytest.raises(ValueError, match="not free"):
        queue.remove(taken[0] if taken else 50)
    with pytest.raises(ValueError, match="not free"):
        queue.remove(-1)
    with pytest.raises(IndexError):
        queue.popleft_many(len(queue) + 1)
    if reference and taken:     # a block with no reference that is not free: refused, the queue
        before = list(queue)    # whole without those taken before it
        ref_counts[taken[0]] = 0
        with pytest.raises(ValueError, match="not free"):
            queue.acquire([before[0], taken[0]], ref_counts)
        assert list(queue) == before[1:] and len(queue) == len(before) - 1


def test_empty_free_block_queue():
    queue = FreeBlockQueue(0)
    assert not queue and list(queue) == []
    with pytest.raises(IndexError):
        queue.popleft()
    queue = FreeBlockQueue(3, [2, 0])
    assert list(queue) == [2, 0] and 1 not in queue and 2 in queue


def test_shared_prefix_is_shared_with_ref_counts():
    manager = BlockManager(8, 4)
    a = seq_of(0, list(range(10)))              # blocks [0..3] [4..7] [8 9]
    fill(manager, a)
    b = seq_of(1, list(range(8)) + [50, 51])
    assert manager.num_blocks_needed(b) == (2, 1)   # two full leading blocks hit
    manager.allocate(b, 2)
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
    assert manager.num_blocks_needed(same)[0] == 1   # block 1 is full and hashed, but it is the last


def test_freed_blocks_keep_their_hash_until_reused():
    manager = BlockManager(4, 4)
    a = seq_of(0, list(range(9)))
    fill(manager, a)
    manager.deallocate(a)
    assert list(manager.free_block_ids) == [3, 2, 1, 0]   # tail first
    again = seq_of(1, list(range(9)))
    assert manager.num_blocks_needed(again) == (2, 3)   # both full blocks still cached while free
    manager.allocate(again, 2)
    assert again.block_table == [0, 1, 3]
    assert list(manager.free_block_ids) == [2]


def test_reusing_a_block_drops_its_stale_hash():
    manager = BlockManager(2, 4)
    a = seq_of(0, [1, 2, 3, 4, 5])
    fill(manager, a)
    h = manager.blocks[a.block_table[0]].hash
    manager.deallocate(a)
    b = seq_of(1, [9, 9, 9, 9, 9, 9, 9, 9])
    manager.allocate(b, manager.num_blocks_needed(b)[0])
    assert h not in manager.hash_to_block_id


def test_free_cached_blocks_count_against_the_free_pool():
    manager = BlockManager(3, 4)
    a = seq_of(0, list(range(9)))
    fill(manager, a)
    manager.deallocate(a)
    b = seq_of(1, list(range(8)) + [7, 7, 7, 7, 7])   # 4 blocks: more than the pool
    num_cached_blocks, num_new_blocks = manager.num_blocks_needed(b)
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


@pytest.mark.parametrize("colliding", [0, 1, 2])
def test_a_hash_collision_ends_the_hits_at_the_block_whose_tokens_differ(colliding):
    """A cached block under the prompt's hash but holding other tokens (a collision, made
    here by changing what the block holds) is a miss, and so is every block after it."""
    manager = BlockManager(16, 4)
    a = seq_of(0, list(range(17)))               # 4 full blocks and a partial one
    fill(manager, a)
    block = manager.blocks[a.block_table[colliding]]
    block.data = pack_tokens([99, 98, 97, 96])
    assert block.token_ids == [99, 98, 97, 96]
    b = seq_of(1, list(range(17)))
    assert manager.num_blocks_needed(b)[0] == colliding
    manager.allocate(b, colliding)
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


def shared_prefix_prompts(rng, block_size, num_prompts):
    """Prompts that continue, branch from and repeat earlier ones, parting inside blocks and
    at their edges, with the tokens of a few prompts decoded on between prompts."""
    prompts = []
    for _ in range(num_prompts):
        if prompts and rng.random() < 0.8:
            base = rng.choice(prompts)
            cut = rng.choice([len(base), rng.randrange(len(base) + 1),
                              rng.randrange(len(base) // block_size + 1) * block_size])
            prompt = base[:cut] + [rng.randrange(50) for _ in range(rng.choice([0, 1, block_size, 3 * block_size + 2]))]
        else:
            prompt = [rng.randrange(50) for _ in range(rng.randrange(1, 8 * block_size))]
        prompts.append(prompt or [1])
    return prompts


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("colliding", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_hashes_copied_from_earlier_prompts_equal_the_chain(block_size, colliding, packed, monkeypatch):
    """Prompts sharing prefixes with earlier ones copy those hashes instead of hashing: each
    equals the chain block by block, also when the digest collides everywhere (4 values),
    so that equal hashes say nothing of equal tokens, and with a registry of few blocks.
    `packed`: prompts that come packed (EncodedTokens' packed), some hashed only once
    decoded tokens follow them."""
    real = xxhash.xxh64_intdigest
    digest = (lambda data: real(data) & 3) if colliding else real
    monkeypatch.setattr(xxhash, "xxh64_intdigest", digest)
    rng = random.Random(block_size * 2 + colliding + 4 * packed)
    for max_branch_blocks in (None, 3 * block_size):
        manager = BlockManager(64, block_size)
        if max_branch_blocks is not None:
            manager.max_branch_blocks = max_branch_blocks
        for seq_id, prompt in enumerate(shared_prefix_prompts(rng, block_size, 120)):
            # in pieces, with bytes past the prompt's (as a Mooncake prompt's last hash id block)
            pieces = (pack_tokens(prompt[:3]), pack_tokens(prompt[3:] + [7, 7]))
            if packed:
                prompt = EncodedTokens(prompt, (encoded_items(prompt),), pieces)
            seq = Sequence(seq_id, prompt, block_size)
            num_full = len(prompt) // block_size
            # as the scheduler asks: every full block at once (a packed prompt, at times, only
            # after decoded tokens: packed in part)
            if num_full and not (packed and rng.random() < 0.5):
                manager.block_hash(seq, num_full - 1)
            for _ in range(rng.choice([0, 0, 1, 2 * block_size])):    # decoded tokens, hashed as blocks fill
                seq.append_token(rng.randrange(50))
            manager._hashes_upto(seq, seq.num_tokens // block_size)
            assert seq.block_hashes == chain_of(seq.token_ids, block_size, digest)
            assert bytes(seq.block_data) == pack_tokens(seq.token_ids[:len(seq.block_hashes) * block_size])
            assert manager._num_branch_blocks <= manager.max_branch_blocks
        assert len(manager._branches) <= manager.max_branch_blocks


def test_a_packed_prompt_must_hold_the_whole_prompt():
    with pytest.raises(ValueError, match="a packed prompt of 16 bytes for 3 tokens"):
        Sequence(0, EncodedTokens([1, 2, 3], (encoded_items([1, 2, 3]),), [pack_tokens([1, 2])]), 4)


def test_a_conversations_next_turn_hashes_only_where_it_meets_and_leaves_the_last(monkeypatch):
    """Each turn extends the one before: it hashes the block where it meets the earlier turn
    and its own new blocks, and the registry keeps one entry for the conversation."""
    calls = []
    real = xxhash.xxh64_intdigest
    monkeypatch.setattr(xxhash, "xxh64_intdigest", lambda data: calls.append(1) or real(data))
    manager = BlockManager(1024, 4)
    prompt = list(range(40))                     # 10 blocks
    for turn in range(5):
        calls.clear()
        seq = seq_of(turn, prompt)
        manager.block_hash(seq, len(prompt) // 4 - 1)
        assert len(calls) == (10 if turn == 0 else 1 + 3)     # the meeting block and 3 new ones
        assert seq.block_hashes == compute_hashes(prompt, 4)
        prompt = prompt + list(range(100 * turn, 100 * turn + 12))
    assert len(manager._branches) == 1


def test_the_registry_forgets_the_oldest_prompts_past_its_bound():
    manager = BlockManager(8, 4)
    manager.max_branch_blocks = 10
    for seq_id in range(6):
        seq = seq_of(seq_id, [seq_id * 1000 + t for t in range(12)])   # 3 blocks, nothing shared
        manager.block_hash(seq, 2)
        assert manager._num_branch_blocks == min(seq_id + 1, 3) * 3
    manager.block_hash(seq_of(6, list(range(44))), 10)     # more blocks than the bound: not kept
    assert manager._num_branch_blocks == 9 and len(manager._branches) == 3


@pytest.mark.parametrize("first_miss", [0, 1, LOOKUP_RUN - 1, LOOKUP_RUN, LOOKUP_RUN + 1, 2 * LOOKUP_RUN + 3, None])
@pytest.mark.parametrize("identity_hits", [True, False])
def test_the_hits_end_at_the_first_miss_wherever_the_lookup_runs_end(first_miss, identity_hits):
    """The prefix cache is looked up a run of LOOKUP_RUN blocks at a time: the hits are the
    cached blocks up to the first one missing, at a run's edge or inside one, and none after it
    though the blocks after it are still cached (as when that one block alone was reused). The
    same with the hits by hash identity first (`_known_hits`), and with the map alone."""
    num_blocks = 2 * LOOKUP_RUN + 10
    manager = BlockManager(4 * num_blocks, 1)
    manager.identity_hits = identity_hits
    a = seq_of(0, list(range(num_blocks + 1)), block_size=1)
    fill(manager, a)
    if first_miss is not None:      # what reusing that one block does to the prefix cache
        block_id = a.block_table[first_miss]
        del manager.hash_to_block_id[manager.hash_of[block_id]]
        manager.hash_of[block_id] = -1
    hits = num_blocks if first_miss is None else first_miss
    b = seq_of(1, list(range(num_blocks + 1)), block_size=1)
    assert manager.num_blocks_needed(b) == (hits, b.num_blocks - hits)
    manager.allocate(b, hits)
    assert b.block_table[:hits] == a.block_table[:hits]
    assert not set(b.block_table[hits:]) & set(a.block_table)


class CountingMap(dict):
    """A prefix-cache map that counts its lookups."""
    num_gets = 0

    def get(self, key, default=None):
        self.num_gets += 1
        return super().get(key, default)


def test_a_next_turn_takes_the_earlier_turns_blocks_by_hash_identity_without_a_lookup():
    """A conversation's next turn copied the earlier turn's hash objects: the blocks of the earlier
    turn's table that still hold them are hits with no lookup in the map and no token comparison;
    the turn looks up the map from the first block that was reused since."""
    manager = BlockManager(64, 4)
    manager.hash_to_block_id = CountingMap(manager.hash_to_block_id)
    a = seq_of(0, list(range(41)))                   # 10 full blocks
    fill(manager, a)
    manager.deallocate(a)                            # finished: its blocks stay cached, free
    manager.hash_to_block_id.num_gets = 0
    b = seq_of(1, list(range(41)) + [7] * 8)         # 12 full blocks to look for
    assert manager.num_blocks_needed(b)[0] == 10
    assert manager.hash_to_block_id.num_gets == 2    # only those past the earlier turn's
    assert b.peer_blocks[:10] == [manager.hash_to_block_id[h] for h in a.block_hashes]
    manager.allocate(b, 10)
    # block 6 of the two turns reused: the next turn's identity hits end there, the map says it is a miss
    reused = b.block_table[6]
    del manager.hash_to_block_id[manager.hash_of[reused]]
    manager.hash_of[reused] = -1
    manager.hash_to_block_id.num_gets = 0
    c = seq_of(2, list(range(41)) + [7] * 8)
    assert manager.num_blocks_needed(c)[0] == 6
    assert manager.hash_to_block_id.num_gets == 12 - 6


def test_a_hash_filled_twice_maps_to_the_later_block_and_the_earlier_is_no_identity_hit():
    """Two sequences with the same prompt prefilled in one step both fill its blocks: the map
    keeps the later one's, as a plain update would. The earlier blocks still hold the hash's value
    but in an int of their own, so a third prompt that copied the earlier one's hashes gets the
    later one's blocks, as the map gives them."""
    manager = BlockManager(64, 4)
    prompt = list(range(17))
    a, b = seq_of(0, prompt), seq_of(1, prompt)
    for seq in (a, b):          # both looked up and allocated before either is computed
        manager.allocate(seq, manager.num_blocks_needed(seq)[0])
    assert b.peer_blocks is a.block_table and not set(a.block_table) & set(b.block_table)
    for seq in (a, b):
        seq.num_scheduled_tokens = seq.num_tokens
        manager.hash_blocks(seq)
    assert [manager.hash_to_block_id[h] for h in a.block_hashes] == b.block_table[:4]
    assert [manager.hash_of[i] for i in a.block_table[:4]] == a.block_hashes       # the values kept
    assert not any(manager.hash_of[i] is h for i, h in zip(a.block_table, a.block_hashes))
    c = seq_of(2, prompt + [5])
    manager.num_blocks_needed(c)
    c.peer_blocks = a.block_table           # as if it had copied a's hashes
    assert manager.num_blocks_needed(c)[0] == 4
    manager.allocate(c, 4)
    assert c.block_table[:4] == b.block_table[:4]


def test_a_hash_with_no_int_of_its_own_turns_identity_hits_off(monkeypatch):
    """CPython shares one int object for each value up to 256: a block hashed to one is not told
    apart by identity, so the manager takes every hit through the map from then on."""
    real = xxhash.xxh64_intdigest
    monkeypatch.setattr(xxhash, "xxh64_intdigest", lambda data: real(data) & 255)
    manager = BlockManager(64, 4)
    a = seq_of(0, list(range(9)))
    fill(manager, a)
    assert not manager.identity_hits
    b = seq_of(1, list(range(9)))
    assert manager.num_blocks_needed(b)[0] == 2


def test_a_hash_that_collides_inside_one_prompt_leaves_only_the_last_block_an_identity_hit(monkeypatch):
    """Blocks 2, 3 and 4 of one prompt collide, under a hash an earlier block holds already: the
    map ends at block 4, and every earlier holder of the hash, the prompt's own blocks 2 and 3
    among them, keeps it in an int of its own. A prompt copying this one's hashes has its hits by
    identity up to block 2 and then, through the map, a collision there: two hits."""
    values = {5: 2 ** 40 + 1, 6: 2 ** 40 + 2}       # by a block's token: the rest collide
    monkeypatch.setattr(xxhash, "xxh64_intdigest", lambda data: values.get(data[-8], 2 ** 40 + 3))
    manager = BlockManager(64, 1)
    fill(manager, seq_of(0, [7, 1], block_size=1))     # its first block holds the colliding hash
    a = seq_of(1, [5, 6, 7, 8, 9], block_size=1)
    fill(manager, a)
    assert manager.hash_to_block_id[2 ** 40 + 3] == a.block_table[4]
    assert [manager.hash_of[b] is h for b, h in zip(a.block_table, a.block_hashes)] == [True, True, False, False, True]
    b = seq_of(2, [5, 6, 7, 8, 9, 10], block_size=1)
    assert manager.num_blocks_needed(b)[0] == 2
