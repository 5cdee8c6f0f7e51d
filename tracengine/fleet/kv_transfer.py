"""What a KV transfer puts into a disaggregated fleet's decode replica (fleet/engine.py): the
prompt's full blocks, in its prefix cache, as a KV connector's transfer fills them. The fold
of a decode replica's events takes them in the same way (replay/fold_transfer.py)."""
from tracengine.engine.sequence import Sequence
from tracengine.trace.sinks import NULL_SINK


def install_prompt_kv(block_manager, seq_id: int, token_ids) -> int:
    """The full blocks of `token_ids` put into the block manager's prefix cache as a KV
    connector's transfer fills them: allocated (those it holds already are hits), hashed and
    released, so they stay cached until reused. As many leading blocks as the free ones
    allow; returns how many. Writes no event (the KVTransfer says it)."""
    size = block_manager.block_size
    num_blocks = len(token_ids) // size if block_manager.enable_caching else 0   # it lands through the cache
    sink, block_manager.sink = block_manager.sink, NULL_SINK
    try:
        while num_blocks > 0:
            carrier = Sequence(seq_id, list(token_ids[:num_blocks * size]), size)
            hits = block_manager.cached_block_ids(carrier)
            num_new = block_manager.num_blocks_needed(carrier, hits)
            if num_new <= block_manager.num_free_blocks:
                break
            num_blocks -= num_new - block_manager.num_free_blocks    # the leading blocks that fit
        if num_blocks <= 0:
            return 0
        block_manager.allocate(carrier, hits)
        carrier.num_scheduled_tokens = carrier.num_tokens - carrier.num_cached_tokens
        block_manager.hash_blocks(carrier)
        carrier.num_cached_tokens, carrier.num_scheduled_tokens = carrier.num_tokens, 0
        block_manager.deallocate(carrier)
        return num_blocks
    finally:
        block_manager.sink = sink


class LandedPrompts:
    """The KV connector of a disaggregated fleet's decode replica (BlockManager.kv_connector):
    the prompts whose KV a transfer put in place, by seq_id. A landed prompt's full blocks are
    in the prefix cache (install_prompt_kv); its last, partial block came too, so once its full
    blocks are the hits (none was evicted first) its tokens are computed, but the last, which is
    always computed anew. Forgotten once the sequence is admitted."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.num_tokens: dict[int, int] = {}

    def landed(self, seq_id: int, num_tokens: int) -> None:
        self.num_tokens[seq_id] = num_tokens

    def num_computed_tokens(self, seq: Sequence, num_cached_blocks: int, num_computed: int) -> int:
        num_landed = self.num_tokens.get(seq.seq_id, 0)
        if num_landed and num_cached_blocks == num_landed // self.block_size:
            return max(num_computed, min(num_landed, seq.num_tokens - 1))
        return num_computed

    def allocated(self, seq_id: int) -> None:
        self.num_tokens.pop(seq_id, None)
