"""The KV block pool and the prefix-cache map.

Blocks are handed out from the head of a free queue and returned to its
tail, so the least recently freed block is reused first and a freed block
keeps its hash (a prefix-cache hit) until it is handed out again. A hit on a
free block takes it out of the middle of the queue, so the queue is doubly
linked (as vLLM's FreeKVCacheBlockQueue): every operation is O(1), and a
step costs the same with 1,000 blocks as with 100,000."""
import struct

import xxhash

from tracengine.trace.events import NULL_SINK, EventSink, BlockAllocate, BlockAppend, BlockFree, BlockHash
from tracengine.engine.sequence import Sequence


PARENT = struct.Struct("<Q")   # a parent block's digest, as it starts its child's bytes


def compute_hash(token_ids: list[int], prefix: int = -1) -> int:
    """xxh64 over the parent block's digest (8 bytes, little-endian) and the
    block's token ids as little-endian int64: the same bytes on every machine."""
    h = xxhash.xxh64()
    if prefix != -1:
        h.update(PARENT.pack(prefix))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.intdigest()


def compute_hashes(token_ids: list[int], block_size: int, prefix: int = -1, start: int = 0) -> list[int]:
    """The chained hashes of the full blocks of `token_ids[start:]`, each equal to
    `compute_hash(block, parent)`: the tokens are packed once, not per block."""
    num_tokens = (len(token_ids) - start) // block_size * block_size
    if num_tokens <= 0:
        return []
    data = struct.pack(f"<{num_tokens}q", *token_ids[start:start + num_tokens])
    digest, pack_parent, stride = xxhash.xxh64_intdigest, PARENT.pack, block_size * 8
    first = 0
    h = prefix
    if h == -1:          # the first block of a sequence has no parent
        h = digest(data[:stride])
        first = stride
    hashes = [h] if first else []
    hashes += [h := digest(pack_parent(h) + data[i:i + stride]) for i in range(first, num_tokens * 8, stride)]
    return hashes


