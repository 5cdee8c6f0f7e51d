"""The fold's projection for the block rules a trace was recorded under: a
vLLM trace's (replay/vllm_fold.py), an SGLang trace's token pool and radix cache
(replay/sglang_fold.py), tracengine's own under vLLM's block rules
(engine/vllm_block_manager.py), or nano-vllm's (fold.py's `Projection`); a
disaggregated fleet's decode replica takes in KV transfers (fold_transfer.py)."""
from tracengine.engine.config import recorded_block_rules
from tracengine.engine.vllm_block_manager import VllmBlockManager
from tracengine.replay.projection import Projection
from tracengine.replay.fold_transfer import TransferProjection
from tracengine.trace.header import SGLANG, VLLM, backend_of


class VllmRulesProjection(Projection):
    """vLLM's block rules, as tracengine's VllmBlockManager keeps them: its pool's free rule
    (a block freed with no reference left goes to the head of the free queue when it holds no
    hash, to the tail when it does) and its prefix cache's (the first block registered under a
    hash is the one found, the later ones in turn once it is handed out)."""
    block_rules = VllmBlockManager


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
