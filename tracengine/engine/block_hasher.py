"""A block's hash: xxh64 over its parent block's digest (8 bytes, little-endian) and its
token ids as little-endian int64s; the first block of a sequence has no parent. The
same bytes on every machine, so a `BlockHash` event agrees across machines, and a
block's hash stands for every token up to the end of that block (the chain)."""
import struct
from collections.abc import Sequence
from functools import lru_cache
from typing import Final

import xxhash

PARENT: Final = struct.Struct("<Q")   # a parent block's digest, as it starts its child's bytes
NO_PARENT: Final = -1


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as the little-endian int64s that the hash covers. A run of consecutive ids that
    are not negative (a hash-id prompt's blocks, hash_id_prompt.py) is packed as one number."""
    if isinstance(token_ids, range) and token_ids.step == 1 and token_ids.start >= 0 and token_ids.stop <= 2**63:
        return pack_range(token_ids.start, len(token_ids))
    return struct.pack(f"<{len(token_ids)}q", *token_ids)


def pack_range(first: int, n: int) -> bytes:
    """pack_tokens(range(first, first + n)), 0 <= first and first + n <= 2**63: the bytes of the
    number whose base-2**64 digits, lowest first, are first, first + 1, ... (no digit carries)."""
    ones, steps = _range_digits(n)
    return (first * ones + steps).to_bytes(8 * n, "little")


@lru_cache(maxsize=64)
def _range_digits(n: int) -> tuple[int, int]:
    """The numbers whose n base-2**64 digits are all 1, and 0, 1, ..., n - 1."""
    return sum(1 << 64 * i for i in range(n)), sum(i << 64 * i for i in range(n))


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
