"""The block manager: a sequence's block table over the KV block pool, with prefix caching.

It reads like nano-vllm's: `cached_block_ids` (the prefix-cache hits, vLLM's
get_computed_blocks), `num_blocks_needed` (nano-vllm's can_allocate, with the count
the record keeps), `allocate` (given those hits, as vLLM's allocate_slots is), `deallocate`, `can_append`, `may_append` and
`hash_blocks`. The block pool (block_pool.py) holds the ref counts and the free
queue; the prefix cache (prefix_cache.py) maps a chained block hash to the block
holding it and states the hit rule. A sequence is seen through its block hashes
(`seq.block_hashes`, request data, block_hasher.py) and, for the collision check,
its tokens where it has them. Every change is an event when the sink is enabled."""
from typing import Any, NamedTuple

from tracengine.engine.block_pool import BlockPool
from tracengine.engine.free_block_queue import FreeKVCacheBlockQueue
from tracengine.engine.prefix_cache import Index, PrefixCache
from tracengine.engine.sequence import Sequence
from tracengine.engine.hash_id_blocks import hashed_block_events
from tracengine.trace.events import BlockAllocate, BlockAppend, BlockFree
from tracengine.trace.sinks import NULL_SINK, EventSink, block_events_kept


class Block(NamedTuple):
    """One block as the manager holds it now (a copy: `BlockManager.blocks`)."""
    block_id: int
    ref_count: int
    hash: int             # of the full block it holds, or -1
    token_ids: list[int]  # those tokens, where known


