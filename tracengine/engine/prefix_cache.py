# cython: boundscheck=True, wraparound=True
"""The prefix cache: which block holds the KV of a chain of full blocks, by the chain's hash.

A full block is registered under its hash once its tokens are computed; the entry
stays while the block is free, and goes when the block is handed out again (its
content is overwritten). A hash registered twice (two sequences with the same
prefix computed in one step) maps to the later block, as a plain update does; the
earlier block keeps its hash but is found no more.

The hit rule (`lookup`): a sequence's leading full blocks, up to the first one the
cache misses; never its last block, so at least one token is computed. A hash
collision is guarded by comparing tokens where both sides have them: a block
registered with its tokens is a hit only for a sequence whose tokens for that
block are the same. A sequence that carries block hashes and no tokens (a hash-id
workload) is matched on its hashes alone, as vLLM matches every request.

`VllmPrefixCache` is the cache with vLLM's rule for a hash two blocks hold: the first one
registered is found (the `mixed` policy's, vllm_block_manager.py).

In the compiled core (tracengine/compiled.py) Cython compiles this module, its classes typed in
the .pxd beside it: a hash or block id is passed from list to dict to list as the object it is,
where mypyc's integers would be taken out of each object and put into a new one at each store."""
from collections.abc import Callable
from itertools import chain, repeat
from typing import Final, cast

from tracengine.engine.block_index import BlockIndex
from tracengine.engine.free_block_queue import FreeKVCacheBlockQueue
from tracengine.engine.native import new_block_index

NO_HASH: Final = -1     # a block's hash where it holds none, in a view of every block's (`every_hash`)
WARM_FIRST: Final = 8       # the slots a lookup reads ahead at first (the table's `warm`)
Tokens = Callable[[int, int], list[int]]     # a sequence's token ids in [start, end) (Sequence.tokens)
Index = BlockIndex | dict[int, int]          # hash -> block id: engine/native.new_block_index's


class PrefixCache:

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_to_block_id: Index = new_block_index()
        # per block id, up to the highest one given so far (a block past it holds nothing: the
        # pool has not handed it out, block_pool.py): the hash of the full block it holds, None
        # where it holds none (told apart without reading a hash: the pool's free rule asks it
        # of each block it takes back, whose hash was made long before)
        self.hashes: list[int | None] = []
        # the tokens of each block registered with them, by block id: a hash-id prompt's blocks
        # have none, and cost nothing here
        self.token_ids: dict[int, list[int]] = {}
        # the free queue of the pool whose blocks these are, where a block manager says so: every
        # block it registers or evicts has been handed out, so `hashes` covers them once it
        # reaches the queue's `fresh`, known without looking at the blocks' ids
        self.pool_queue: FreeKVCacheBlockQueue | None = None

    def copy(self) -> "PrefixCache":
        """An independent copy (a fold's keyframe)."""
        return self._copy_into(PrefixCache(self.num_blocks, self.block_size))

    def _copy_into(self, other: "PrefixCache") -> "PrefixCache":
        other.hash_to_block_id, other.hashes = self.hash_to_block_id.copy(), list(self.hashes)
        other.token_ids = dict(self.token_ids)     # each block's tokens: replaced, never changed in place
        return other

    def every_hash(self) -> list[int]:
        """Every block's hash, NO_HASH where it holds none (a copy: a state's view of the blocks)."""
        hashes = [NO_HASH if h is None else h for h in self.hashes]
        return hashes + [NO_HASH] * (self.num_blocks - len(hashes))

    def hold_every_block(self) -> None:
        """A hash slot for every block now (a fold shows every block)."""
        self._slots_up_to(self.num_blocks)

    def _cover(self, block_ids: list[int]) -> None:
        """Slots for `block_ids` in `hashes`; none to look for once every block has one."""
        if len(self.hashes) < self.num_blocks:
            queue = self.pool_queue
            self._slots_up_to(queue.fresh if queue is not None else max(block_ids, default=-1) + 1)

    def _evicting(self, block_ids: list[int]) -> None:
        """What an evict does first, under either rule: slots for `block_ids`, and the table's
        slots for the hashes they hold read ahead (the Python core's dict reads nothing ahead)."""
        self._cover(block_ids)
        index = self.hash_to_block_id
        if not isinstance(index, dict):
            index.warm_blocks(self.hashes, block_ids)

    def _slots_up_to(self, end: int) -> None:
        """Slots in `hashes` for the blocks below `end` (extended in place: the pool shares it)."""
        if end > len(self.hashes):
            self.hashes += repeat(None, end - len(self.hashes))

    def _hold_tokens(self, block_ids: list[int], token_ids: list[int] | None) -> None:
        """Keep the tokens of `block_ids` (theirs end to end in `token_ids`), or forget any they
        held (`token_ids` None)."""
        held, size = self.token_ids, self.block_size
        if token_ids is not None:
            for i, block_id in enumerate(block_ids):
                held[block_id] = token_ids[i * size:(i + 1) * size]
        elif held:
            for block_id in block_ids:
                held.pop(block_id, None)

    def lookup(self, block_hashes: list[int], tokens: Tokens | None = None, limit: int = -1) -> list[int]:
        """The blocks holding the leading blocks of `block_hashes` (its first `limit`, where
        given), up to the first miss. `tokens(start, end)`: the sequence's token ids in
        [start, end), where it has them."""
        index = self.hash_to_block_id
        block_ids: list[int] = []
        # up to the first miss: a long prompt's blocks past it are not looked up (nor copied)
        num_hashes = len(block_hashes) if limit < 0 else min(limit, len(block_hashes))
        warmed = 0
        for i in range(num_hashes):
            if i == warmed and not isinstance(index, dict):    # the next hashes' slots, twice as many each time
                warmed = min(num_hashes, 2 * i + WARM_FIRST)
                index.warm(block_hashes, i, warmed)
            block_id = index.get(block_hashes[i])
            if block_id is None:
                break
            block_ids.append(block_id)
        if tokens is not None and block_ids:
            del block_ids[self._num_same_tokens(block_ids, tokens(0, len(block_ids) * self.block_size)):]
        return block_ids

    def _num_same_tokens(self, block_ids: list[int], token_ids: list[int]) -> int:
        """How many of the leading `block_ids` hold what `token_ids` holds (a block with no
        tokens recorded counts as the same): all of them compared at once, then one by one
        where they differ."""
        size, held = self.block_size, self.token_ids
        cached: list[list[int] | None] = [held.get(block_id) for block_id in block_ids]
        if None not in cached and list(chain.from_iterable(cast(list[list[int]], cached))) == token_ids:
            return len(block_ids)
        for i, tokens in enumerate(cached):
            if tokens is not None and tokens != token_ids[i * size:(i + 1) * size]:
                return i
        return len(block_ids)

    def insert(self, block_ids: list[int], block_hashes: list[int], token_ids: list[int] | None = None) -> None:
        """Register each of `block_ids` (just filled) under its hash in `block_hashes`, with its
        tokens when `token_ids` gives them (the blocks' tokens, end to end)."""
        self._cover(block_ids)
        hashes = self.hashes
        for block_id, h in zip(block_ids, block_hashes):
            hashes[block_id] = h
        self._hold_tokens(block_ids, token_ids)
        self.hash_to_block_id.update(zip(block_hashes, block_ids))    # a hash given twice: the later block

    def evict(self, block_ids: list[int]) -> None:
        """Forget what `block_ids` held: they are handed out to be overwritten."""
        self._evicting(block_ids)
        hashes, index = self.hashes, self.hash_to_block_id
        for block_id in block_ids:
            h = hashes[block_id]
            if h is not None:
                if index.get(h) == block_id:
                    del index[h]
                hashes[block_id] = None
        self._hold_tokens(block_ids, None)


