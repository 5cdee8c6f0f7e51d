"""The queue of free KV blocks, as vLLM's FreeKVCacheBlockQueue: doubly linked, so that
taking the head, appending and removing any free block (a prefix-cache hit on a free block
takes it out of the middle) are O(1), and a step costs the same with 1,000 blocks as with
100,000.

A block costs memory from when it is first handed out: until then it is one of
the queue's run of fresh blocks (ids `fresh` .. num_blocks - 1, in id order, one
node of the queue), and the pool and the prefix cache give it no slot (the queue's
own arrays give slots to at most as many blocks again as have been handed out). A
pool of a billion blocks (a what-if's "as many as it takes") costs what its blocks
in use cost."""
from collections.abc import Iterator
from typing import Final

from tracengine.engine.native import extend, i64, vec

SENTINEL: Final = -1     # the node that closes the ring: its slot is the arrays' last
FRESH_RUN: Final = -2    # the node that stands for the fresh blocks: its slot is the one before
NOT_FREE: Final = -3     # a block's `prev` when it is not in the queue (an int, so the arrays hold ints only)
NOT_FREE_SLOTS: Final = vec[i64]([NOT_FREE] * 4096)     # the new slots of a growing array come from this


class FreeKVCacheBlockQueue:
    """Free block ids in order, linked through two arrays indexed by block id: `prev` and
    `next` (machine integers, engine/native.py), whose last two slots are the FRESH_RUN
    node's and the SENTINEL's. A block has slots once it has been handed out (ids below
    `fresh`), and so may some blocks after it; one not in the queue has `prev` NOT_FREE."""
    __slots__ = ("prev", "next", "num_free_blocks", "num_blocks", "fresh")
    prev: vec[i64]
    next: vec[i64]

    def __init__(self, num_blocks: int) -> None:
        """All the blocks, in id order: the ring holds the sentinel and the fresh run."""
        self.num_blocks = self.num_free_blocks = num_blocks
        self.fresh = 0
        if num_blocks:
            self.prev, self.next = vec[i64]([SENTINEL, FRESH_RUN]), vec[i64]([SENTINEL, FRESH_RUN])
        else:      # the run is empty: not in the ring
            self.prev, self.next = vec[i64]([NOT_FREE, SENTINEL]), vec[i64]([NOT_FREE, SENTINEL])

    def copy(self) -> "FreeKVCacheBlockQueue":
        other = FreeKVCacheBlockQueue(0)
        other.prev, other.next = vec[i64](self.prev), vec[i64](self.next)
        other.num_free_blocks, other.num_blocks, other.fresh = self.num_free_blocks, self.num_blocks, self.fresh
        return other

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[int]:
        next_ = self.next
        node = next_[SENTINEL]
        while node != SENTINEL:
            if node == FRESH_RUN:
                yield from range(self.fresh, self.num_blocks)
            else:
                yield node
            node = next_[node]

    def __contains__(self, block_id: int) -> bool:
        return 0 <= block_id < self.num_blocks and (block_id >= self.fresh or self.prev[block_id] != NOT_FREE)

    def head(self) -> int:
        if not self.num_free_blocks:
            raise IndexError("no free block")
        node = self.next[SENTINEL]
        return self.fresh if node == FRESH_RUN else node

    def popleft(self) -> int:
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[int]:
        """The first n free blocks, taken out, in order."""
        if n > self.num_free_blocks:
            raise IndexError(f"{n} blocks asked, {self.num_free_blocks} free")
        prev, next_ = self.prev, self.next
        block_ids: list[int] = []
        node = next_[SENTINEL]
        for _ in range(n):
            if node == FRESH_RUN:
                node = self._popleft_through_run(block_ids, n)
                prev, next_ = self.prev, self.next     # grown by the blocks handed out
                break
            block_ids.append(node)
            prev[node] = NOT_FREE
            node = next_[node]
        next_[SENTINEL] = node    # the new head
        prev[node] = SENTINEL
        self.num_free_blocks -= n
        return block_ids

    def _popleft_through_run(self, block_ids: list[int], n: int) -> int:
        """popleft_n from the fresh run on: its blocks, then those after it, until `block_ids`
        holds n; the node that is then the head."""
        block_ids += self._hand_out(min(n - len(block_ids), self.num_blocks - self.fresh))
        if self.fresh < self.num_blocks:
            return FRESH_RUN
        prev, next_ = self.prev, self.next
        node = next_[FRESH_RUN]       # the run is used up: out of the ring
        for _ in range(n - len(block_ids)):
            block_ids.append(node)
            prev[node] = NOT_FREE
            node = next_[node]
        return node

    def _hand_out(self, n: int) -> range:
        """The next n fresh blocks, given their slots (not in the queue); the ring is the caller's.
        The slots may be in new arrays (librt's `extend`, engine/native.py): a caller re-reads
        `prev` and `next` after this."""
        first = self.fresh
        self.fresh = first + n
        num_slots = len(self.prev) - 2      # blocks with slots: those handed out, and some after them
        if self.fresh > num_slots:          # doubled (up to every block): grown a logarithmic number of times
            more = min(max(self.fresh, 2 * num_slots), self.num_blocks) - num_slots
            self.prev, self.next = with_block_slots(self.prev, more), with_block_slots(self.next, more)
        return range(first, first + n)

    def append(self, block_id: int) -> None:
        self.append_n([block_id])

    def append_n(self, block_ids: list[int]) -> None:
        """`block_ids` at the tail, in order."""
        self._insert_after(self.prev[SENTINEL], block_ids)

    def prepend_n(self, block_ids: list[int]) -> None:
        """`block_ids` at the head, in order: the first is handed out first (vLLM's free
        queue takes back a block that holds no hash there, block_pool.py)."""
        self._insert_after(SENTINEL, block_ids)

    def _insert_after(self, node: int, block_ids: list[int]) -> None:
        """`block_ids`, in order, linked in between `node` (a block, the sentinel or the run)
        and the one after it."""
        prev, next_, fresh = self.prev, self.next, self.fresh
        after = next_[node]
        last = node
        for block_id in block_ids:
            if block_id >= fresh or prev[block_id] != NOT_FREE:    # a fresh block is free
                raise ValueError(f"block {block_id} is already free")
            next_[last] = block_id
            prev[block_id] = last
            last = block_id
        next_[last] = after
        prev[after] = last
        self.num_free_blocks += len(block_ids)

    def remove(self, block_id: int) -> None:
        self.remove_n([block_id])

    def remove_n(self, block_ids: list[int]) -> None:
        """Take each of `block_ids` out, wherever it is in the queue."""
        prev, next_ = self.prev, self.next
        for block_id in block_ids:
            if block_id >= self.fresh and block_id < self.num_blocks:
                self._split_run(block_id)
                prev, next_ = self.prev, self.next     # grown by the blocks handed out
            elif not 0 <= block_id < self.fresh or prev[block_id] == NOT_FREE:
                raise ValueError(f"block {block_id} is not free")
            before, after = prev[block_id], next_[block_id]
            next_[before] = after
            prev[after] = before
            prev[block_id] = NOT_FREE
            self.num_free_blocks -= 1

    def _split_run(self, block_id: int) -> None:
        """The fresh blocks up to `block_id` linked as blocks of their own where the run is,
        the run going on after them (a fold takes blocks where the events say)."""
        linked_blocks = self._hand_out(block_id + 1 - self.fresh)
        prev, next_ = self.prev, self.next
        before, after = prev[FRESH_RUN], next_[FRESH_RUN]
        if block_id + 1 < self.num_blocks:     # the run goes on after them
            after = FRESH_RUN
        for linked in linked_blocks:
            next_[before] = linked
            prev[linked] = before
            before = linked
        next_[before] = after
        prev[after] = before


def with_block_slots(links: vec[i64], n: int) -> vec[i64]:
    """`links` with n more block slots, NOT_FREE, before the two nodes' slots, which stay last
    (a link to a node names it, SENTINEL or FRESH_RUN, not its slot)."""
    end = len(links)
    fresh_run, sentinel = links[end - 2], links[end - 1]
    links = extended(links, n, NOT_FREE_SLOTS)
    for slot in range(end - 2, min(end, end + n - 2)):     # the nodes' old slots: now blocks'
        links[slot] = NOT_FREE
    links[end + n - 2], links[end + n - 1] = fresh_run, sentinel
    return links


def extended(array: vec[i64], n: int, filler: vec[i64]) -> vec[i64]:
    """`array` with n more slots, each holding the one value `filler` holds: copied from `filler`,
    whole or in part, not made one by one."""
    for start in range(0, n, len(filler)):
        array = extend(array, filler if n - start >= len(filler) else filler[:n - start])
    return array
