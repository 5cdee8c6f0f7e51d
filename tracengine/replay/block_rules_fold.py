"""The fold's projection for the block rules a trace was recorded under: a
vLLM trace's (replay/vllm_fold.py), an SGLang trace's token pool and radix cache
(replay/sglang_fold.py), tracengine's own under vLLM's block rules
(engine/vllm_block_manager.py), or nano-vllm's (fold.py's `Projection`); a
disaggregated fleet's decode replica takes in KV transfers (fold_transfer.py)."""
import msgspec

from tracengine.engine.config import recorded_block_rules
from tracengine.engine.vllm_block_manager import release, unregister
from tracengine.replay.projection import Keyframe, Projection
from tracengine.replay.fold_transfer import TransferProjection
from tracengine.trace.events import BlockFree
from tracengine.trace.header import SGLANG, VLLM, backend_of


class VllmRulesKeyframe(Keyframe, frozen=True, gc=False):
    later_block_ids: dict      # hash -> the blocks registered under it after the one found


class VllmRulesProjection(Projection):
    """vLLM's block rules: a block freed with no reference left goes to the head of the free
    queue when it holds no hash, to the tail when it does (the blocks come tail first, as the
    sequence released them); the first block registered under a hash is the one found, the
    later ones in turn once it is handed out."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.later_block_ids: dict[int, list[int]] = {}

    def keyframe(self, step: int) -> VllmRulesKeyframe:
        kf = super().keyframe(step)
        return VllmRulesKeyframe(*msgspec.structs.astuple(kf),
                                 {h: list(ids) for h, ids in self.later_block_ids.items()})

    @classmethod
    def from_keyframe(cls, kf: VllmRulesKeyframe, block_size: int) -> "VllmRulesProjection":
        p = super().from_keyframe(kf, block_size)
        p.later_block_ids = {h: list(ids) for h, ids in kf.later_block_ids.items()}
        return p

    def _take_free_block(self, block_id: int):
        if self.free.head() != block_id:
            raise ValueError(f"block {block_id} is not the next free block {self.free.head()}")
        self.free.popleft()
        h = self.hashes[block_id]
        if h != -1:
            unregister(self.hash_to_block_id, self.later_block_ids, h, block_id)
        self.hashes[block_id] = -1
        self.ref_counts[block_id] = 1

    def _register(self, block_id: int, h: int):
        self.hashes[block_id] = h
        if self.hash_to_block_id.setdefault(h, block_id) != block_id:
            self.later_block_ids.setdefault(h, []).append(block_id)

    def block_free(self, e: BlockFree):
        release(self.ref_counts, self.hashes, self.free, e.block_ids)
        s = self.seqs[e.seq_id]
        s.block_table = []
        s.num_cached_tokens = 0


class VllmRulesTransferProjection(VllmRulesProjection, TransferProjection):
    """A disaggregated fleet's decode replica (fold_transfer.py) under vLLM's block rules."""


def projection(header, num_blocks: int, block_size: int) -> Projection:
    """The empty projection of the block pool the header describes."""
    if backend_of(header) == VLLM:
        from tracengine.replay.vllm_fold import vllm_projection
        return vllm_projection(num_blocks, block_size)
    if backend_of(header) == SGLANG:
        from tracengine.replay.sglang_fold import SglangProjection
        return SglangProjection(num_blocks, block_size)
    vllm_rules = recorded_block_rules(header.config) == "vllm"
    if header.fleet.get("num_decode_replicas"):
        return (VllmRulesTransferProjection if vllm_rules else TransferProjection)(num_blocks, block_size)
    return (VllmRulesProjection if vllm_rules else Projection)(num_blocks, block_size)