class VllmPrefixCache(PrefixCache):
    """The prefix cache with vLLM's rule for a hash two blocks hold: the first registered is
    found; `later_block_ids` keeps the others, in order, for when it is handed out."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.later_block_ids: dict[int, list[int]] = {}

    def insert(self, block_ids: list[int], block_hashes: list[int], token_ids: list[int] | None = None) -> None:
        self._cover(block_ids)
        hashes, index = self.hashes, self.hash_to_block_id
        if not isinstance(index, dict):
            index.warm(block_hashes, 0, min(len(block_ids), len(block_hashes)))
        for block_id, h in zip(block_ids, block_hashes):
            hashes[block_id] = h
            if index.setdefault(h, block_id) != block_id:
                self.later_block_ids.setdefault(h, []).append(block_id)
        self._hold_tokens(block_ids, token_ids)

    def copy(self) -> "VllmPrefixCache":
        other = VllmPrefixCache(self.num_blocks, self.block_size)
        self._copy_into(other)
        other.later_block_ids = {h: list(ids) for h, ids in self.later_block_ids.items()}
        return other

    def evict(self, block_ids: list[int]) -> None:
        self._evicting(block_ids)
        hashes, index, later = self.hashes, self.hash_to_block_id, self.later_block_ids
        for block_id in block_ids:
            h = hashes[block_id]
            if h is None:
                continue
            if later and h in later:      # another block holds it too (rare: `later` is most often empty)
                unregister(index, later, h, block_id)
            else:               # the one block registered under it: the one found
                del index[h]
            hashes[block_id] = None
        self._hold_tokens(block_ids, None)


def unregister(hash_to_block_id: Index, later_block_ids: dict[int, list[int]], h: int,
               block_id: int) -> None:
    """`block_id` no longer holds hash `h`: when it was the block found, the next registered
    under `h` is found from now on, if any (vLLM's BlockHashToBlockMap)."""
    others = later_block_ids.get(h)
    if hash_to_block_id[h] == block_id:
        if others:
            hash_to_block_id[h] = others.pop(0)
        else:
            del hash_to_block_id[h]
    else:
        assert others is not None      # a block found under h or one registered after it
        others.remove(block_id)
    if others == []:
        del later_block_ids[h]
