"""The synthetic runner's token is xxh64 of the bytes f"{seed}:{seq_id}:{position}" modulo the
vocabulary, whichever core samples it: the Python hashes the bytes with the xxhash library, the
compiled core (sim/synthetic_keys.synthetic_tokens, a batch at once) writes them into machine words
and hashes those. Both are held here to the library, at the edges of what int64s hold and past
them."""
import importlib.util
import random

import pytest
import xxhash
from test_block_hasher_forms import PYTHON

import tracengine.compiled as compiled
from tracengine.engine import block_hasher
from tracengine.engine.sequence import Sequence
from tracengine.sim import synthetic_keys
from tracengine.sim.runners import SyntheticRunner


def python_synthetic_keys():
    """synthetic_keys.py run as Python, whichever form `import` gives, over the block hasher run as
    Python (its functions read the module they call through at each call)."""
    spec = importlib.util.spec_from_file_location("synthetic_keys_as_python", compiled.source_path(synthetic_keys.__name__))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.block_hasher = PYTHON
    return module


PYTHON_KEYS = python_synthetic_keys()

EDGES = [0, 1, 9, 10, 99, 100, 10**8 - 1, 10**8, 10**16, 2**63 - 1, -1, -9, -10, -2**63, 10**18, 10**18 - 1]


def reference(seed: int, seq_id: int, position: int) -> int:
    return xxhash.xxh64_intdigest(f"{seed}:{seq_id}:{position}".encode())


def reference_tokens(seed: int, seq_ids: list[int], positions: list[int], vocab_size: int, eos: int) -> list[int]:
    tokens = [reference(seed, seq_id, position) % vocab_size for seq_id, position in zip(seq_ids, positions)]
    return [(token + 1) % vocab_size if token == eos else token for token in tokens]


def random_key(rng: random.Random) -> tuple[int, int, int]:
    return tuple(rng.choice([rng.choice(EDGES), rng.randrange(-2**63, 2**63), rng.randrange(0, 10**6)])
                 for _ in range(3))


def test_key_hash_run_as_python_is_the_xxhash_of_the_keys_bytes():
    rng = random.Random(3)
    for _ in range(500):
        key = random_key(rng)
        assert PYTHON_KEYS.key_hash(*key) == reference(*key)
    seq_ids, positions = [0, 5, 2**40, -7], [1, 99_999, 3, 12]
    assert PYTHON_KEYS.synthetic_tokens(9, seq_ids, positions, 1000, 17) == reference_tokens(9, seq_ids, positions, 1000, 17)


@pytest.mark.skipif(not block_hasher.COMPILED, reason="the core is not compiled here")
def test_the_compiled_hasher_gives_the_librarys_tokens_and_refuses_what_no_int64_holds():
    rng = random.Random(5)
    keys = [random_key(rng) for _ in range(20_000)]
    for key in keys:
        assert synthetic_keys.key_hash(*key) == reference(*key)
    seed = keys[0][0]
    seq_ids, positions = [key[1] for key in keys], [key[2] for key in keys]
    for vocab_size in (1, 2, 1000, 151_936, 2**63 - 1):
        eos = reference(seed, seq_ids[0], positions[0]) % vocab_size     # stepped over where it comes up
        assert synthetic_keys.synthetic_tokens(seed, seq_ids, positions, vocab_size, eos) == \
            reference_tokens(seed, seq_ids, positions, vocab_size, eos)
    for args in [(2**63, [0], [0], 10, -1), (0, [-2**63 - 1], [0], 10, -1), (0, [0], [2**64], 10, -1),
                 (0, [0], [0], 0, -1), (0, [0], [0], -5, -1), (0, [0], [0], 2**63, -1)]:
        with pytest.raises(OverflowError):
            synthetic_keys.synthetic_tokens(*args)
    with pytest.raises(ValueError):
        synthetic_keys.synthetic_tokens(0, [1, 2], [3], 10, -1)


def sequences(seq_ids: list[int]) -> list[Sequence]:
    seqs = []
    for seq_id, (num_tokens, num_cached, num_scheduled) in zip(seq_ids, [(10, 9, 1), (30, 0, 30), (1500, 1499, 1),
                                                                         (5, 4, 1), (123457, 123456, 1)]):
        seq = Sequence(seq_id, list(range(num_tokens)), 16)
        seq.num_cached_tokens, seq.num_scheduled_tokens = num_cached, num_scheduled
        seqs.append(seq)
    return seqs


@pytest.mark.parametrize("seed, vocab_size, seq_ids", [
    (0, 1000, [0, 1, 2, 3, 4]),
    (7, 50, [10, 2**40, 299, 3, 12]),
    (-3, 151_936, [5, 6, 7, 8, 9]),
    (2**63, 1000, [0, 1, 2, 3, 4]),            # a seed no int64 holds: the bytes, as always
    (1, 2**64, [0, 1, 2, 3, 4]),               # nor a vocabulary
    (1, 1000, [2**63, -2**63 - 1, 1, 2, 3]),   # nor some seq_ids
    (0, 1, [0, 1, 2, 3, 4]),
])
def test_a_synthetic_token_is_the_hash_of_its_key_whichever_path_samples_it(seed, vocab_size, seq_ids):
    seqs = sequences(seq_ids)
    for eos in (-1, reference(seed, seq_ids[0], 10) % vocab_size):     # eos is stepped over
        runner = SyntheticRunner(vocab_size=vocab_size, seed=seed, eos=eos)
        expected = reference_tokens(seed, [seq.seq_id for seq in seqs],
                                    [seq.num_cached_tokens + seq.num_scheduled_tokens for seq in seqs], vocab_size, eos)
        assert runner.run(seqs, False) == expected
        # the compiled core's batch, whichever core this is; compiled, None where run samples the bytes
        in_range = -2**63 <= seed < 2**63 and 0 < vocab_size < 2**63 and all(-2**63 <= s < 2**63 for s in seq_ids)
        assert runner._run_compiled(seqs) == (expected if in_range or not block_hasher.COMPILED else None)


def test_the_compiled_loop_puts_eos_where_eos_at_says_and_verifies_drafts_as_run_does():
    seqs = sequences([0, 1, 2, 3, 4])
    seqs[3].num_completion_tokens = 2
    seqs[1].spec_token_ids = [7, 8]
    runner = SyntheticRunner(vocab_size=50, seed=7, eos=3, eos_at={3: 2, 1: 1})
    assert runner._run_compiled(seqs) == runner.run(seqs, False)
    assert runner._run_compiled(seqs)[3] == 3 and isinstance(runner._run_compiled(seqs)[1], list)