class BlockManager:
    # nano-vllm's block rules: a prompt's blocks all allocated when it is admitted, a block
    # appended when a decode needs one (VllmBlockManager: slots for each step's tokens)
    allocates_per_chunk = False
    _sink: EventSink
    emits_block_events: bool     # (the sink's setter)

    def __init__(self, num_blocks: int, block_size: int, sink: EventSink = NULL_SINK,
                 enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching     # off: no lookup, no block registered (vLLM's rule)
        self.prefix_cache = self.new_prefix_cache(num_blocks, block_size)
        self.pool = self.new_pool(num_blocks, self.prefix_cache)
        self.prefix_cache.pool_queue = self.pool.free_block_queue
        self.num_hit_blocks = 0   # prefix-cache hits, in blocks, over the manager's life
        self.sink = sink     # (the property below)
        self.step = 0   # stamped on events; the scheduler sets it each step
        # where the KV of a sequence's prompt may come from outside the engine, as vLLM's KV
        # connector reports external computed tokens (a disaggregated fleet's transfers,
        # fleet/kv_transfer.LandedPrompts); None: nowhere
        self.kv_connector: Any = None
        self.cpu_tier: Any = None    # the CPU tier of KV offloading (engine/cpu_tier.py), where the policy has one

    # The prefix cache and the pool of these block rules (the fold of a trace made under them builds
    # its own with these, replay/projection.py)

    @staticmethod
    def new_prefix_cache(num_blocks: int, block_size: int) -> PrefixCache:
        return PrefixCache(num_blocks, block_size)

    @staticmethod
    def new_pool(num_blocks: int, prefix_cache: PrefixCache) -> BlockPool:
        return BlockPool(num_blocks)

    @property
    def sink(self) -> EventSink:
        return self._sink

    @sink.setter
    def sink(self, sink: EventSink) -> None:
        """Where the events go. The block-level ones (a block appended, hashed or freed) are
        built only for a sink that keeps them (`block_events`, trace/sinks.py): a live fold of
        the figures alone needs none (analysis/timeline.FOLD)."""
        self._sink = sink
        self.emits_block_events = sink.enabled and block_events_kept(sink)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def free_block_ids(self) -> FreeKVCacheBlockQueue:
        """The free blocks, the next one handed out first."""
        return self.pool.free_block_queue

    @property
    def ref_counts(self) -> list[int]:
        """Every block's reference count (a copy: the pool's list stops at the blocks handed out)."""
        ref_counts = self.pool.ref_counts
        return list(ref_counts) + [0] * (self.num_blocks - len(ref_counts))

    @property
    def hashes(self) -> list[int]:
        """Every block's hash (-1: none), a copy."""
        return self.prefix_cache.every_hash()

    @property
    def hash_to_block_id(self) -> Index:
        return self.prefix_cache.hash_to_block_id

    @property
    def blocks(self) -> list[Block]:
        held = self.prefix_cache.token_ids
        token_ids = [held.get(block_id) for block_id in range(self.num_blocks)]
        return [Block(block_id, ref_count, h, list(tokens or ()))
                for block_id, (ref_count, h, tokens) in enumerate(zip(self.ref_counts, self.hashes, token_ids))]

    def cached_block_ids(self, seq: Sequence) -> list[int]:
        """The blocks the prefix cache holds for seq's leading full blocks, up to the first
        miss; never its last block, so at least one token is computed."""
        num_full = seq.num_blocks - 1
        if num_full <= 0 or not self.enable_caching:
            return []
        return self.prefix_cache.lookup(seq.hash_full_blocks(), seq.tokens if seq.has_tokens else None, num_full)

    def num_blocks_needed(self, seq: Sequence, hits: list[int]) -> int:
        """Free blocks a first allocation with these `hits` (`cached_block_ids`) takes: a
        cached block that is free still takes a free block; one a live sequence holds does not."""
        ref_counts = self.pool.ref_counts
        num_free_hits = sum(1 for block_id in hits if ref_counts[block_id] == 0)
        return seq.num_blocks - len(hits) + num_free_hits

    def allocate(self, seq: Sequence, hits: list[int]) -> None:
        """The sequence's block table: `hits` (its `cached_block_ids`, asked in this step with
        nothing allocated or freed since), then new blocks for the rest."""
        assert not seq.block_table
        num_cached_blocks = len(hits)
        self.pool.touch(hits)
        new_block_ids = self.pool.get_new_blocks(seq.num_blocks - num_cached_blocks)
        self.prefix_cache.evict(new_block_ids)     # their cached content is overwritten
        seq.block_table = hits + new_block_ids      # a new list
        seq.num_cached_tokens = self.num_computed_tokens(seq, num_cached_blocks)
        if self.kv_connector is not None:
            self.kv_connector.allocated(seq.seq_id)
        self.num_hit_blocks += num_cached_blocks
        if self.sink.enabled:
            self.sink.emit(BlockAllocate(self.step, seq.seq_id, list(seq.block_table), num_cached_blocks))

    def num_computed_tokens(self, seq: Sequence, num_cached_blocks: int) -> int:
        """The tokens of `seq` computed when it is admitted with `num_cached_blocks` hits: the
        hits, or as many more as the KV connector put in place."""
        num_computed = num_cached_blocks * self.block_size
        if self.kv_connector is not None:
            num_computed = self.kv_connector.num_computed_tokens(seq, num_cached_blocks, num_computed)
        return num_computed

    def deallocate(self, seq: Sequence) -> None:
        released = seq.block_table[::-1]   # tail first, so prefix blocks stay cached longer
        self.pool.free_blocks(released)
        seq.num_cached_tokens = 0
        seq.block_table = []
        if self.emits_block_events:
            self.sink.emit(BlockFree(self.step, seq.seq_id, released))

    # The newest token is not in the cache yet; it needs a block when it is the first of one.
    # (nano-vllm writes `len % block_size == 1`, which never holds for a block size of 1.)
    def can_append(self, seq: Sequence) -> bool:
        return self.pool.num_free_blocks > 0 or (seq.num_tokens - 1) % self.block_size != 0

    def may_append(self, seq: Sequence) -> None:
        if (seq.num_tokens - 1) % self.block_size == 0:
            self.append_blocks(seq, 1)

    def append_blocks(self, seq: Sequence, num_new_blocks: int) -> None:
        """`num_new_blocks` more blocks at the end of seq's table (the caller checked they are free)."""
        new_block_ids = self.pool.get_new_blocks(num_new_blocks)
        self.prefix_cache.evict(new_block_ids)
        seq.block_table += new_block_ids
        if self.emits_block_events:
            for block_id in new_block_ids:
                self.sink.emit(BlockAppend(self.step, seq.seq_id, block_id))

    def hash_blocks(self, seq: Sequence) -> None:
        """Register the full blocks this step computes (`num_scheduled_tokens` past the cached ones)."""
        self.hash_computed_blocks(seq, seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens)

    def hash_verified_blocks(self, seq: Sequence, num_computed_before: int, num_computed: int) -> None:
        """After a verify step appended its kept tokens: register the full blocks of the tokens
        computed, `num_computed` (the rejected drafts rolled back), past `num_computed_before`."""
        self.hash_computed_blocks(seq, num_computed_before, num_computed)

    def hash_computed_blocks(self, seq: Sequence, num_computed_before: int, num_computed: int) -> None:
        size = self.block_size
        start = num_computed_before // size
        end = num_computed // size
        if start == end or not self.enable_caching:     # a decoded token that does not fill its block
            return
        hashes = seq.hash_full_blocks()[start:end]
        block_ids = seq.block_table[start:end]
        self.prefix_cache.insert(block_ids, hashes, seq.tokens(start * size, end * size) if seq.has_tokens else None)
        if self.emits_block_events:
            for event in hashed_block_events(self.step, seq, start, block_ids, hashes):
                self.sink.emit(event)
