"""The KV block pool: each block's reference count and the queue of free blocks
(free_block_queue.py).

A block is handed out from the head of the free queue and returned to its tail,
so the least recently freed block is reused first, and a freed block keeps what
the prefix cache knows of it until it is handed out again."""
from typing import Any, Final

from tracengine.engine.free_block_queue import FreeKVCacheBlockQueue, extended
from tracengine.engine.native import i64, vec

NO_REFERENCES: Final = vec[i64]([0] * 4096)     # the counts of blocks handed out for the first time come from this


class BlockPool:
    """The blocks' reference counts (the block tables holding each) and the free queue: a
    block is free exactly when no block table holds it."""

    def __init__(self, num_blocks: int) -> None:
        # of the blocks handed out so far, the others having none (machine integers, engine/native.py)
        self.ref_counts: vec[i64] = vec[i64]()
        self.free_block_queue = FreeKVCacheBlockQueue(num_blocks)

    @property
    def num_blocks(self) -> int:
        return self.free_block_queue.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_new_blocks(self, n: int) -> list[int]:
        """The n blocks at the head of the free queue, each with one reference (a block is free
        exactly when it has none)."""
        block_ids = self.free_block_queue.popleft_n(n)
        self._count_fresh_blocks()
        ref_counts = self.ref_counts
        for block_id in block_ids:
            ref_counts[block_id] = 1
        return block_ids

    def _count_fresh_blocks(self) -> None:
        """A reference count (none yet) for each block the queue handed out for the first time."""
        ref_counts, fresh = self.ref_counts, self.free_block_queue.fresh
        if len(ref_counts) < fresh:
            self.ref_counts = extended(ref_counts, fresh - len(ref_counts), NO_REFERENCES)

    def touch(self, block_ids: list[Any]) -> None:
        """A reference more to each of `block_ids`: a free one (a prefix-cache hit on a
        freed block) leaves the free queue. A block given twice (hashes that collide within
        one prompt) gains two references. Each id goes on as the object it is (as `release`)."""
        ref_counts = self.ref_counts
        taken: list[Any] = []
        for block in block_ids:
            block_id: i64 = block
            if ref_counts[block_id] == 0:
                taken.append(block)
            ref_counts[block_id] += 1
        self.free_block_queue.remove_n(taken)

    def free_blocks(self, block_ids: list[Any]) -> None:
        """A reference less to each of `block_ids`; those left with none join the tail of
        the free queue, in the order they reach none (each id going on as the object it is)."""
        ref_counts = self.ref_counts
        freed: list[Any] = []
        for block in block_ids:
            block_id: i64 = block
            ref_count = ref_counts[block_id] = ref_counts[block_id] - 1
            if ref_count == 0:
                freed.append(block)
            elif ref_count < 0:
                raise ValueError(f"block {block_id} freed more often than it was taken")
        self.free_block_queue.append_n(freed)

    # -- a recorded decision applied (the fold, replay/projection.py): the same rules, checked --

    def take_next_block(self, block_id: int) -> None:
        """`get_new_blocks(1)` where the record says it gave `block_id`: a ValueError when the
        free queue's head is another block."""
        head = self.free_block_queue.head()
        if head != block_id:
            raise ValueError(f"block {block_id} is not the next free block {head}")
        self.get_new_blocks(1)

    def take_block(self, block_id: int) -> None:
        """`block_id` out of the free queue wherever it is, with one reference: an allocation
        whose place in the queue the record does not say (a vLLM trace's)."""
        self.free_block_queue.remove(block_id)      # a ValueError when it is not free
        self._count_fresh_blocks()
        self.ref_counts[block_id] = 1

    def hold_every_block(self) -> None:
        """A reference count for every block now, not only those handed out (a fold shows
        every block, and takes any)."""
        self.ref_counts = extended(self.ref_counts, self.num_blocks - len(self.ref_counts), NO_REFERENCES)

    def copy(self, prefix_cache: Any = None) -> "BlockPool":
        """An independent copy (a fold's keyframe); `prefix_cache`: the copy of the prefix
        cache whose hashes the copy's rules read, where they read them (VllmBlockPool)."""
        return self._copy_into(BlockPool(0))

    def _copy_into(self, other: "BlockPool") -> "BlockPool":
        other.ref_counts, other.free_block_queue = vec[i64](self.ref_counts), self.free_block_queue.copy()
        return other
