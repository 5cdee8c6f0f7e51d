"""The block hashes of a prompt known by its hash ids (hash_id_prompt.py), and the events that
register its blocks: the hot part of a hash-id prompt, in the compiled core (tracengine/compiled.py),
apart from the HashIdPrompt class, which the core cannot hold (a subclass of an ABC)."""
from functools import lru_cache
from typing import Any

from tracengine.engine.block_hasher import NO_PARENT, hash_id_hashes, id_run_hashes
from tracengine.trace.events import BlockHash, PromptBlocksHashed


def prompt_block_hashes(hash_ids: list[int], block_tokens: int, block_size: int, first_block: int,
                        num_blocks: int, parent: int = NO_PARENT) -> list[int]:
    """The chained hashes of blocks `first_block` .. `first_block + num_blocks - 1` of a prompt
    whose hash ids, from the one holding the first block's first token on, are `hash_ids`;
    `parent`: the hash of the block before them (NO_PARENT for block 0)."""
    start = first_block * block_size
    if block_tokens % block_size:      # blocks straddle hash ids: hashed from the tokens they stand for
        return hash_id_hashes(hash_ids, block_tokens, start % block_tokens, block_size, num_blocks, parent)
    hashes: list[int] = []
    offset = start % block_tokens      # where the first block starts in its hash id's tokens
    for hash_id in hash_ids:
        if len(hashes) >= num_blocks:
            break
        if offset:      # the rest of a hash id whose first blocks an earlier chunk hashed
            hashes += id_run_hashes(hash_id * block_tokens + offset, block_tokens - offset, block_size, parent)
            offset = 0
        else:
            hashes += _hash_id_blocks(parent, hash_id, block_tokens, block_size)
        parent = hashes[-1]
    del hashes[num_blocks:]
    return hashes


@lru_cache(maxsize=8192)
def _hash_id_blocks(parent: int, hash_id: int, block_tokens: int, block_size: int) -> list[int]:
    """The chained hashes of the blocks of one hash id after a block hashed to `parent`: one list
    that every call with these arguments shares (the memo's), read and never changed."""
    return id_run_hashes(hash_id * block_tokens, block_tokens, block_size, parent)


def hashed_block_events(step: int, seq: Any, first_block: int, block_ids: list[int],
                        hashes: list[int]) -> list[BlockHash | PromptBlocksHashed]:
    """The events of `seq`'s blocks `first_block`, ... (`block_ids`) registered under `hashes`: a
    BlockHash each, but for the full blocks of a hash-id prompt, whose hashes follow from its hash
    ids: one PromptBlocksHashed for those (a reader recomputes them: `hashed_blocks`)."""
    num_prompt_blocks = 0
    if not seq.has_tokens:      # a hash-id prompt (Sequence.has_tokens)
        num_prompt_blocks = max(0, min(len(block_ids), seq.num_prompt_tokens // seq.block_size - first_block))
    events: list[BlockHash | PromptBlocksHashed] = []
    if num_prompt_blocks:
        prompt, block_size = seq.prompt, seq.block_size
        first_hash_id = first_block * block_size // prompt.block_tokens
        end_hash_id = -(-(first_block + num_prompt_blocks) * block_size // prompt.block_tokens)
        parent = seq.block_hashes[first_block - 1] if first_block else NO_PARENT
        events.append(PromptBlocksHashed(step, seq.seq_id, block_ids[:num_prompt_blocks], first_block, block_size,
                                         parent, prompt.hash_ids[first_hash_id:end_hash_id], prompt.block_tokens))
    events += [BlockHash(step, seq.seq_id, block_id, h)
               for block_id, h in zip(block_ids[num_prompt_blocks:], hashes[num_prompt_blocks:])]
    return events
