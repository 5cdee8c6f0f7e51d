"""The synthetic runner's token is xxh64 of the bytes f"{seed}:{seq_id}:{position}" modulo the
vocabulary, whichever core samples it: the Python hashes the bytes with the xxhash library, the
compiled core (block_hasher.key_hash) writes them into machine words and hashes those. Both are
held here to the library, at the edges of what int64s hold and past them."""
import random

import pytest
import xxhash

from tracengine.engine import block_hasher
from tracengine.engine.sequence import Sequence
from tracengine.sim.runners import SyntheticRunner
from test_block_hasher_forms import PYTHON

EDGES = [0, 1, 9, 10, 99, 100, 2**63 - 1, -1, -9, -10, -2**63, 10**18, 10**18 - 1, 10**19 - 1 - 2**63]


def reference(seed: int, seq_id: int, position: int, modulus: int) -> int:
    return xxhash.xxh64_intdigest(f"{seed}:{seq_id}:{position}".encode()) % modulus


def random_key(rng: random.Random) -> tuple[int, int, int, int]:
    seed, seq_id, position = (rng.choice([rng.choice(EDGES), rng.randrange(-2**63, 2**63), rng.randrange(0, 10**6)])
                              for _ in range(3))
    return seed, seq_id, position, rng.choice([1, 2, 1000, 151_936, 2**63 - 1, rng.randrange(1, 2**63)])


def test_key_hash_run_as_python_is_the_xxhash_of_the_keys_bytes():
    rng = random.Random(3)
    for _ in range(500):
        key = random_key(rng)
        assert PYTHON.key_hash(*key) == reference(*key)


@pytest.mark.skipif(not block_hasher.COMPILED, reason="the core is not compiled here")
def test_the_compiled_key_hash_gives_the_librarys_and_refuses_what_no_int64_holds():
    rng = random.Random(5)
    for _ in range(20_000):
        key = random_key(rng)
        assert block_hasher.key_hash(*key) == reference(*key)
    for key in [(2**63, 0, 0, 10), (0, -2**63 - 1, 0, 10), (0, 0, 2**64, 10), (0, 0, 0, 0), (0, 0, 0, -5), (0, 0, 0, 2**63)]:
        with pytest.raises(OverflowError):
            block_hasher.key_hash(*key)


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
    for eos in (-1, reference(seed, seq_ids[0], 10, vocab_size)):     # eos is stepped over
        runner = SyntheticRunner(vocab_size=vocab_size, seed=seed, eos=eos)
        expected = []
        for seq in seqs:
            token = reference(seed, seq.seq_id, seq.num_cached_tokens + seq.num_scheduled_tokens, vocab_size)
            expected.append((token + 1) % vocab_size if token == eos else token)
        assert runner.run(seqs, False) == expected
        assert runner._run_compiled(seqs) == expected       # the compiled core's loop, whichever core this is


def test_the_compiled_loop_puts_eos_where_eos_at_says_and_verifies_drafts_as_run_does():
    seqs = sequences([0, 1, 2, 3, 4])
    seqs[3].num_completion_tokens = 2
    seqs[1].spec_token_ids = [7, 8]
    runner = SyntheticRunner(vocab_size=50, seed=7, eos=3, eos_at={3: 2, 1: 1})
    assert runner._run_compiled(seqs) == runner.run(seqs, False)
    assert runner._run_compiled(seqs)[3] == 3 and isinstance(runner._run_compiled(seqs)[1], list)
