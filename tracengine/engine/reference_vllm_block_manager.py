"""vLLM's block rules (vllm_block_manager.py) in the plain form of
reference_block_manager.py: a Block object per block, the free blocks in a
deque, one hash at a time. It makes the same decisions and emits the same
events (tests/test_scheduler_properties.py runs both under the mixed policy)."""
from tracengine.engine.reference_block_manager import ReferenceBlockManager
from tracengine.engine.sequence import Sequence
from tracengine.engine.hash_id_blocks import hashed_block_events
from tracengine.trace.events import BlockAllocate, BlockAppend, BlockFree
from tracengine.trace.sinks import NULL_SINK


class ReferenceVllmBlockManager(ReferenceBlockManager):
    allocates_per_chunk = True

    def __init__(self, num_blocks: int, block_size: int, sink=NULL_SINK, enable_caching: bool = True):
        super().__init__(num_blocks, block_size, sink, enable_caching)
        self.registered: dict[int, int] = {}     # block id -> when it was registered (a count)
        self.num_registered = 0

    def _take_free_block(self, block_id: int) -> int:
        """A hash found in this block is found from now on in the block registered next under it."""
        block = self.blocks[block_id]
        if block.hash != -1 and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
            others = [b.block_id for b in self.blocks if b.hash == block.hash and b is not block]
            if others:
                self.hash_to_block_id[block.hash] = min(others, key=self.registered.__getitem__)
        return super()._take_free_block(block_id)

    def num_computed_tokens(self, seq: Sequence, num_cached_blocks: int) -> int:
        return num_cached_blocks * self.block_size      # no transfers here

    def allocate(self, seq: Sequence, hits: list[int], num_new_tokens: int):
        """The hits, then slots for the first `num_new_tokens` past them."""
        assert not seq.block_table
        num_cached_blocks = len(hits)
        self._take_hits(seq, hits)
        seq.num_cached_tokens = num_cached_blocks * self.block_size
        num_slots = seq.num_cached_tokens + num_new_tokens
        while len(seq.block_table) * self.block_size < num_slots:
            seq.block_table.append(self._take_free_block(self.free_block_ids[0]))
        self.num_hit_blocks += num_cached_blocks
        if self.sink.enabled:
            self.sink.emit(BlockAllocate(self.step, seq.seq_id, list(seq.block_table), num_cached_blocks))
        self.cache_blocks(seq, num_cached_blocks, num_slots)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        num_slots = seq.num_cached_tokens + num_new_tokens
        num_new_blocks = (num_slots + self.block_size - 1) // self.block_size - len(seq.block_table)
        if num_new_blocks > len(self.free_block_ids):
            return False
        for _ in range(num_new_blocks):
            block_id = self._take_free_block(self.free_block_ids[0])
            seq.block_table.append(block_id)
            if self.sink.enabled:
                self.sink.emit(BlockAppend(self.step, seq.seq_id, block_id))
        self.cache_blocks(seq, seq.num_cached_tokens // self.block_size, num_slots)
        return True

    def cache_blocks(self, seq: Sequence, num_cached_blocks: int, num_tokens: int):
        end = min(num_tokens, seq.num_tokens) // self.block_size if self.enable_caching else 0
        for i in range(num_cached_blocks, end):
            block = self.blocks[seq.block_table[i]]
            block.hash, block.token_ids = self._block_hash(seq, i), seq.block(i)
            self.hash_to_block_id.setdefault(block.hash, block.block_id)    # the first registered is found
            self.registered[block.block_id] = self.num_registered
            self.num_registered += 1
        if self.sink.enabled and num_cached_blocks < end:
            block_ids = seq.block_table[num_cached_blocks:end]
            for event in hashed_block_events(self.step, seq, num_cached_blocks, block_ids,
                                             [self.blocks[b].hash for b in block_ids]):
                self.sink.emit(event)

    def hash_blocks(self, seq: Sequence):
        pass    # registered at allocation

    def deallocate(self, seq: Sequence):
        """Tail first; a block left with no reference goes to the head of the free queue when it
        holds no hash, to the tail when it does."""
        released = seq.block_table[::-1]
        evict_first = []
        for block_id in released:
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash == -1:
                    evict_first.append(block_id)
                else:
                    self.free_block_ids.append(block_id)
        self.free_block_ids.extendleft(reversed(evict_first))
        seq.num_cached_tokens = 0
        seq.block_table = []
        if self.sink.enabled:
            self.sink.emit(BlockFree(self.step, seq.seq_id, released))
