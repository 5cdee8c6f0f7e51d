"""The block manager's rules in nano-vllm's own plain form, as a reference for
block_manager.py: a Block object per block, the free blocks in a deque, one hash
and one dictionary lookup at a time, tokens compared block by block. It makes the
same decisions and emits the same events (tests/test_scheduler_properties.py
runs both on random workloads); the engine uses BlockManager, whose pool and
prefix cache do the same in O(1) per block and in batches."""
from collections import deque

from tracengine.engine.block_hasher import compute_hash
from tracengine.engine.sequence import Sequence
from tracengine.engine.hash_id_blocks import hashed_block_events
from tracengine.trace.events import BlockAllocate, BlockAppend, BlockFree
from tracengine.trace.sinks import NULL_SINK, EventSink


class ReferenceBlock:

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []


class ReferenceBlockManager:
    allocates_per_chunk = False      # nano-vllm's block rules (BlockManager's)
    cpu_tier = None                  # no CPU tier, no KV connector: BlockManager's without them
    kv_connector = None

    def __init__(self, num_blocks: int, block_size: int, sink: EventSink = NULL_SINK, enable_caching: bool = True):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.blocks = [ReferenceBlock(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.num_hit_blocks = 0
        self.sink = sink
        self.step = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _take_free_block(self, block_id: int) -> int:
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]     # the cached content is overwritten
        block.hash, block.token_ids, block.ref_count = -1, [], 1
        self.free_block_ids.remove(block_id)
        return block_id

    def _block_hash(self, seq: Sequence, i: int) -> int:
        parent = -1
        for j in range(i + 1):
            parent = compute_hash(seq.block(j), parent)
        return parent

    def cached_block_ids(self, seq: Sequence) -> list[int]:
        block_ids = []
        for i in range(seq.num_blocks - 1 if self.enable_caching else 0):     # never the last block
            block_id = self.hash_to_block_id.get(self._block_hash(seq, i))
            if block_id is None or self.blocks[block_id].token_ids != seq.block(i):
                break
            block_ids.append(block_id)
        return block_ids

    def num_blocks_needed(self, seq: Sequence, hits: list[int]) -> int:
        num_free_hits = sum(1 for block_id in hits if self.blocks[block_id].ref_count == 0)
        return seq.num_blocks - len(hits) + num_free_hits

    def allocate(self, seq: Sequence, hits: list[int]):
        assert not seq.block_table
        num_cached_blocks = len(hits)
        self._take_hits(seq, hits)
        for _ in range(seq.num_blocks - num_cached_blocks):
            seq.block_table.append(self._take_free_block(self.free_block_ids[0]))
        seq.num_cached_tokens = num_cached_blocks * self.block_size
        self.num_hit_blocks += num_cached_blocks
        if self.sink.enabled:
            self.sink.emit(BlockAllocate(self.step, seq.seq_id, list(seq.block_table), num_cached_blocks))

    def _take_hits(self, seq: Sequence, hits: list[int]):
        """seq's block table starts with its hits; a hit that was free leaves the free queue."""
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self.free_block_ids.remove(block_id)
            block.ref_count += 1
            seq.block_table.append(block_id)

    def deallocate(self, seq: Sequence):
        released = seq.block_table[::-1]
        for block_id in released:
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids.append(block_id)
        seq.num_cached_tokens = 0
        seq.block_table = []
        if self.sink.enabled:
            self.sink.emit(BlockFree(self.step, seq.seq_id, released))

    def can_append(self, seq: Sequence) -> bool:
        return len(self.free_block_ids) > 0 or (seq.num_tokens - 1) % self.block_size != 0

    def may_append(self, seq: Sequence):
        if (seq.num_tokens - 1) % self.block_size == 0:
            block_id = self._take_free_block(self.free_block_ids[0])
            seq.block_table.append(block_id)
            if self.sink.enabled:
                self.sink.emit(BlockAppend(self.step, seq.seq_id, block_id))

    def hash_blocks(self, seq: Sequence):
        start = seq.num_cached_tokens // self.block_size
        end = (seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size if self.enable_caching else 0
        for i in range(start, end):
            block = self.blocks[seq.block_table[i]]
            block.hash, block.token_ids = self._block_hash(seq, i), seq.block(i)
            self.hash_to_block_id[block.hash] = block.block_id
        if self.sink.enabled:
            block_ids = seq.block_table[start:end]
            for event in hashed_block_events(self.step, seq, start, block_ids, [self.blocks[b].hash for b in block_ids]):
                self.sink.emit(event)
