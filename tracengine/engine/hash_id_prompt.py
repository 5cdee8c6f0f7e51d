"""A prompt known by its hash ids, as Mooncake's traces give it: each hash id names a block
of `block_tokens` tokens (512 in Mooncake), and prompts that share leading hash ids share
those tokens. It is never expanded into tokens: the block manager sees a sequence through
its block hashes, and these come from the hash ids.

The tokens a hash id stands for are defined so that a prompt of them hashes to the same
blocks: the token at position p of the prompt is `hash_ids[p // block_tokens] *
block_tokens + p % block_tokens` (its hash id and its place in that hash id's block).
A token-id prompt of those ids (`list(prompt)`, its twin) hashes to the same chained
block hashes and schedules the same way. Only a model needs real tokens: a hash-id
prompt runs in simulation (and replay, what-if, diff) only.

Block hashes are the chain of block_hasher.compute_hashes over those tokens. When the
KV block size divides `block_tokens`, a hash id's blocks are hashed once per parent
hash (a shared prefix repeats the same hash ids after the same parent: a memo, bounded)."""
from collections.abc import Sequence as _Sequence
from functools import lru_cache

from tracengine.engine.block_hasher import NO_PARENT, compute_hashes

MOONCAKE_BLOCK_TOKENS = 512


class HashIdPrompt(_Sequence):
    """A read-only prompt of `num_tokens` tokens named by `hash_ids`, `block_tokens` tokens each
    (the last one perhaps cut). Indexing and slicing give the token ids it stands for."""
    __slots__ = ("hash_ids", "num_tokens", "block_tokens")

    def __init__(self, hash_ids: list[int], num_tokens: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS):
        if block_tokens <= 0:
            raise ValueError(f"a hash id stands for a positive number of tokens, got {block_tokens}")
        if not 0 < num_tokens <= len(hash_ids) * block_tokens or num_tokens <= (len(hash_ids) - 1) * block_tokens:
            raise ValueError(f"{len(hash_ids)} hash ids of {block_tokens} tokens cannot hold a prompt of "
                             f"{num_tokens} tokens")
        if min(hash_ids) < 0:
            raise ValueError(f"a hash id is not negative, got {min(hash_ids)}")
        self.hash_ids = list(hash_ids)
        self.num_tokens = num_tokens
        self.block_tokens = block_tokens

    def __len__(self) -> int:
        return self.num_tokens

    def __getitem__(self, key):
        if isinstance(key, slice):
            return [self._token(p) for p in range(*key.indices(self.num_tokens))]
        if key < 0:
            key += self.num_tokens
        if not 0 <= key < self.num_tokens:
            raise IndexError("prompt index out of range")
        return self._token(key)

    def _token(self, p: int) -> int:
        return self.hash_ids[p // self.block_tokens] * self.block_tokens + p % self.block_tokens

    def __eq__(self, other) -> bool:
        if isinstance(other, HashIdPrompt):
            return (self.hash_ids, self.num_tokens, self.block_tokens) == (other.hash_ids, other.num_tokens,
                                                                           other.block_tokens)
        return NotImplemented

    def __repr__(self) -> str:
        return f"HashIdPrompt({self.hash_ids!r}, {self.num_tokens}, {self.block_tokens})"

    def __reduce__(self):
        return HashIdPrompt, (self.hash_ids, self.num_tokens, self.block_tokens)

    def block_hashes(self, block_size: int) -> list[int]:
        """The chained hashes of its full blocks of `block_size` tokens: those of `list(self)`."""
        size = self.block_tokens
        if size % block_size:      # blocks straddle hash ids: hashed from the tokens they stand for
            return compute_hashes(self, block_size)
        num_full = self.num_tokens // block_size
        hashes: list[int] = []
        parent = NO_PARENT
        for hash_id in self.hash_ids:
            if len(hashes) >= num_full:
                break
            hashes += _hash_id_blocks(parent, hash_id, size, block_size)
            parent = hashes[-1]
        del hashes[num_full:]
        return hashes


@lru_cache(maxsize=8192)
def _hash_id_blocks(parent: int, hash_id: int, block_tokens: int, block_size: int) -> tuple[int, ...]:
    """The chained hashes of the blocks of one hash id after a block hashed to `parent`."""
    first = hash_id * block_tokens
    return tuple(compute_hashes(range(first, first + block_tokens), block_size, parent))


def request_prompt(event):
    """The prompt a RequestAdded event recorded: its token ids, or a HashIdPrompt of its hash ids."""
    if event.prompt_hash_ids:
        return HashIdPrompt(event.prompt_hash_ids, event.num_hash_id_prompt_tokens, event.hash_id_block_tokens)
    return event.prompt_token_ids
