"""The KV block pool and the prefix-cache map.

Blocks are handed out from the head of a free queue and returned to its
tail, so the least recently freed block is reused first and a freed block
keeps its hash (a prefix-cache hit) until it is handed out again. A hit on a
free block takes it out of the middle of the queue, so the queue is doubly
linked (as vLLM's FreeKVCacheBlockQueue): every operation is O(1), and a
step costs the same with 1,000 blocks as with 100,000.

A block's hash chains over the blocks before it (compute_hash), so a prompt
that repeats an earlier sequence's first blocks has that sequence's hashes
for them: a bounded registry of earlier sequences (`_hash_new_blocks`) lets a
conversation's next turn copy them, found by comparing bytes, and hash only
where it meets that sequence and where it parts from it. The values are the
chain's either way.

The hashes copied are the earlier sequence's own int objects, so the blocks of
its table that still hold those very objects are prefix-cache hits found
without a lookup (`_known_hits`): the next turn of a conversation reads its
hundreds of hits off the last turn's table."""
import struct
from collections import OrderedDict
from itertools import compress, count, islice
from operator import countOf, is_not

import xxhash

from tracengine.trace.events import NULL_SINK, EventSink, BlockAllocate, BlockAppend, BlockFree, BlockHash
from tracengine.engine.sequence import Sequence


PARENT = struct.Struct("<Q")   # a parent block's digest, as it starts its child's bytes
LOOKUP_RUN = 64     # blocks looked up in the prefix cache at a time
SMALL_INT_MAX = 256     # CPython keeps one shared int object for each of -5 to 256
# Whether two ints made apart are two objects, as CPython's are (past SMALL_INT_MAX); an
# interpreter whose `is` compares ints by value (PyPy) gets no hits by identity (_known_hits).
DISTINCT_INTS = int("1099511627776") is not int("1099511627776")


def compute_hash(token_ids: list[int], prefix: int = -1) -> int:
    """xxh64 over the parent block's digest (8 bytes, little-endian) and the
    block's token ids as little-endian int64: the same bytes on every machine."""
    h = xxhash.xxh64()
    if prefix != -1:
        h.update(PARENT.pack(prefix))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.intdigest()


def pack_tokens(token_ids: list[int]) -> bytes:
    """Token ids as the little-endian int64s that compute_hash hashes."""
    return struct.pack(f"<{len(token_ids)}q", *token_ids)


def compute_hashes(token_ids: list[int], block_size: int, prefix: int = -1, start: int = 0) -> list[int]:
    """The chained hashes of the full blocks of `token_ids[start:]`, each equal to
    `compute_hash(block, parent)`: the tokens are packed once, not per block."""
    num_tokens = (len(token_ids) - start) // block_size * block_size
    if num_tokens <= 0:
        return []
    return hash_packed(pack_tokens(token_ids[start:start + num_tokens]), block_size, prefix)


def hash_packed(data: bytes, block_size: int, prefix: int = -1) -> list[int]:
    """compute_hashes of tokens already packed (`pack_tokens`), whole blocks of them."""
    digest, pack_parent = xxhash.xxh64_intdigest, PARENT.pack
    # the blocks' bytes, cut by iter_unpack: a fifth cheaper than slicing each in the loop
    blocks = struct.iter_unpack(f"{block_size * 8}s", data)
    h = prefix
    hashes = []
    if h == -1:          # the first block of a sequence has no parent
        first = next(blocks, None)
        if first is None:
            return hashes
        h = digest(first[0])
        hashes.append(h)
    hashes += [h := digest(pack_parent(h) + block) for (block,) in blocks]
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
        before, after = prev[block_id], nxt[block_id]
        nxt[before] = after
        prev[after] = before
        prev[block_id] = -1
        self.num_free -= 1

    # Batches, for a prompt's hundreds of blocks: the same queue as one call per block. The
    # ref counts change in the same pass as the queue (a block is free when it has none): one
    # loop a block, not two.

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

    def acquire(self, block_ids, ref_counts: list[int]):
        """A reference more to each of `block_ids` (distinct): one that had none leaves the
        queue. The queue left is the same in any order."""
        prev, nxt = self.prev, self.next
        num_taken = 0
        for block_id in block_ids:
            if ref_counts[block_id]:
                ref_counts[block_id] += 1
                continue
            before = prev[block_id]
            if before == -1:     # the queue stays whole, without those taken so far
                self.num_free -= num_taken
                raise ValueError(f"block {block_id} has no reference and is not free")
            after = nxt[block_id]
            nxt[before] = after
            prev[after] = before
            prev[block_id] = -1
            ref_counts[block_id] = 1
            num_taken += 1
        self.num_free -= num_taken

    def release(self, block_ids, ref_counts: list[int]):
        """A reference less to each of `block_ids`: those left with none are appended, in order."""
        prev, nxt, sentinel = self.prev, self.next, self.sentinel
        last = prev[sentinel]
        num_kept = 0
        for block_id in block_ids:
            n = ref_counts[block_id] - 1
            ref_counts[block_id] = n
            if n:
                if n < 0:      # the queue stays whole, holding those appended so far
                    ref_counts[block_id] = 0
                    nxt[last] = sentinel
                    prev[sentinel] = last
                    self.num_free = sum(1 for _ in self)
                    raise ValueError(f"block {block_id} released more often than it was taken")
                num_kept += 1
                continue
            nxt[last] = block_id
            prev[block_id] = last
            last = block_id
        nxt[last] = sentinel
        prev[sentinel] = last
        self.num_free += len(block_ids) - num_kept


