"""The block hasher's two forms give the same hashes: the Python's bytes hashed by the xxhash
library (the reference), and xxh64 over machine words (`chain_hashes`), which the compiled
core runs. The word form is checked here as Python too, so a reader can hold it against the
reference without a compiler; and where the core is compiled, the compiled module against the
Python one, errors included."""
import importlib.util
import random

import pytest
import xxhash

import tracengine.compiled as compiled
from tracengine.engine import block_hasher
from tracengine.engine.block_hasher import NO_PARENT


def python_block_hasher():
    """block_hasher.py run as Python, whichever form `import` gives."""
    spec = importlib.util.spec_from_file_location("block_hasher_as_python", compiled.source_path(block_hasher.__name__))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not module.COMPILED
    return module


PYTHON = python_block_hasher()
EDGES = [0, 1, 2**31, 2**32 - 1, 2**63 - 1, -1, -2**63]


def random_case(rng: random.Random):
    block_size = rng.choice([1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 32, 64])
    tokens = [rng.choice([rng.randrange(0, 150_000), rng.randrange(-2**63, 2**63), rng.choice(EDGES)])
              for _ in range(rng.randrange(0, 160))]
    parent = rng.choice([NO_PARENT, 0, 2**64 - 1, rng.randrange(0, 2**64)])
    start = rng.randrange(0, len(tokens) + 1)
    return tokens, block_size, parent, start


def test_the_word_form_run_as_python_is_the_xxhash_of_the_bytes():
    rng = random.Random(7)
    for _ in range(300):
        tokens, block_size, parent, start = random_case(rng)
        num_blocks = (len(tokens) - start) // block_size
        if num_blocks <= 0:
            continue
        expected = PYTHON.compute_hashes(tokens, block_size, parent, start)      # bytes, the xxhash library
        assert PYTHON.chain_hashes(tokens, 0, start, block_size, num_blocks, parent) == expected
        first = rng.randrange(0, 2**40)
        run = range(first, first + len(tokens))
        assert PYTHON.chain_hashes(None, first, start, block_size, num_blocks, parent) == \
            PYTHON.compute_hashes(run, block_size, parent, start)


def test_one_block_of_the_word_form_is_xxh64_of_its_parent_and_tokens():
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    data = (1234).to_bytes(8, "little") + b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)
    assert PYTHON.chain_hashes(tokens, 0, 0, 8, 1, 1234) == [xxhash.xxh64_intdigest(data)]
    assert PYTHON.chain_hashes(tokens[:2], 0, 0, 2, 1, NO_PARENT) == [xxhash.xxh64_intdigest(data[8:24])]


@pytest.mark.skipif(not block_hasher.COMPILED, reason="the core is not compiled here")
def test_the_compiled_hasher_gives_the_pythons_hashes():
    rng = random.Random(11)
    for _ in range(2000):
        tokens, block_size, parent, start = random_case(rng)
        assert block_hasher.compute_hashes(tokens, block_size, parent, start) == \
            PYTHON.compute_hashes(tokens, block_size, parent, start)
        first = rng.randrange(0, 2**62)
        run = range(first, first + len(tokens))
        assert block_hasher.compute_hashes(run, block_size, parent, start) == \
            PYTHON.compute_hashes(run, block_size, parent, start)


@pytest.mark.skipif(not block_hasher.COMPILED, reason="the core is not compiled here")
@pytest.mark.parametrize("tokens", [[2**63] * 4, [-2**63 - 1] * 4, [1.5] * 4, [True] * 4, ["a"] * 4,
                                    (1, 2, 3, 4), range(2**63 - 4, 2**63)])
def test_the_compiled_hasher_takes_and_refuses_what_the_python_does(tokens):
    def outcome(module):
        try:
            return module.compute_hashes(tokens, 4)
        except Exception as error:      # the same error, whichever form raised it
            return type(error), str(error)
    assert outcome(block_hasher) == outcome(PYTHON)


def test_a_block_over_the_word_forms_capacity_is_hashed_from_its_bytes():
    size = PYTHON.MAX_WORDS_BLOCK + 1
    tokens = list(range(3 * size))
    with pytest.raises(OverflowError):
        PYTHON.chain_hashes(tokens, 0, 0, size, 3, NO_PARENT)
    expected = PYTHON.compute_hashes(tokens, size)
    assert block_hasher.compute_hashes(tokens, size) == expected
    assert block_hasher.compute_hashes(range(3 * size), size) == expected
    assert block_hasher.compute_hashes(tokens, PYTHON.MAX_WORDS_BLOCK) == \
        PYTHON.chain_hashes(tokens, 0, 0, PYTHON.MAX_WORDS_BLOCK, 3, NO_PARENT)


def test_the_tokens_hash_ids_stand_for_hash_as_their_list_does():
    """Blocks that straddle hash ids hash the tokens the ids stand for, made in C where compiled."""
    rng = random.Random(13)
    for _ in range(300):
        block_tokens, block_size = rng.choice([(16, 6), (512, 48), (7, 3), (5, 16), (512, 16)])
        hash_ids = [rng.choice([rng.randrange(0, 50), rng.randrange(0, 2**63 // block_tokens)])
                    for _ in range(rng.randrange(1, 8))]
        start = rng.randrange(0, block_tokens)
        num_blocks = max(0, (len(hash_ids) * block_tokens - start) // block_size - rng.randrange(0, 2))
        parent = rng.choice([NO_PARENT, rng.randrange(0, 2**64)])
        tokens = [hash_ids[p // block_tokens] * block_tokens + p % block_tokens
                  for p in range(start, start + num_blocks * block_size)]
        expected = PYTHON.compute_hashes(tokens, block_size, parent)
        assert block_hasher.hash_id_hashes(hash_ids, block_tokens, start, block_size, num_blocks, parent) == expected
        if num_blocks:
            assert PYTHON.chain_hashes(hash_ids, 0, start, block_size, num_blocks, parent, block_tokens) == expected
    big = [2**63 // 16]      # its tokens are past what int64s hold: the bytes refuse them, as for its list
    with pytest.raises(Exception) as refused:
        block_hasher.hash_id_hashes(big, 16, 0, 6, 2)
    with pytest.raises(refused.type):
        PYTHON.compute_hashes([big[0] * 16 + p for p in range(12)], 6)


@pytest.mark.parametrize("module", [block_hasher, PYTHON], ids=["as imported", "as python"])
def test_a_run_of_token_ids_hashes_as_its_range(module):
    """id_run_hashes(first, n, ...) is compute_hashes(range(first, first + n), ...), errors included:
    compiled, it hashes the run with no range made."""
    def outcome(function, *args):
        try:
            return function(*args)
        except Exception as error:      # the same error, whichever form raised it
            return type(error), str(error)
    rng = random.Random(17)
    cases = [(2**63 - 32, 32, 16), (2**63 - 31, 32, 16), (-5, 40, 8), (0, 15, 16), (0, 0, 16), (3, 20, 0),
             (0, 3 * (PYTHON.MAX_WORDS_BLOCK + 1), PYTHON.MAX_WORDS_BLOCK + 1)]
    cases += [(rng.choice([rng.randrange(0, 2**40), rng.randrange(0, 2**63)]), rng.randrange(0, 600),
               rng.choice([1, 3, 16, 64])) for _ in range(200)]
    for first, num_tokens, block_size in cases:
        for parent in (NO_PARENT, 0, 2**64 - 1, rng.randrange(0, 2**64)):
            assert outcome(module.id_run_hashes, first, num_tokens, block_size, parent) == \
                outcome(PYTHON.compute_hashes, range(first, first + num_tokens), block_size, parent)
