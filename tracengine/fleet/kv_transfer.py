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