class Block:
    """A view of one KV block of a BlockManager, whose lists hold its state per block id: its
    ref count (`ref_counts`), the hash of the tokens it holds or -1 (`hash_of`) and, cached,
    those tokens packed (`block_bytes`, as pack_tokens packs them: the prefix-cache check
    compares a prompt's blocks with them as bytes, hundreds of blocks in one comparison). A
    prompt's hundreds of blocks are counted, reset and joined in those lists without an
    object per block, and a pool of 100,000 blocks costs three lists to make."""
    __slots__ = ("block_id", "_manager")

    def __init__(self, block_id: int, manager: "BlockManager"):
        self.block_id = block_id
        self._manager = manager

    @property
    def ref_count(self) -> int:
        return self._manager.ref_counts[self.block_id]

    @property
    def hash(self) -> int:
        return self._manager.hash_of[self.block_id]

    @property
    def data(self) -> bytes:
        return self._manager.block_bytes[self.block_id]

    @data.setter
    def data(self, data: bytes):
        # other tokens under the same hash (a collision, in tests): no sequence's hash object vouches for them
        self._manager._disown(self.block_id)
        self._manager.block_bytes[self.block_id] = data

    @property
    def token_ids(self) -> list[int]:
        return list(struct.unpack(f"<{len(self.data) // 8}q", self.data))


class BlockViews:
    """`BlockManager.blocks`: the pool's blocks by id, each a `Block` view made when asked for."""
    __slots__ = ("_manager",)

    def __init__(self, manager: "BlockManager"):
        self._manager = manager

    def __len__(self) -> int:
        return len(self._manager.ref_counts)

    def __getitem__(self, block_id: int) -> Block:
        if not 0 <= block_id < len(self._manager.ref_counts):
            raise IndexError(f"no block {block_id}")
        return Block(block_id, self._manager)

    def __iter__(self):
        manager = self._manager
        return (Block(block_id, manager) for block_id in range(len(manager.ref_counts)))


def _first_difference(data: bytearray, other: bytearray, lo: int, hi: int, stride: int) -> int:
    """The first block in [lo, hi) whose bytes differ between `data` and `other`, or hi: a
    binary search of bytes comparisons (memcmp, no copy), the whole range first."""
    with memoryview(other) as view:
        if data.startswith(view[lo * stride:hi * stride], lo * stride):
            return hi
        while hi - lo > 1:      # [lo, hi) holds a difference; the blocks before lo are equal
            mid = (lo + hi) // 2
            if data.startswith(view[lo * stride:mid * stride], lo * stride):
                lo = mid
            else:
                hi = mid
        return lo


