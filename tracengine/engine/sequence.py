"""Per-request state. The engine numbers sequences and passes the block
size in: no process-wide counters, so two engines and a replay agree."""
from enum import Enum, auto
from typing import Any

from tracengine.engine.block_hasher import compute_hashes
from tracengine.engine.hash_id_prompt import HashIdPrompt
from tracengine.engine.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    __slots__ = ("seq_id", "status", "prompt", "completion", "last_token", "num_tokens", "num_prompt_tokens",
                 "num_cached_tokens", "num_scheduled_tokens", "is_prefill", "block_table",
                 "block_size", "temperature", "max_tokens", "ignore_eos", "top_k", "top_p", "seed",
                 "num_preemptions", "finish_reason", "block_hashes", "num_completion_tokens",
                 "has_tokens", "spec_token_ids")

    def __init__(self, seq_id: int, token_ids: list[int] | HashIdPrompt, block_size: int,
                 sampling_params: SamplingParams | None = None) -> None:
        """`token_ids`: a list, or a HashIdPrompt (a prompt known by its hash ids)."""
        sp = sampling_params if sampling_params is not None else SamplingParams()
        self.seq_id = seq_id
        self.status = SequenceStatus.WAITING
        # Tokens only ever append, to `completion`: a read-only HashIdPrompt is kept as it is; a
        # list is copied, as its owner may change it.
        self.prompt: list[int] | HashIdPrompt = token_ids if isinstance(token_ids, HashIdPrompt) else list(token_ids)
        self.completion: list[int] = []
        self.last_token: int = self.prompt[-1] if self.prompt else -1   # empty: the scheduler refuses it
        self.num_tokens = len(self.prompt)
        self.num_prompt_tokens = self.num_tokens
        self.num_completion_tokens = 0   # num_tokens - num_prompt_tokens, kept: read for every token
        self.num_cached_tokens = 0       # tokens whose KV is in the cache
        self.num_scheduled_tokens = 0    # tokens to compute this step
        self.is_prefill = True           # prefill_first: until first decoded; mixed: while prompt tokens remain
        self.block_table: list[int] = []
        # Draft tokens (engine/spec_decode.py): proposed after its step, the ones its next step
        # verifies once scheduled (the scheduler cuts them to what it scheduled), none after it
        self.spec_token_ids: list[int] = []
        self.block_size = block_size
        self.temperature: float = sp.temperature
        self.max_tokens: int = sp.max_tokens
        self.ignore_eos: bool = sp.ignore_eos
        self.top_k: int = sp.top_k
        self.top_p: float = sp.top_p
        self.seed: int | None = sp.seed
        self.num_preemptions = 0
        self.finish_reason = ""      # "eos" or "length" once finished
        # The chained hashes of its full blocks (block_hasher.py), as vLLM's Request.block_hashes:
        # the prompt's now, a block filled by decoding when it is registered (hash_full_blocks).
        # A hash-id prompt has its hashes from its hash ids, and no tokens for the prefix cache to compare.
        self.has_tokens = not isinstance(token_ids, HashIdPrompt)
        self.block_hashes: list[int] = (token_ids.block_hashes(block_size) if isinstance(token_ids, HashIdPrompt)
                                        else compute_hashes(self.prompt, block_size))

    def __len__(self) -> int:
        return self.num_tokens

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            return self.token_ids[key]
        if key < 0:
            key += self.num_tokens
            if key < 0:
                raise IndexError("sequence index out of range")
        return self.prompt[key] if key < self.num_prompt_tokens else self.completion[key - self.num_prompt_tokens]

    def __repr__(self) -> str:
        return (f"Sequence(seq_id={self.seq_id}, status={self.status.name}, num_tokens={self.num_tokens}, "
                f"num_cached_tokens={self.num_cached_tokens}, block_table={self.block_table})")

    def hash_full_blocks(self) -> list[int]:
        """block_hashes, extended over the full blocks filled since they were last hashed
        (tokens only ever append)."""
        hashes, size = self.block_hashes, self.block_size
        start = len(hashes) * size
        if self.num_tokens - start >= size:
            hashes += compute_hashes(self.tokens(start, self.num_tokens), size, hashes[-1] if hashes else -1)
        return hashes

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def token_ids(self) -> list[int]:
        """All the tokens, prompt and completion, as a new list."""
        return [*self.prompt, *self.completion]

    def tokens(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] (0 <= start <= end <= num_tokens), a new list, without joining the
        prompt and completion first."""
        n = self.num_prompt_tokens
        if end <= n:
            return self.prompt[start:end]
        if start >= n:
            return self.completion[start - n:end - n]
        return self.prompt[start:] + self.completion[:end - n]

    @property
    def prompt_token_ids(self) -> list[int] | HashIdPrompt:
        """The prompt: the sequence's own list (or the read-only HashIdPrompt it was given)."""
        return self.prompt

    @property
    def completion_token_ids(self) -> list[int]:
        return self.completion[:]

    @property
    def num_blocks(self) -> int:
        return (self.num_tokens + self.block_size - 1) // self.block_size

    def block(self, i: int) -> list[int]:
        assert 0 <= i < self.num_blocks
        return self.tokens(i * self.block_size, min((i + 1) * self.block_size, self.num_tokens))

    def append_token(self, token_id: int) -> None:
        self.completion.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1
        self.num_completion_tokens += 1
