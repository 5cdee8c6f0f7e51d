"""The fold's projection for the block rules a trace was recorded under: a
vLLM trace's (vllm/fold.py), tracengine's own under vLLM's block rules
(engine/vllm_block_manager.py), or nano-vllm's (fold.py's `_Projection`)."""
from tracengine.engine.config import recorded_block_rules
from tracengine.replay.fold import _Projection
from tracengine.trace.events import BlockFree


class VllmRulesProjection(_Projection):
    """vLLM's free queue: a block freed with no reference left goes to the head when it holds
    no hash, to the tail when it does (the blocks come tail first, as the sequence released them)."""

    def block_free(self, e: BlockFree):
        ref_counts, hashes = self.ref_counts, self.hashes
        evict_first, evict_last = [], []
        for block_id in e.block_ids:
            ref_counts[block_id] -= 1
            if ref_counts[block_id] == 0:
                (evict_first if hashes[block_id] == -1 else evict_last).append(block_id)
            elif ref_counts[block_id] < 0:
                raise ValueError(f"block {block_id} freed more often than allocated")
        self.free.prepend_n(evict_first)
        self.free.append_n(evict_last)
        s = self.seqs[e.seq_id]
        s.block_table = []
        s.num_cached_tokens = 0


def projection(header, num_blocks: int, block_size: int) -> _Projection:
    """The empty projection of the block pool the header describes."""
    if header.engine == "vllm":
        from tracengine.vllm.fold import vllm_projection
        return vllm_projection(num_blocks, block_size)
    if recorded_block_rules(header.config) == "vllm":
        return VllmRulesProjection(num_blocks, block_size)
    return _Projection(num_blocks, block_size)