class FreeBlockQueue:
    """Free block ids in order, doubly linked through two lists indexed by
    block id (slot `num_blocks` is the sentinel that closes the ring), so that
    `popleft`, `append` and `remove` of any free block are O(1). A block not
    in the queue has `prev` -1."""
    __slots__ = ("prev", "next", "num_free", "sentinel")

    def __init__(self, num_blocks: int, block_ids=None):
        sentinel = self.sentinel = num_blocks
        self.prev = [-1] * (num_blocks + 1)
        self.next = [-1] * (num_blocks + 1)
        self.prev[sentinel] = self.next[sentinel] = sentinel
        self.num_free = 0
        if block_ids is None:   # all blocks, in id order
            if num_blocks:
                self.next[:num_blocks] = range(1, num_blocks + 1)    # the last links to the sentinel
                self.prev[1:num_blocks + 1] = range(num_blocks)      # the sentinel's prev is the last
                self.prev[0], self.next[sentinel] = sentinel, 0
            self.num_free = num_blocks
        else:
            for block_id in block_ids:
                self.append(block_id)

    def copy(self) -> "FreeBlockQueue":
        other = FreeBlockQueue.__new__(FreeBlockQueue)
        other.prev, other.next = list(self.prev), list(self.next)
        other.num_free, other.sentinel = self.num_free, self.sentinel
        return other

    def __len__(self) -> int:
        return self.num_free

    def __bool__(self) -> bool:
        return self.num_free > 0

    def __iter__(self):
        nxt, sentinel = self.next, self.sentinel
        block_id = nxt[sentinel]
        while block_id != sentinel:
            yield block_id
            block_id = nxt[block_id]

    def __contains__(self, block_id: int) -> bool:
        return self.prev[block_id] != -1

    def head(self) -> int:
        if not self.num_free:
            raise IndexError("no free block")
        return self.next[self.sentinel]

    def popleft(self) -> int:
        if not self.num_free:
            raise IndexError("no free block")
        prev, nxt, sentinel = self.prev, self.next, self.sentinel
        block_id = nxt[sentinel]
        after = nxt[block_id]
        nxt[sentinel] = after
        prev[after] = sentinel
        prev[block_id] = -1
        self.num_free -= 1
        return block_id

    def append(self, block_id: int):
        prev, nxt, sentinel = self.prev, self.next, self.sentinel
        if prev[block_id] != -1:
            raise ValueError(f"block {block_id} is already free")
        last = prev[sentinel]
        nxt[last] = block_id
        prev[block_id] = last
        nxt[block_id] = sentinel
        prev[sentinel] = block_id
        self.num_free += 1

    def remove(self, block_id: int):
        prev, nxt = self.prev, self.next
        if not 0 <= block_id < self.sentinel or prev[block_id] == -1:
            raise ValueError(f"block {block_id} is not free")
        before = prev[block_id]
        after = nxt[block_id]
        nxt[before] = after
        prev[after] = before
        prev[block_id] = -1
        self.num_free -= 1

    # Batches of the above, for a prompt's hundreds of blocks: the same queue as one call per block.

    def popleft_many(self, n: int) -> list[int]:
        """The first n free blocks, taken out, in order."""
        if n > self.num_free:
            raise IndexError(f"{n} blocks asked, {self.num_free} free")
        prev, nxt, sentinel = self.prev, self.next, self.sentinel
        block_ids = []
        take = block_ids.append
        block_id = nxt[sentinel]
        for _ in range(n):
            take(block_id)
            prev[block_id] = -1
            block_id = nxt[block_id]
        nxt[sentinel] = block_id
        prev[block_id] = sentinel
        self.num_free -= n
        return block_ids

    def extend(self, block_ids: list[int]):
        """Append each of `block_ids`, in order."""
        prev, nxt, sentinel = self.prev, self.next, self.sentinel
        last = prev[sentinel]
        for i, block_id in enumerate(block_ids):
            if prev[block_id] != -1:
                nxt[last] = sentinel       # the queue stays whole, holding those appended so far
                prev[sentinel] = last
                self.num_free += i
                raise ValueError(f"block {block_id} is already free")
            nxt[last] = block_id
            prev[block_id] = last
            last = block_id
        nxt[last] = sentinel
        prev[sentinel] = last
        self.num_free += len(block_ids)


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
        self.free_block_ids = FreeBlockQueue(num_blocks)
        self.used_block_ids: set[int] = set()
        self.num_hit_blocks = 0   # prefix-cache hits, in blocks, over the manager's life
        # The last lookup (seq, version, block ids): allocate reuses it while no block has been
        # handed out or filled since (`_version` counts those changes).
        self._lookup = None
        self._version = 0
        self.sink = sink
        self.step = 0   # stamped on events; the scheduler sets it each step

    @property
    def num_free_blocks(self) -> int:
        return self.free_block_ids.num_free

    def _allocate_block(self) -> int:
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]   # the cached content is overwritten
        block.reset()
        self.used_block_ids.add(block_id)
        return block_id

    def block_hash(self, seq: Sequence, i: int) -> int:
        """The chained hash of full block i, computed once per sequence: a blocked
        waiting head is asked about every step."""
        return self._hashes_upto(seq, i + 1)[i]

    def _cached_block_ids(self, seq: Sequence) -> list[int]:
        """The blocks holding seq's leading full blocks that the prefix cache has, up to
        the first miss. The last block is never matched, so at least one token is computed."""
        num_full = seq.num_blocks - 1
        if num_full <= 0:
            return []
        hashes = self._hashes_upto(seq, num_full)
        get, blocks, token_ids, size = self.hash_to_block_id.get, self.blocks, seq.token_ids, self.block_size
        block_ids = []
        start = 0
        for h in hashes[:num_full]:
            block_id = get(h)
            end = start + size
            if block_id is None or blocks[block_id].token_ids != token_ids[start:end]:
                break    # a miss, or a hash collision (the tokens differ)
            block_ids.append(block_id)
            start = end
        return block_ids

    def _hashes_upto(self, seq: Sequence, n: int) -> list[int]:
        """seq.block_hashes with at least its first n full blocks hashed."""
        hashes = seq.block_hashes
        if len(hashes) < n:   # every full block at once: packing the tokens is the cost
            hashes += compute_hashes(seq.token_ids, self.block_size, hashes[-1] if hashes else -1,
                                     len(hashes) * self.block_size)
        return hashes

    def num_blocks_needed(self, seq: Sequence) -> tuple[int, int]:
        """(cached leading blocks, free blocks needed) for a first allocation."""
        block_ids = self._cached_block_ids(seq)
        used = self.used_block_ids
        # a block shared with a live sequence needs no free block
        num_new_blocks = seq.num_blocks - sum(map(used.__contains__, block_ids))
        self._lookup = (seq, self._version, block_ids)
        return len(block_ids), num_new_blocks

    def allocate(self, seq: Sequence, num_cached_blocks: int):
        assert not seq.block_table
        lookup = self._lookup
        if lookup is not None and lookup[0] is seq and lookup[1] == self._version:
            cached = lookup[2]    # num_blocks_needed just looked them up, and no block changed since
        else:
            cached = self._cached_block_ids(seq)
        assert len(cached) >= num_cached_blocks
        self._lookup = None
        blocks, used, free, table = self.blocks, self.used_block_ids, self.free_block_ids, seq.block_table
        hits = cached[:num_cached_blocks]
        remove, use = free.remove, used.add
        for block_id in hits:
            block = blocks[block_id]
            if block_id in used:
                block.ref_count += 1
            else:
                block.ref_count = 1
                remove(block_id)
                use(block_id)
        # _allocate_block, for all the new blocks at once: a prompt has hundreds
        new_block_ids = free.popleft_many(seq.num_blocks - num_cached_blocks)
        hash_map = self.hash_to_block_id
        for block_id in new_block_ids:
            block = blocks[block_id]
            assert block.ref_count == 0
            if block.hash != -1 and hash_map.get(block.hash) == block_id:
                del hash_map[block.hash]   # the cached content is overwritten
            block.ref_count, block.hash, block.token_ids = 1, -1, []
        used.update(new_block_ids)
        table += hits
        table += new_block_ids
        self._version += 1
        seq.num_cached_tokens = num_cached_blocks * self.block_size
        self.num_hit_blocks += num_cached_blocks
        if self.sink.enabled:
            self.sink.emit(BlockAllocate(self.step, seq.seq_id, list(table), num_cached_blocks))

    def deallocate(self, seq: Sequence):
        released = seq.block_table[::-1]   # tail first, so prefix blocks stay cached longer
        blocks = self.blocks
        freed = []
        for block_id in released:
            block = blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0
            if block.ref_count == 0:
                freed.append(block_id)
        self.used_block_ids.difference_update(freed)
        self.free_block_ids.extend(freed)   # in release order
        seq.num_cached_tokens = 0
        seq.block_table.clear()
        if self.sink.enabled:
            self.sink.emit(BlockFree(self.step, seq.seq_id, released))

    # The newest token is not in the cache yet; it needs a block when it is the first of one.
    # (nano-vllm writes `len % block_size == 1`, which never holds for a block size of 1.)
    def can_append(self, seq: Sequence) -> bool:
        return self.free_block_ids.num_free > 0 or (seq.num_tokens - 1) % self.block_size != 0

    def may_append(self, seq: Sequence):
        if (seq.num_tokens - 1) % self.block_size == 0:
            block_id = self._allocate_block()
            self._version += 1
            seq.block_table.append(block_id)
            if self.sink.enabled:
                self.sink.emit(BlockAppend(self.step, seq.seq_id, block_id))

    def hash_blocks(self, seq: Sequence):
        """Register the blocks this step has just filled."""
        size, num_cached_tokens = self.block_size, seq.num_cached_tokens
        start = num_cached_tokens // size
        end = (num_cached_tokens + seq.num_scheduled_tokens) // size
        if start == end:     # most calls: a decoded token that does not fill its block
            return
        self._version += 1
        hashes = self._hashes_upto(seq, end)
        blocks, table, token_ids, hash_map = self.blocks, seq.block_table, seq.token_ids, self.hash_to_block_id
        emit = self.sink.enabled
        for i in range(start, end):
            h = hashes[i]
            block_id = table[i]
            block = blocks[block_id]
            block.hash, block.token_ids = h, token_ids[i * size:(i + 1) * size]
            hash_map[h] = block_id
            if emit:
                self.sink.emit(BlockHash(self.step, seq.seq_id, block_id, h))
