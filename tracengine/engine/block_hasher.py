"""A block's hash: xxh64 over its parent block's digest (8 bytes, little-endian) and its
token ids as little-endian int64s; the first block of a sequence has no parent. The
same bytes on every machine, so a `BlockHash` event agrees across machines, and a
block's hash stands for every token up to the end of that block (the chain)."""
import struct
from collections.abc import Sequence
from typing import Final

import xxhash

PARENT: Final = struct.Struct("<Q")   # a parent block's digest, as it starts its child's bytes
NO_PARENT: Final = -1


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as the little-endian int64s that the hash covers."""
    return struct.pack(f"<{len(token_ids)}q", *token_ids)


def compute_hash(token_ids: Sequence[int], parent: int = NO_PARENT) -> int:
    """The hash of one block of `token_ids` whose parent block hashed to `parent`."""
    data = pack_tokens(token_ids)
    if parent != NO_PARENT:
        data = PARENT.pack(parent) + data
    return xxhash.xxh64_intdigest(data)


def compute_hashes(token_ids: Sequence[int], block_size: int, parent: int = NO_PARENT, start: int = 0) -> list[int]:
    """The chained hashes of the full blocks of `token_ids[start:]`, the first one's parent
    `parent`: each equal to `compute_hash(block, parent)`, the tokens packed once for all."""
    num_blocks = (len(token_ids) - start) // block_size
    if num_blocks <= 0:
        return []
    data = pack_tokens(token_ids[start:start + num_blocks * block_size])
    blocks = struct.iter_unpack(f"{block_size * 8}s", data)     # the blocks' bytes, one by one
    digest, pack_parent = xxhash.xxh64_intdigest, PARENT.pack
    hashes: list[int] = []
    if parent == NO_PARENT:      # the first block of a sequence has no parent
        parent = digest(next(blocks)[0])
        hashes.append(parent)
    hashes += [parent := digest(pack_parent(parent) + block) for (block,) in blocks]
    return hashes
