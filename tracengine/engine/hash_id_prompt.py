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
hash (a shared prefix repeats the same hash ids after the same parent: a memo, bounded).
A trace records the registration of such blocks as one PromptBlocksHashed, not a BlockHash
each: the hashes follow from the hash ids, and a reader recomputes them (`hashed_blocks`)."""
from collections.abc import Sequence as _Sequence
from typing import Any, Final

from tracengine.engine.block_hasher import hash_id_limit
from tracengine.engine.hash_id_blocks import prompt_block_hashes
from tracengine.trace.events import BlockHash, PromptBlocksHashed

MOONCAKE_BLOCK_TOKENS: Final = 512


class HashIdPrompt(_Sequence):
    """A read-only prompt of `num_tokens` tokens named by `hash_ids`, `block_tokens` tokens each
    (the last one perhaps cut). Indexing and slicing give the token ids it stands for."""
    __slots__ = ("hash_ids", "num_tokens", "block_tokens")

    def __init__(self, hash_ids: list[int], num_tokens: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        if block_tokens <= 0:
            raise ValueError(f"a hash id stands for a positive number of tokens, got {block_tokens}")
        if not 0 < num_tokens <= len(hash_ids) * block_tokens or num_tokens <= (len(hash_ids) - 1) * block_tokens:
            raise ValueError(f"{len(hash_ids)} hash ids of {block_tokens} tokens cannot hold a prompt of "
                             f"{num_tokens} tokens")
        if min(hash_ids) < 0:
            raise ValueError(f"a hash id is not negative, got {min(hash_ids)}")
        if max(hash_ids) >= hash_id_limit(block_tokens):
            raise ValueError(f"a hash id of {block_tokens} tokens is below {hash_id_limit(block_tokens)}, "
                             f"got {max(hash_ids)}")
        self.hash_ids = list(hash_ids)
        self.num_tokens = num_tokens
        self.block_tokens = block_tokens

    def __len__(self) -> int:
        return self.num_tokens

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return [self._token(p) for p in range(*key.indices(self.num_tokens))]
        if key < 0:
            key += self.num_tokens
        if not 0 <= key < self.num_tokens:
            raise IndexError("prompt index out of range")
        return self._token(key)

    def _token(self, p: int) -> int:
        return self.hash_ids[p // self.block_tokens] * self.block_tokens + p % self.block_tokens

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HashIdPrompt):
            return (self.hash_ids, self.num_tokens, self.block_tokens) == (other.hash_ids, other.num_tokens,
                                                                           other.block_tokens)
        return NotImplemented

    def __repr__(self) -> str:
        return f"HashIdPrompt({self.hash_ids!r}, {self.num_tokens}, {self.block_tokens})"

    def __reduce__(self) -> tuple[type["HashIdPrompt"], tuple[list[int], int, int]]:
        return HashIdPrompt, (self.hash_ids, self.num_tokens, self.block_tokens)

    def block_hashes(self, block_size: int) -> list[int]:
        """The chained hashes of its full blocks of `block_size` tokens: those of `list(self)`."""
        return prompt_block_hashes(self.hash_ids, self.block_tokens, block_size, 0, self.num_tokens // block_size)


def hashed_blocks(event: PromptBlocksHashed) -> list[BlockHash]:
    """The BlockHash events that `event` stands for, their hashes recomputed from its hash ids."""
    num_blocks, block_size, block_tokens = len(event.block_ids), event.block_size, event.hash_id_block_tokens
    first_token = event.first_block * block_size if block_size > 0 else -1
    if block_tokens <= 0 or first_token < 0 or len(event.hash_ids) * block_tokens < (
            first_token % block_tokens + num_blocks * block_size) or min(event.hash_ids, default=0) < 0 \
            or max(event.hash_ids, default=0) >= hash_id_limit(block_tokens):
        raise ValueError(f"{len(event.hash_ids)} hash ids of {block_tokens} tokens cannot hold blocks "
                         f"{event.first_block}.. ({num_blocks} of {block_size} tokens)")
    hashes = prompt_block_hashes(event.hash_ids, block_tokens, block_size, event.first_block, num_blocks,
                                 event.parent_hash)
    return [BlockHash(event.step, event.seq_id, block_id, h) for block_id, h in zip(event.block_ids, hashes)]


def request_prompt(event: Any) -> "list[int] | HashIdPrompt":
    """The prompt a RequestAdded event recorded: its token ids, or a HashIdPrompt of its hash ids."""
    if event.prompt_hash_ids:
        return HashIdPrompt(event.prompt_hash_ids, event.num_hash_id_prompt_tokens, event.hash_id_block_tokens)
    return event.prompt_token_ids