class BlockManager:

    def __init__(self, num_blocks: int, block_size: int, sink: EventSink = NULL_SINK):
        self.block_size = block_size
        self._pack_block = struct.Struct(f"<{block_size}q").pack   # pack_tokens of one block
        self._cut_blocks = struct.Struct(f"{block_size * 8}s").iter_unpack    # packed blocks, one by one
        self.ref_counts = [0] * num_blocks   # per block id: the block tables holding it
        self.hash_of = [-1] * num_blocks     # per block id: the hash of the full block it holds, or -1
        self.block_bytes = [b""] * num_blocks    # per block id: the tokens a cached block holds, packed
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids = FreeBlockQueue(num_blocks)
        self.num_hit_blocks = 0   # prefix-cache hits, in blocks, over the manager's life
        # Sequences whose hashes later prompts copy (`_hash_new_blocks`): key -> (block_data,
        # block_hashes, the block it began at, its blocks when added); the oldest forgotten first
        # past four times the pool's blocks held (a block's bytes and its hash each).
        self._branches: OrderedDict[int, tuple[bytearray, list[int], int, int]] = OrderedDict()
        self._num_branch_blocks = 0
        self.max_branch_blocks = 4 * num_blocks
        # The last lookup (seq, version, block ids): allocate reuses it while no block has been
        # handed out or filled since (`_version` counts those changes).
        self._lookup = None
        self._version = 0
        # Whether a block holding the very hash object a sequence holds is a hit without a
        # lookup (_known_hits): off for good once a hash that has no int of its own is registered.
        self.identity_hits = DISTINCT_INTS
        self.sink = sink
        self.step = 0   # stamped on events; the scheduler sets it each step
        # seq_id -> tokens of its prompt whose KV a transfer put in place (a disaggregated fleet's
        # decode replica, sim/fleet.py), as vLLM's KV connectors report external computed tokens
        self.external_tokens: dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.free_block_ids.num_free

    @property
    def num_blocks(self) -> int:
        return len(self.ref_counts)

    @property
    def blocks(self) -> BlockViews:
        # made when asked for, not kept: a view kept on the manager would hold the two in a
        # reference cycle, and with them the pool's lists, the prefix-cache map and the event
        # sink, until the collector's next pass (a fifth of a second for 100,000 blocks)
        return BlockViews(self)

    def _allocate_block(self) -> int:
        block_id = self.free_block_ids.popleft()
        assert self.ref_counts[block_id] == 0
        h = self.hash_of[block_id]
        if h != -1:
            if self.hash_to_block_id.get(h) == block_id:
                del self.hash_to_block_id[h]   # the cached content is overwritten
            self.hash_of[block_id] = -1
            self.block_bytes[block_id] = b""
        self.ref_counts[block_id] = 1
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
        block_ids = self._known_hits(seq, hashes, num_full)
        known = len(block_ids)
        # The rest looked up a run of blocks at a time, up to the first miss: the prompt's own
        # blocks after it (a conversation's new turn) are not looked up.
        get = self.hash_to_block_id.get
        for start in range(known, num_full, LOOKUP_RUN):
            run = list(map(get, hashes[start:min(start + LOOKUP_RUN, num_full)]))
            if None in run:
                block_ids += run[:run.index(None)]    # the first miss
                break
            block_ids += run
        if len(block_ids) > known:
            # A hash collision: a cached block whose tokens differ. All the blocks at once, as
            # bytes (comparing hundreds of int lists costs more than hashing them).
            block_bytes, data, stride = self.block_bytes, seq.block_data, self.block_size * 8
            if not data.startswith(b"".join(map(block_bytes.__getitem__, islice(block_ids, known, None))),
                                   known * stride):
                for i in range(known, len(block_ids)):
                    if block_bytes[block_ids[i]] != data[i * stride:(i + 1) * stride]:
                        del block_ids[i:]
                        break
            # tokens found equal: the sequence takes the blocks' hash objects, for _known_hits
            hashes[known:len(block_ids)] = map(self.hash_of.__getitem__, islice(block_ids, known, None))
        return block_ids

    def _known_hits(self, seq: Sequence, hashes: list[int], num_full: int) -> list[int]:
        """The leading blocks of the table of the sequence whose hashes seq copied last
        (`peer_blocks`) that hold, as their hash, the very int object seq holds for that block:
        hits without a lookup in the map or a comparison of tokens. A hash object is made
        where a block is hashed and passed on only between blocks whose tokens were compared
        equal (`_hash_new_blocks`, the hits of `_cached_block_ids`), so a block holding it holds
        seq's tokens; and while `identity_hits` holds, a block holding a hash is the one the map
        maps it to (`_supersede` keeps that so). A block since reused holds another object, or
        none: the hits go on from there through the map, as they would have. A lookup in a map
        of 100,000 hashes costs a cache miss or two in the map's index and its entries; this
        reads one list slot a block."""
        peer = seq.peer_blocks
        if not peer or not self.identity_hits:
            return []
        n = min(num_full, len(peer))
        held = map(self.hash_of.__getitem__, islice(peer, n))
        return peer[:next(compress(count(), map(is_not, held, hashes)), n)]

    def _hashes_upto(self, seq: Sequence, n: int) -> list[int]:
        """seq.block_hashes with at least its first n full blocks hashed (and packed, in
        seq.block_data, which holds more for a prompt that came packed: EncodedTokens' packed)."""
        hashes = seq.block_hashes
        if len(hashes) < n:   # every full block at once: packing the tokens is the cost
            size = self.block_size
            start = len(hashes) * size
            num_tokens = (seq.num_tokens - start) // size * size
            data, end = seq.block_data, start + num_tokens
            if num_tokens == size and hashes:
                # the one block a decode fills: hash_packed's set-up is most of it
                block = self._pack_block(*seq.tokens(start, end))
                hashes.append(xxhash.xxh64_intdigest(PARENT.pack(hashes[-1]) + block))
                data += block
            else:
                # Tokens packed: as many as hashed, or, before a prompt that came packed is first
                # hashed, its full blocks. The rest packed whole, their partial block cut off
                # after: slicing the list costs more.
                have = len(data) // 8
                if have < end:
                    whole = not have and not seq.completion     # the prompt as it is: no slice of it
                    packed = pack_tokens(seq.prompt if whole else seq.tokens(have, seq.num_tokens))
                    data += packed if len(packed) == (end - have) * 8 else memoryview(packed)[:(end - have) * 8]
                self._hash_new_blocks(seq, end // size)
        return hashes

    def _hash_new_blocks(self, seq: Sequence, end: int):
        """Extend seq.block_hashes to its first `end` blocks (seq.block_data holds their bytes),
        copying the hashes of the blocks it shares with an earlier sequence instead of hashing
        them: a block's hash depends only on the bytes of the blocks up to it, so once one
        hash equals that sequence's, the next blocks whose bytes equal its have its hashes.
        The earlier sequences are found in `_branches` by the hash of the block at which each
        began hashing its own; a prompt that shares a long prefix (a conversation's next turn)
        hashes one block where it meets that sequence and the blocks after the point where they part."""
        hashes, data = seq.block_hashes, seq.block_data
        branches, stride = self._branches, self.block_size * 8
        i = len(hashes)
        superseded = -1    # the key of a branch this sequence has followed to its end
        while i < end:
            # hash block i ourselves: where this sequence meets or leaves a branch
            if i:
                h = xxhash.xxh64_intdigest(PARENT.pack(hashes[-1]) + data[i * stride:(i + 1) * stride])
            else:
                h = xxhash.xxh64_intdigest(data[:stride])
            hashes.append(h)
            branch = branches.get(h)
            if branch is None or branch[2] != i:
                # nobody began at this block: the rest is this sequence's own
                with memoryview(data) as view:
                    hashes += hash_packed(view[(i + 1) * stride:end * stride], self.block_size, h)
                if superseded != -1:    # it carries on the branch it followed to its end: one entry, the longer
                    self._add_branch(superseded, seq, branches[superseded][2])
                else:
                    self._add_branch(h, seq, i)
                return
            other_data, other_hashes = branch[0], branch[1]
            seq.peer_blocks = branch[4]
            if data[i * stride:(i + 1) * stride] == other_data[i * stride:(i + 1) * stride]:
                hashes[-1] = other_hashes[i]
            limit = min(len(other_hashes), end)
            j = i + 1 if i + 1 >= limit else _first_difference(data, other_data, i + 1, limit, stride)
            hashes += other_hashes[i + 1:j]
            superseded = h if j == len(other_hashes) else -1
            i = j

    def _add_branch(self, key: int, seq: Sequence, start: int):
        """Remember seq as the branch that began at block `start` (whose hash is `key`), the
        oldest branches forgotten past `max_branch_blocks` blocks held."""
        branches = self._branches
        num_blocks = len(seq.block_hashes)
        if key in branches:
            self._num_branch_blocks -= branches.pop(key)[3]
        if num_blocks > self.max_branch_blocks:
            return
        self._num_branch_blocks += num_blocks
        while self._num_branch_blocks > self.max_branch_blocks:
            self._num_branch_blocks -= branches.popitem(last=False)[1][3]
        branches[key] = (seq.block_data, seq.block_hashes, start, num_blocks, seq.block_table)

    def num_blocks_needed(self, seq: Sequence) -> tuple[int, int]:
        """(cached leading blocks, free blocks needed) for a first allocation."""
        block_ids = self._cached_block_ids(seq)
        # a block shared with a live sequence (a ref count above 0) needs no free block
        num_new_blocks = seq.num_blocks - len(block_ids) + countOf(map(self.ref_counts.__getitem__, block_ids), 0)
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
        free, table, ref_counts = self.free_block_ids, seq.block_table, self.ref_counts
        hits = cached[:num_cached_blocks]
        # The hits in bulk: a hit shared with a live sequence gains a reference, a free one
        # (ref count 0) leaves the free queue with its one reference. (The queue left is the
        # same whatever order its blocks are taken out in.)
        free.acquire(hits, ref_counts)
        # _allocate_block, for all the new blocks at once: a prompt has hundreds
        new_block_ids = free.popleft_many(seq.num_blocks - num_cached_blocks)
        hash_map, hash_of, block_bytes = self.hash_to_block_id, self.hash_of, self.block_bytes
        for block_id in new_block_ids:    # free, so each has ref count 0
            h = hash_of[block_id]
            if h != -1:
                if hash_map.get(h) == block_id:
                    del hash_map[h]   # the cached content is overwritten
                hash_of[block_id] = -1
                block_bytes[block_id] = b""
            ref_counts[block_id] = 1
        table += hits
        table += new_block_ids
        self._version += 1
        seq.num_cached_tokens = num_cached_blocks * self.block_size
        if self.external_tokens:
            self._take_external(seq, num_cached_blocks)
        self.num_hit_blocks += num_cached_blocks
        if self.sink.enabled:
            self.sink.emit(BlockAllocate(self.step, seq.seq_id, list(table), num_cached_blocks))

    def _take_external(self, seq: Sequence, num_cached_blocks: int):
        """A transfer's tokens count as computed when the full blocks before them are this
        allocation's hits (they were not evicted first); at least the last token is computed."""
        num_external = self.external_tokens.pop(seq.seq_id, 0)
        if num_cached_blocks == num_external // self.block_size:
            seq.num_cached_tokens = max(seq.num_cached_tokens, min(num_external, seq.num_tokens - 1))

    def deallocate(self, seq: Sequence):
        released = seq.block_table[::-1]   # tail first, so prefix blocks stay cached longer
        self.free_block_ids.release(released, self.ref_counts)   # the freed ones in release order
        seq.num_cached_tokens = 0
        seq.block_table = []     # a new list: the branch registry keeps the old, where a next turn's hits are
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

    def _supersede(self, hashes: list[int], block_ids: list[int], held: list[int]):
        """After `hash_to_block_id.setdefault` of `hashes` to the blocks just filled, where some
        block already held one of them: the hash now maps to the new block, as an update would
        have it, and the block that held it keeps the value in an int of its own (`_disown`), so
        that `_known_hits` never takes it."""
        hash_map, earlier = self.hash_to_block_id, {}
        for h, block_id, other in zip(hashes, block_ids, held):
            # a hash twice in the batch (a collision): the block after the earlier one of the batch
            other = earlier.get(h, other)
            earlier[h] = block_id
            if other != block_id:
                hash_map[h] = block_id
                self._disown(other)

    def _disown(self, block_id: int):
        """The block's hash as an int object no sequence holds (its value unchanged). A hash the
        interpreter keeps one shared int for (0 to SMALL_INT_MAX, one in 10**16 of them) has
        none of its own; registering one turned `identity_hits` off (hash_blocks)."""
        h = self.hash_of[block_id]
        if h != -1:
            self.hash_of[block_id] = h + 0     # a new int: no shared int above SMALL_INT_MAX

    def hash_blocks(self, seq: Sequence):
        """Register the blocks this step has just filled."""
        size, num_cached_tokens = self.block_size, seq.num_cached_tokens
        start = num_cached_tokens // size
        end = (num_cached_tokens + seq.num_scheduled_tokens) // size
        if start == end:     # a decoded token that does not fill its block
            return
        self._version += 1
        stride = size * 8
        if end - start == 1:    # the block a decode fills: the loops' set-up is most of it
            h, block_id = self._hashes_upto(seq, end)[start], seq.block_table[start]
            self.hash_of[block_id] = h
            self.block_bytes[block_id] = bytes(seq.block_data[start * stride:end * stride])
            held = self.hash_to_block_id.setdefault(h, block_id)
            if held != block_id:
                self._supersede([h], [block_id], [held])
            if h <= SMALL_INT_MAX:
                self.identity_hits = False
            if self.sink.enabled:
                self.sink.emit(BlockHash(self.step, seq.seq_id, block_id, h))
            return
        hashes = self._hashes_upto(seq, end)[start:end]
        block_ids = seq.block_table[start:end]
        hash_of, block_bytes = self.hash_of, self.block_bytes
        for block_id, h, (data,) in zip(block_ids, hashes, self._cut_blocks(seq.block_data[start * stride:end * stride])):
            hash_of[block_id] = h
            block_bytes[block_id] = data
        # setdefault, not update: one probe a block that also says which hashes a block held already
        held = list(map(self.hash_to_block_id.setdefault, hashes, block_ids))
        if held != block_ids:
            self._supersede(hashes, block_ids, held)
        if min(hashes) <= SMALL_INT_MAX:
            self.identity_hits = False
        if self.sink.enabled:
            emit, step, seq_id = self.sink.emit, self.step, seq.seq_id
            for block_id, h in zip(block_ids, hashes):
                emit(BlockHash(step, seq_id, block_id, h))
