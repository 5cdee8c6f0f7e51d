"""The synthetic runner's keys (sim/runners.py), hashed where the core is compiled: a token is
xxhash.xxh64_intdigest(f"{seed}:{seq_id}:{position}".encode()), whose bytes are written here into
64-bit words, none made, and hashed by the block hasher's xxh64 over words, a step's keys at once.
Cython compiles this module, its C types in synthetic_keys.pxd, and calls the block hasher's C
functions in C (it cimports the module); the Python core's runner hashes the bytes with the
xxhash library, and tests hold the two to each other."""
from tracengine.engine import block_hasher


def synthetic_tokens(seed: int, seq_ids: list[int], positions: list[int], vocab_size: int, eos: int) -> list[int]:
    """The synthetic runner's tokens (sim/runners.py), a batch at once: for each sequence,
    key_hash(seed, seq_id, position) % vocab_size, eos stepped over. Numbers that int64s hold
    and a positive vocabulary (else OverflowError)."""
    if vocab_size <= 0:
        raise OverflowError(f"a vocabulary of {vocab_size} tokens")
    if len(seq_ids) != len(positions):
        raise ValueError(f"{len(seq_ids)} seq_ids but {len(positions)} positions")
    prefix = [0] * 8     # b"{seed}:", the start of every key of the batch
    prefix_length = put_byte(prefix, put_decimal(prefix, 0, seed), 58)
    modulus = vocab_size
    tokens = [0] * len(seq_ids)
    for i in range(len(seq_ids)):
        seq_id = seq_ids[i]
        position = positions[i]
        token = prefixed_key_hash(prefix, prefix_length, seq_id, position) % modulus
        if token == eos:
            token = (token + 1) % vocab_size
        tokens[i] = token
    return tokens


def key_hash(seed: int, seq_id: int, position: int) -> int:
    """xxhash.xxh64_intdigest(f"{seed}:{seq_id}:{position}".encode()), its key's bytes written
    into words, none made."""
    prefix = [0] * 8
    return prefixed_key_hash(prefix, put_byte(prefix, put_decimal(prefix, 0, seed), 58), seq_id, position)


def prefixed_key_hash(prefix: list[int], prefix_length: int, seq_id: int, position: int) -> int:
    """key_hash of the key whose first `prefix_length` bytes, b"{seed}:", `prefix` holds."""
    words = [0] * 8     # the key's bytes, at most 3 * 20 + 2 of them
    for k in range(8):
        words[k] = prefix[k]
    length = put_decimal(words, prefix_length, seq_id)
    length = put_byte(words, length, 58)     # b":"
    length = put_decimal(words, length, position)
    return block_hasher.xxh64_words(words, 0, length)


def put_decimal(words: list[int], length: int, value: int) -> int:
    """Appends b"%d" % value to the bytes held in `words` (`length` of them); the new length."""
    magnitude = value
    if value < 0:
        length = put_byte(words, length, 45)     # b"-"
        magnitude = (block_hasher.MASK64 - magnitude + 1) & block_hasher.MASK64     # -value, as C's unsigned arithmetic has it
    return put_digits(words, length, magnitude)


# The bytes of the two digits of each number below 100 as a chunk (put_bytes): the first digit's low.
DIGIT_PAIRS = [(48 + i // 10) | (48 + i % 10) << 8 for i in range(100)]


def put_digits(words: list[int], length: int, magnitude: int) -> int:
    """put_decimal of a number that is not negative."""
    if magnitude >= 100_000_000:     # more than a chunk's eight: the digits before the last eight, then those
        length = put_digits(words, length, magnitude // 100_000_000)
        chunk = 0
        for _ in range(4):
            chunk = chunk << 16 | DIGIT_PAIRS[magnitude % 100]
            magnitude //= 100
        put_bytes(words, length, chunk)
        return length + 8
    # The digits last first, two at a time, each pair shifted in at the chunk's low end, so that its
    # low byte is the first digit (put_bytes).
    chunk = 0
    num_digits = 1
    while magnitude >= 100:
        chunk = chunk << 16 | DIGIT_PAIRS[magnitude % 100]
        magnitude //= 100
        num_digits += 2
    if magnitude >= 10:
        chunk = chunk << 16 | DIGIT_PAIRS[magnitude]
        num_digits += 1
    else:
        chunk = chunk << 8 | (48 + magnitude)
    put_bytes(words, length, chunk)
    return length + num_digits


def put_byte(words: list[int], at: int, byte: int) -> int:
    """Sets byte `at` (of bytes not set before) of those held in `words`; at + 1."""
    words[at >> 3] |= byte << 8 * (at & 7)
    return at + 1


def put_bytes(words: list[int], at: int, chunk: int) -> None:
    """Sets the bytes from `at` on (not set before) of those held in `words` to those of `chunk`,
    its low byte first, as many as it has that are not 0."""
    shift = 8 * (at & 7)
    words[at >> 3] |= (chunk << shift) & block_hasher.MASK64
    if shift and chunk >> (64 - shift):      # bytes past that word (never past the key's)
        words[(at >> 3) + 1] |= chunk >> (64 - shift)
