"""vLLM 0.33's block rules on tracengine's block pool and prefix cache: the
block manager of the `mixed` policy (block_rules "vllm", docs/policies.md).
Each rule is vLLM's (vllm/v1/core/kv_cache_manager.py, block_pool.py,
single_type_kv_cache_manager.py):

- Slots per chunk. Admission checks that the whole sequence would fit
  (`num_blocks_needed`, vLLM's `full_sequence_must_fit`, on by default as
  `scheduler_reserve_full_isl`) but allocates the prefix-cache hits and the
  slots of the first chunk only (`allocate`); every later chunk or decoded
  token gets its own slots (`allocate_slots`), which refuses, allocating
  nothing, when the free blocks do not cover them.
- Hashes at allocation. The full blocks a chunk computes are registered in
  the prefix cache when its slots are allocated (`cache_blocks` at the end of
  vLLM's `allocate_slots`), before the step runs: a sequence admitted later
  in the same step hits them. Nothing is left to register after the step.
- The first block registered under a hash is the one found (vLLM's
  BlockHashToBlockMap): a block that registers a hash another block holds
  (the same prompt computed twice in one step; the last block, which a hit
  never covers) is found only once every block registered before it was
  handed out again.
- The free queue's order. A sequence's blocks are released tail first; one
  left with no reference goes to the head of the free queue when it holds no
  hash (reused first) and to its tail when it does (evicted last).

Events: BlockAllocate at admission (the hits, then the first chunk's new
blocks), BlockAppend for each block a later chunk or token is given, BlockHash
for each block registered, in the step that allocates it (the last two for a
sink that keeps block events, block_manager.py)."""
from typing import Any

from tracengine.engine.block_manager import BlockManager
from tracengine.engine.block_pool import BlockPool
from tracengine.engine.free_block_queue import FreeKVCacheBlockQueue
from tracengine.engine.hash_id_blocks import hashed_block_events
from tracengine.engine.native import i64, vec
from tracengine.engine.prefix_cache import PrefixCache, VllmPrefixCache
from tracengine.engine.sequence import Sequence
from tracengine.trace.events import BlockAllocate, BlockAppend


class VllmBlockPool(BlockPool):
    """The pool with vLLM's `free_blocks`: `hashes` is the prefix cache's hash per block id."""

    def __init__(self, num_blocks: int, hashes: list[int | None]) -> None:
        super().__init__(num_blocks)
        self.hashes = hashes

    def free_blocks(self, block_ids: list[Any]) -> None:
        release(self.ref_counts, self.hashes, self.free_block_queue, block_ids)

    def copy(self, prefix_cache: Any = None) -> "VllmBlockPool":
        other = VllmBlockPool(0, prefix_cache.hashes)
        self._copy_into(other)
        return other


def release(ref_counts: vec[i64], hashes: list[Any], free_block_queue: FreeKVCacheBlockQueue,
            block_ids: list[Any]) -> None:
    """vLLM's free rule (the pool's, and the replay fold's): a reference less to each of
    `block_ids` (in eviction order, the first evicted first); those left with none go to the
    head of the free queue when they hold no hash, to its tail when they do, each group in
    that order. `hashes` (the prefix cache's, None where a block holds none) is read as objects:
    whether one is None needs no look inside it, where a typed read would check each hash's type,
    a cache miss for a hash made long before. `block_ids` too: a freed block's id goes on as the
    object it is, where a typed id would be boxed anew (a new object per block freed)."""
    evict_first: list[Any] = []
    evict_last: list[Any] = []
    for block in block_ids:
        block_id: i64 = block
        ref_count = ref_counts[block_id] = ref_counts[block_id] - 1
        if ref_count == 0:
            (evict_first if hashes[block_id] is None else evict_last).append(block)
        elif ref_count < 0:
            raise ValueError(f"block {block_id} freed more often than it was taken")
    free_block_queue.prepend_n(evict_first)
    free_block_queue.append_n(evict_last)


