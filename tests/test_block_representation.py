"""The block modules' representation for speed decides as the plain form did: a run of
consecutive token ids packed as one number, a prompt looked up a run of blocks at a time,
tokens kept only for blocks registered with them."""
import struct

import pytest

from tracengine.engine.block_hasher import compute_hashes, pack_range, pack_tokens
from tracengine.engine.prefix_cache import PrefixCache
from tracengine.engine.prefix_cache import VllmPrefixCache


@pytest.mark.parametrize("first,n", [(0, 0), (0, 1), (5, 16), (1 << 40, 512), (2**63 - 512, 512), (2**63 - 1, 1)])
def test_a_run_of_token_ids_packs_to_the_int64s_struct_packs(first, n):
    expected = struct.pack(f"<{n}q", *range(first, first + n))
    assert pack_range(first, n) == pack_tokens(range(first, first + n)) == expected


def test_a_range_that_is_not_a_run_of_non_negative_ids_packs_as_any_tokens():
    for tokens in (range(-3, 5), range(0, 20, 2), range(2**63 - 2, 2**63 - 1)):
        assert pack_tokens(tokens) == struct.pack(f"<{len(tokens)}q", *tokens)
    assert compute_hashes(range(100, 164), 16) == compute_hashes(list(range(100, 164)), 16)


@pytest.mark.parametrize("cache_class", [PrefixCache, VllmPrefixCache])
@pytest.mark.parametrize("num_hits", [0, 1, 63, 64, 65, 192])
def test_a_lookup_ends_at_the_first_miss_wherever_it_falls(cache_class, num_hits):
    cache = cache_class(10_000, 4)
    hashes = list(range(1000, 1000 + 256))
    registered = [h for i, h in enumerate(hashes) if i != num_hits]      # every block but one
    cache.insert(list(range(len(registered))), registered)
    expected = list(range(num_hits))
    assert cache.lookup(hashes) == expected
    assert cache.lookup(hashes[:num_hits]) == expected
    for limit in (0, 1, num_hits, num_hits + 5, 10_000):     # the first `limit` blocks only, none copied
        assert cache.lookup(hashes, None, limit) == expected[:limit]


def test_tokens_are_kept_for_the_blocks_registered_with_them_and_forgotten_when_evicted():
    cache = PrefixCache(100, 2)
    cache.insert([3, 4], [11, 12], [1, 2, 3, 4])
    cache.insert([7], [13])                                             # a hash-id prompt's: none
    assert cache.token_ids == {3: [1, 2], 4: [3, 4]}
    assert cache.lookup([11, 12], lambda start, end: [1, 2, 3, 9][start:end]) == [3]     # the second differs
    cache.evict([4, 7])
    assert cache.token_ids == {3: [1, 2]} and cache.lookup([11, 12, 13]) == [3]


def setdefault_registry(runs):
    """vLLM's BlockHashToBlockMap as a block at a time: the first block registered under a hash is
    found, the others wait in order."""
    index, later = {}, {}
    for block_ids, block_hashes in runs:
        for block_id, h in zip(block_ids, block_hashes):
            if index.setdefault(h, block_id) != block_id:
                later.setdefault(h, []).append(block_id)
    return index, later


@pytest.mark.parametrize("runs", [
    [([0, 1, 2], [10, 11, 12])],
    [([0, 1, 2, 3], [10, 11, 10, 10])],                       # a hash given twice in one run
    [([0, 1], [10, 11]), ([2, 3, 4], [12, 11, 13])],          # one a block already holds
    [([0, 1], [10, 11]), ([2, 3, 4, 5], [11, 12, 12, 10])],   # both
])
def test_a_run_registers_as_its_blocks_one_at_a_time_would(runs):
    cache = VllmPrefixCache(100, 4)
    for block_ids, block_hashes in runs:
        cache.insert(block_ids, block_hashes)
    assert (cache.hash_to_block_id, cache.later_block_ids) == setdefault_registry(runs)
