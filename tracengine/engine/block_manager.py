"""The KV block pool and the prefix-cache map.

Blocks are handed out from the left of a free deque and returned to its
right, so the least recently freed block is reused first and a freed block
keeps its hash (a prefix-cache hit) until it is handed out again."""
from collections import deque

import struct

import xxhash

from tracengine.trace.events import NULL_SINK, EventSink, BlockAllocate, BlockAppend, BlockFree, BlockHash
from tracengine.engine.sequence import Sequence


def compute_hash(token_ids: list[int], prefix: int = -1) -> int:
    """xxh64 over the parent block's digest (8 bytes, little-endian) and the
    block's token ids as little-endian int64: the same bytes on every machine."""
    h = xxhash.xxh64()
    if prefix != -1:
        h.update(prefix.to_bytes(8, "little"))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.intdigest()


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []

    def update(self, hash: int, token_ids: list[int]):
        self.hash = hash
        self.token_ids = token_ids

    def reset(self):
        self.ref_count = 1
        self.hash = -1
        self.token_ids = []


class BlockManager:

    def __init__(self, num_blocks: int, block_size: int, sink: EventSink = NULL_SINK):
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()
        self.num_hit_blocks = 0   # prefix-cache hits, in blocks, over the manager's life
        self.sink = sink
        self.step = 0   # stamped on events; the scheduler sets it each step

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def _allocate_block(self) -> int:
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]   # the cached content is overwritten
        block.reset()
        self.used_block_ids.add(block_id)
        return block_id

    def _deallocate_block(self, block_id: int):
        assert self.blocks[block_id].ref_count == 0
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    def block_hash(self, seq: Sequence, i: int) -> int:
        """The chained hash of full block i, computed once per sequence: a blocked
        waiting head is asked about every step."""
        hashes = seq.block_hashes
        while len(hashes) <= i:
            j = len(hashes)
            hashes.append(compute_hash(seq.block(j), hashes[j - 1] if j else -1))
        return hashes[i]

    def _cached_block_id(self, seq: Sequence, i: int) -> int | None:
        """The block holding full block i of seq, if the prefix cache has it."""
        block_id = self.hash_to_block_id.get(self.block_hash(seq, i))
        if block_id is None or self.blocks[block_id].token_ids != seq.block(i):  # collision guard
            return None
        return block_id

    def num_blocks_needed(self, seq: Sequence) -> tuple[int, int]:
        """(cached leading blocks, free blocks needed) for a first allocation.
        The last block is never matched, so at least one token is computed."""
        num_cached_blocks = 0
        num_new_blocks = seq.num_blocks
        for i in range(seq.num_blocks - 1):
            block_id = self._cached_block_id(seq, i)
            if block_id is None:
                break
            num_cached_blocks += 1
            if block_id in self.used_block_ids:
                num_new_blocks -= 1     # shared with a live sequence: no free block needed
        return num_cached_blocks, num_new_blocks

    def allocate(self, seq: Sequence, num_cached_blocks: int):
        assert not seq.block_table
        for i in range(num_cached_blocks):
            block_id = self._cached_block_id(seq, i)
            assert block_id is not None
            block = self.blocks[block_id]
            if block_id in self.used_block_ids:
                block.ref_count += 1
            else:
                block.ref_count = 1
                self.free_block_ids.remove(block_id)
                self.used_block_ids.add(block_id)
            seq.block_table.append(block_id)
        for _ in range(num_cached_blocks, seq.num_blocks):
            seq.block_table.append(self._allocate_block())
        seq.num_cached_tokens = num_cached_blocks * self.block_size
        self.num_hit_blocks += num_cached_blocks
        if self.sink.enabled:
            self.sink.emit(BlockAllocate(self.step, seq.seq_id, list(seq.block_table), num_cached_blocks))

    def deallocate(self, seq: Sequence):
        released = seq.block_table[::-1]   # tail first, so prefix blocks stay cached longer
        for block_id in released:
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0
            if block.ref_count == 0:
                self._deallocate_block(block_id)
        seq.num_cached_tokens = 0
        seq.block_table.clear()
        if self.sink.enabled:
            self.sink.emit(BlockFree(self.step, seq.seq_id, released))

    # The newest token is not in the cache yet; it needs a block when it is the first of one.
    # (nano-vllm writes `len % block_size == 1`, which never holds for a block size of 1.)
    def can_append(self, seq: Sequence) -> bool:
        return bool(self.free_block_ids) or (seq.num_tokens - 1) % self.block_size != 0

    def may_append(self, seq: Sequence):
        if (seq.num_tokens - 1) % self.block_size == 0:
            block_id = self._allocate_block()
            seq.block_table.append(block_id)
            if self.sink.enabled:
                self.sink.emit(BlockAppend(self.step, seq.seq_id, block_id))

    def hash_blocks(self, seq: Sequence):
        """Register the blocks this step has just filled."""
        start = seq.num_cached_tokens // self.block_size
        end = (seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size
        if start == end:
            return
        for i in range(start, end):
            h = self.block_hash(seq, i)
            block_id = seq.block_table[i]
            self.blocks[block_id].update(h, seq.block(i))
            self.hash_to_block_id[h] = block_id
            if self.sink.enabled:
                self.sink.emit(BlockHash(self.step, seq.seq_id, block_id, h))
