"""One row of a workload file, its fields checked: numbers, lengths scaled, token ids, and a
Mooncake row's hash ids as the tokens they name."""
import math
import random
import struct
from functools import lru_cache
from itertools import chain

from tracengine.engine.block_hasher import hash_id_limit
from tracengine.engine.hash_id_prompt import HashIdPrompt
from tracengine.errors import TracengineError

MOONCAKE_BLOCK_TOKENS = 512          # each Mooncake hash id names a block of 512 prompt tokens


def scale_length(n: int, length_scale: float) -> int:
    return n if length_scale == 1.0 else max(1, round(n * length_scale))


def require_field(record: dict, name: str, where: str):
    if name not in record:
        raise TracengineError(f"{where}: missing field {name!r}")
    return record[name]


def integer_field(value, name: str, where: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TracengineError(f"{where}: {name} must be an integer, got {value!r}")
    if value < minimum:
        kind = "negative" if value < 0 else f"below {minimum}"
        raise TracengineError(f"{where}: {name} is {kind} ({value}); it must be at least {minimum}")
    return value


def number_field(value, name: str, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise TracengineError(f"{where}: {name} must be a finite number, got {value!r}")
    return float(value)


def block_token_ids(block_id: int, num_tokens: int, vocab_size: int) -> tuple[int, ...]:
    """The made-up tokens of a named block: the same id gives the same tokens in every
    request and every run, so prompts that share ids share prefixes."""
    raw = random.Random(block_id).randbytes(4 * num_tokens)
    return tuple(v % vocab_size for v in struct.unpack(f"<{num_tokens}I", raw))


@lru_cache(maxsize=4096)
def _mooncake_block(block_id: int, num_tokens: int, vocab_size: int) -> tuple[int, ...]:
    """A named block's tokens, made once for the requests that share it."""
    return block_token_ids(block_id, num_tokens, vocab_size)


def token_ids(prompt, where: str, vocab_size: int, length_scale: float) -> list[int]:
    """A line's `prompt_token_ids`, checked, cut by a length scale below 1."""
    if not isinstance(prompt, list) or not prompt:
        raise TracengineError(f"{where}: prompt_token_ids must be a non-empty list of token ids")
    for token in prompt:
        if not (isinstance(token, int) and not isinstance(token, bool) and 0 <= token < vocab_size):
            raise TracengineError(f"{where}: token id {token!r} is outside the vocabulary of {vocab_size}")
    if length_scale > 1.0:
        raise TracengineError(f"{where}: --length-scale above 1 cannot lengthen given token ids")
    return prompt[:scale_length(len(prompt), length_scale)]


def hash_id_tokens(hash_ids, input_length: int, where: str, vocab_size: int, length_scale: float,
                   hash_id_prompts: bool, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[int] | HashIdPrompt:
    """A Mooncake prompt of `input_length` tokens from its hash ids of `block_tokens` tokens (512:
    Mooncake's; a Dynamo agentic trace names its own): a HashIdPrompt (`hash_id_prompts`), else each
    named block's made-up tokens. A scaled block keeps ceil(block_tokens * X) tokens, so the scaled
    prompt still fits in its hash ids and requests that share ids still share prefixes."""
    block_len = max(1, math.ceil(block_tokens * length_scale))
    if not isinstance(hash_ids, list):
        raise TracengineError(f"{where}: hash_ids must be a list of integers, got {hash_ids!r}")
    needed = -(-input_length // block_tokens)
    if len(hash_ids) != needed:    # one per block: more would name blocks the prompt does not have
        raise TracengineError(f"{where}: input_length {input_length} needs {needed} hash_ids of "
                              f"{block_tokens} tokens, got {len(hash_ids)}"
                              f"{' (more than its blocks)' if len(hash_ids) > needed else ''}")
    num_tokens = scale_length(input_length, length_scale)
    block_ids = hash_ids[:-(-num_tokens // block_len)]
    # each an int (not a bool: its type is bool) of at least 0, checked at once, one by one for the error
    if not set(map(type, block_ids)) <= {int} or min(block_ids, default=0) < 0:
        for hash_id in block_ids:
            integer_field(hash_id, "a hash id", where, 0)
    # refused in every run, not only a simulation's hash-id prompts: a file means the same to each command
    limit = hash_id_limit(block_len)
    if block_ids and max(block_ids) >= limit:
        power = f" (2**{limit.bit_length() - 1})" if limit & (limit - 1) == 0 else ""
        raise TracengineError(f"{where}: hash id {max(block_ids)} is too large: a hash id names its "
                              f"{block_len} tokens as 64-bit ids, so it must be below {limit}{power}")
    if hash_id_prompts:
        return HashIdPrompt(block_ids, num_tokens, block_len)
    prompt = list(chain.from_iterable(_mooncake_block(i, block_len, vocab_size) for i in block_ids))
    del prompt[num_tokens:]
    return prompt


def text_prompt(record: dict, where: str, length_scale: float) -> str:
    """A row's `prompt`: non-empty text, which no --length-scale can cut (token ids can be)."""
    prompt = record["prompt"]
    if not isinstance(prompt, str) or not prompt:
        raise TracengineError(f"{where}: prompt must be a non-empty string")
    if length_scale != 1.0:
        raise TracengineError(f"{where}: a text prompt cannot be scaled by --length-scale (give prompt_token_ids)")
    return prompt