class VllmBlockManager(BlockManager):
    allocates_per_chunk = True     # vLLM's allocate_slots: a running sequence's chunk needs slots as a decode does

    @staticmethod
    def new_prefix_cache(num_blocks: int, block_size: int) -> PrefixCache:
        return VllmPrefixCache(num_blocks, block_size)

    @staticmethod
    def new_pool(num_blocks: int, prefix_cache: PrefixCache) -> BlockPool:
        return VllmBlockPool(num_blocks, prefix_cache.hashes)

    def allocate(self, seq: Sequence, hits: list[int], num_new_tokens: int | None = None,
                 delay_cache_blocks: bool = False) -> None:
        """Admission: the `hits` (its `cached_block_ids`, asked in this step with nothing
        allocated or freed since), and slots for the first `num_new_tokens` past the computed
        ones (None: all of them, as a KV transfer installs a prompt, fleet/engine.py); the caller
        checked with `num_blocks_needed` that the whole sequence fits. `delay_cache_blocks`: the
        slots are for blocks a load fills (the CPU tier's), registered when it has ended."""
        assert not seq.block_table
        num_cached_blocks = len(hits)
        self.pool.touch(hits)
        seq.num_cached_tokens = self.num_computed_tokens(seq, num_cached_blocks)
        if self.kv_connector is not None:
            self.kv_connector.allocated(seq.seq_id)
        num_slots = seq.num_tokens if num_new_tokens is None else seq.num_cached_tokens + num_new_tokens
        new_block_ids = self.pool.get_new_blocks(-(-num_slots // self.block_size) - num_cached_blocks)
        self.prefix_cache.evict(new_block_ids)     # their cached content is overwritten
        if self.cpu_tier is not None:
            self.cpu_tier.reuse(new_block_ids)
        seq.block_table = hits + new_block_ids      # a new list
        self.num_hit_blocks += num_cached_blocks
        if self.sink.enabled:
            self.sink.emit(BlockAllocate(self.step, seq.seq_id, list(seq.block_table), num_cached_blocks))
        num_filled = min(num_slots, seq.num_tokens) // self.block_size     # not a padded verify's slots
        if num_filled > num_cached_blocks and not delay_cache_blocks:      # the first chunk fills blocks
            self.cache_blocks(seq, num_cached_blocks, num_filled)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Slots for `num_new_tokens` more tokens of a sequence that holds blocks; False, and
        nothing allocated, when the free blocks do not cover them. Blocks of draft tokens (slots
        past the sequence's tokens) are registered once the drafts are kept (`hash_verified_blocks`):
        only the sequence's tokens are registered here, as vLLM caps what it caches at `request.num_tokens`."""
        size, num_cached_tokens = self.block_size, seq.num_cached_tokens
        num_new_blocks = -(-(num_cached_tokens + num_new_tokens) // size) - len(seq.block_table)
        if num_new_blocks > 0:      # (a decode: 1 in block_size)
            if num_new_blocks > self.pool.num_free_blocks:
                return False
            new_block_ids = self.pool.get_new_blocks(num_new_blocks)
            self.prefix_cache.evict(new_block_ids)
            if self.cpu_tier is not None:
                self.cpu_tier.reuse(new_block_ids)
            seq.block_table += new_block_ids
            if self.emits_block_events:
                for block_id in new_block_ids:
                    self.sink.emit(BlockAppend(self.step, seq.seq_id, block_id))
        num_filled = min(num_cached_tokens + num_new_tokens, seq.num_tokens) // size
        if num_filled > num_cached_tokens // size:      # these slots fill blocks (a decode: 1 in block_size)
            self.cache_blocks(seq, num_cached_tokens // size, num_filled)
        return True

    def cache_blocks(self, seq: Sequence, num_cached_blocks: int, end: int) -> None:
        """Register seq's blocks from `num_cached_blocks` (those before it are registered) up to
        `end`, which its slots fill (the slots of tokens the sequence has: never past them)."""
        if not self.enable_caching:
            return
        size = self.block_size
        hashes = seq.hash_full_blocks()[num_cached_blocks:end]
        block_ids = seq.block_table[num_cached_blocks:end]
        self.prefix_cache.insert(block_ids, hashes,
                                 seq.tokens(num_cached_blocks * size, end * size) if seq.has_tokens else None)
        if self.emits_block_events:
            for event in hashed_block_events(self.step, seq, num_cached_blocks, block_ids, hashes):
                self.sink.emit(event)

    def hash_blocks(self, seq: Sequence) -> None:
        """Nothing: the blocks a step fills were registered when their slots were allocated."""

    def hash_verified_blocks(self, seq: Sequence, num_computed_before: int, num_computed: int) -> None:
        """After a verify step appended its kept tokens: register the full blocks its kept drafts
        filled (vLLM's `cache_blocks(request, num_computed_tokens)` in update_from_output); the
        allocation registered those of the tokens the sequence had (`num_computed_before` + 1)."""
        start = (num_computed_before + 1) // self.block_size
        if num_computed // self.block_size > start:
            self.cache_blocks(seq, start, num_computed // self.block_size)
