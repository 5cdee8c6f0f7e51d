"""A block's hash: xxh64 over its parent block's digest (8 bytes, little-endian) and its
token ids as little-endian int64s; the first block of a sequence has no parent. The
same bytes on every machine, so a `BlockHash` event agrees across machines, and a
block's hash stands for every token up to the end of that block (the chain).

Two forms of the one function. The Python core packs the bytes and hashes them with the
xxhash library (the reference). The compiled core (tracengine/compiled.py) is this module
compiled by Cython, its types in block_hasher.pxd: it runs xxh64 itself, over the block's
64-bit words as machine integers in one C array, and builds no bytes and no Python object
per token (`chain_hashes`; the same Python, whose masks keep every value to 64 bits as C's
unsigned arithmetic does). Tests hold the two to each other on both cores.

The synthetic runner's tokens (sim/runners.py), xxh64 of short keys' bytes, are hashed with the
same xxh64 over words where compiled (sim/synthetic_keys.py)."""
import struct
from collections.abc import Sequence
from functools import lru_cache
from typing import Final, TypeGuard

import xxhash

PARENT: Final = struct.Struct("<Q")   # a parent block's digest, as it starts its child's bytes
NO_PARENT: Final = -1
# Whether this module runs compiled: the compiled form hashes words, the Python bytes.
COMPILED: Final = not __file__.endswith(".py")


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as the little-endian int64s that the hash covers. A run of consecutive ids that
    are not negative (a hash-id prompt's blocks, hash_id_prompt.py) is packed as one number."""
    if is_id_run(token_ids):
        return pack_range(token_ids.start, len(token_ids))
    return struct.pack(f"<{len(token_ids)}q", *token_ids)


def is_id_run(token_ids: Sequence[int]) -> TypeGuard[range]:
    """Whether `token_ids` is a range of consecutive ids that are not negative and that int64s hold."""
    return isinstance(token_ids, range) and token_ids.step == 1 and token_ids.start >= 0 and token_ids.stop <= 2**63


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
    if COMPILED:
        try:
            if is_id_run(token_ids):
                return chain_hashes(None, token_ids.start, start, block_size, num_blocks, parent)
            if type(token_ids) is list:
                return chain_hashes(token_ids, 0, start, block_size, num_blocks, parent)
        except (OverflowError, TypeError):    # a token no int64 holds: the bytes say how, as always
            pass
    data = pack_tokens(token_ids[start:start + num_blocks * block_size])
    blocks = struct.iter_unpack(f"{block_size * 8}s", data)     # the blocks' bytes, one by one
    digest, pack_parent = xxhash.xxh64_intdigest, PARENT.pack
    hashes: list[int] = []
    if parent == NO_PARENT:      # the first block of a sequence has no parent
        parent = digest(next(blocks)[0])
        hashes.append(parent)
    hashes += [parent := digest(pack_parent(parent) + block) for (block,) in blocks]
    return hashes


def hash_id_limit(block_tokens: int) -> int:
    """The hash ids a prompt of `block_tokens`-token hash ids can hold are below this one: the
    last token of hash id h is h * block_tokens + block_tokens - 1, and a block hash packs its
    tokens as int64s (`pack_tokens`)."""
    return 2**63 // block_tokens


def id_run_hashes(first: int, num_tokens: int, block_size: int, parent: int = NO_PARENT) -> list[int]:
    """compute_hashes(range(first, first + num_tokens), block_size, parent): the blocks of a run of
    consecutive token ids (a hash id's, hash_id_blocks.py), hashed where compiled with no range made."""
    if COMPILED and 0 <= first and first + num_tokens <= 2**63 and 0 < block_size <= num_tokens:
        try:
            return chain_hashes(None, first, 0, block_size, num_tokens // block_size, parent)
        except (OverflowError, TypeError):    # as compute_hashes
            pass
    return compute_hashes(range(first, first + num_tokens), block_size, parent)


# xxh64 (github.com/Cyan4973/xxHash, XXH64 with seed 0) over bytes held as 64-bit words, eight
# bytes each, little-endian by value (so the same on every machine): a block's bytes are its
# parent's digest, if any, and its tokens, each one word.
MASK64: Final = 0xFFFF_FFFF_FFFF_FFFF
MASK32: Final = 0xFFFF_FFFF
PRIME64_1: Final = 0x9E3779B185EBCA87
PRIME64_2: Final = 0xC2B2AE3D27D4EB4F
PRIME64_3: Final = 0x165667B19E3779F9
PRIME64_4: Final = 0x85EBCA77C2B2AE63
PRIME64_5: Final = 0x27D4EB2F165667C5
LANE1_START: Final = 0x60EA27EEADC0B5D6     # (PRIME64_1 + PRIME64_2) mod 2**64
LANE4_START: Final = 0x61C8864E7A143579     # -PRIME64_1 mod 2**64
# The most tokens a block that `chain_hashes` takes holds: a block's words, its parent's digest
# and its tokens, are one array, BLOCK_WORDS, a C array of the module where compiled (16 KiB, made
# once: a block fills the words it needs); a larger block is hashed from its bytes.
MAX_WORDS_BLOCK: Final = 2048
BLOCK_WORDS = [0] * 2049     # MAX_WORDS_BLOCK + 1 (Cython reads the count as a literal)


def chain_hashes(tokens: list[int] | None, first: int, start: int, block_size: int, num_blocks: int,
                 parent: int, block_tokens: int = 0) -> list[int]:
    """compute_hashes(token_ids, block_size, parent, start) for `num_blocks` blocks, the tokens
    being `tokens` (a list) or, where it is None, `first`, `first + 1`, ... (a range), or where
    `block_tokens` is not 0, those that the hash ids `tokens` stand for (`hash_id_hashes`); a
    block holds at most MAX_WORDS_BLOCK tokens. A token no int64 holds raises OverflowError, one
    not an int TypeError (the bytes path takes it, or says why not)."""
    if block_size > MAX_WORDS_BLOCK:
        raise OverflowError(f"a block of {block_size} tokens is over {MAX_WORDS_BLOCK}")
    id_limit = hash_id_limit(block_tokens) if block_tokens > 0 else 0
    words = BLOCK_WORDS     # the block's words: its parent's digest, then its tokens
    hashes = [0] * num_blocks     # made at its length once, not grown block by block
    has_parent = parent != NO_PARENT
    if has_parent:
        words[0] = parent     # a digest: a C unsigned 64-bit where compiled (one out of its range raises OverflowError)
    at = start
    for i in range(num_blocks):
        if tokens is None:
            for j in range(block_size):
                words[1 + j] = (first + at + j) & MASK64
        elif block_tokens > 0:
            for j in range(block_size):
                hash_id = tokens[(at + j) // block_tokens]     # an unsigned 64-bit where compiled
                if hash_id < 0 or hash_id >= id_limit:
                    raise OverflowError(f"hash id {hash_id} of {block_tokens} tokens")
                words[1 + j] = hash_id * block_tokens + (at + j) % block_tokens
        else:
            for j in range(block_size):
                token = tokens[at + j]
                if type(token) is not int:     # (a bool, a float)
                    raise TypeError(f"token id {token!r} is not an int")
                word = token     # an int64 where compiled: one out of its range raises OverflowError
                words[1 + j] = word & MASK64
        if has_parent:
            digest = xxh64_words(words, 0, 8 * (block_size + 1))
        else:      # the first block of a sequence
            digest = xxh64_words(words, 1, 8 * block_size)
        hashes[i] = digest
        words[0] = digest
        has_parent = True
        at += block_size
    return hashes


def hash_id_hashes(hash_ids: list[int], block_tokens: int, start: int, block_size: int, num_blocks: int,
                   parent: int = NO_PARENT) -> list[int]:
    """The chained hashes of `num_blocks` blocks from token `start` on, the first one's parent
    `parent`, of the tokens that `hash_ids` stand for (hash_id_prompt.py): token p, counted from
    the first of hash_ids[0], is hash_ids[p // block_tokens] * block_tokens + p % block_tokens.
    Where compiled, the tokens are made in C, no list of them."""
    if COMPILED and num_blocks > 0:
        try:
            return chain_hashes(hash_ids, 0, start, block_size, num_blocks, parent, block_tokens)
        except (OverflowError, TypeError):    # a hash id no int64 holds the tokens of: the bytes say how
            pass
    tokens = [hash_ids[p // block_tokens] * block_tokens + p % block_tokens
              for p in range(start, start + num_blocks * block_size)]
    return compute_hashes(tokens, block_size, parent)


def xxh64_words(words: list[int], begin: int, length: int) -> int:
    """xxh64 of the `length` bytes held in words[begin:] (eight to a word, the first in its low byte)."""
    j = begin
    end = begin + (length >> 3)      # the words past the last whole one
    if length >= 32:     # 32-byte stripes, one word to each of the four lanes
        v1, v2, v3, v4 = LANE1_START, PRIME64_2, 0, LANE4_START
        while j + 4 <= end:
            v1 = xxh_round(v1, words[j])
            v2 = xxh_round(v2, words[j + 1])
            v3 = xxh_round(v3, words[j + 2])
            v4 = xxh_round(v4, words[j + 3])
            j += 4
        h = (rotate_left(v1, 1) + rotate_left(v2, 7) + rotate_left(v3, 12) + rotate_left(v4, 18)) & MASK64
        h = merge_round(merge_round(merge_round(merge_round(h, v1), v2), v3), v4)
    else:
        h = PRIME64_5
    h = (h + length) & MASK64
    while j < end:     # the whole words after the last stripe
        h ^= xxh_round(0, words[j])
        h = (rotate_left(h, 27) * PRIME64_1 + PRIME64_4) & MASK64
        j += 1
    rest = length & 7     # the bytes after the last whole word, in the low bytes of words[end]
    if rest:
        tail = words[end]
        if rest >= 4:
            h ^= ((tail & MASK32) * PRIME64_1) & MASK64
            h = (rotate_left(h, 23) * PRIME64_2 + PRIME64_3) & MASK64
            tail >>= 32
            rest -= 4
        while rest:
            h ^= ((tail & 0xFF) * PRIME64_5) & MASK64
            h = (rotate_left(h, 11) * PRIME64_1) & MASK64
            tail >>= 8
            rest -= 1
    h ^= h >> 33
    h = (h * PRIME64_2) & MASK64
    h ^= h >> 29
    h = (h * PRIME64_3) & MASK64
    return h ^ (h >> 32)


def xxh_round(acc: int, lane: int) -> int:
    acc = (acc + lane * PRIME64_2) & MASK64
    return (rotate_left(acc, 31) * PRIME64_1) & MASK64


def merge_round(acc: int, lane: int) -> int:
    return ((acc ^ xxh_round(0, lane)) * PRIME64_1 + PRIME64_4) & MASK64


def rotate_left(x: int, bits: int) -> int:
    return ((x << bits) | (x >> (64 - bits))) & MASK64
