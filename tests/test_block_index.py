"""The prefix cache's index (engine/block_index.py) does what a dict does on every operation the
prefix cache uses: its Python form, and where the core is compiled its compiled form, are held to
a dict over random runs of lookups, registrations and removals (a table that grows, and removals
that move the hashes after them back), keys that are not 64-bit hashes included."""
import importlib.util
import random

import pytest

import tracengine.compiled as compiled
from tracengine.engine import block_index
from tracengine.engine.prefix_cache import PrefixCache, VllmPrefixCache


def python_block_index():
    """block_index.py run as Python, whichever form `import` gives."""
    spec = importlib.util.spec_from_file_location("block_index_as_python", compiled.source_path(block_index.__name__))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FORMS = {"python": python_block_index().BlockIndex, "imported": block_index.BlockIndex}


def random_key(rng: random.Random, pool: list):
    roll = rng.random()
    if roll < 0.5 and pool:
        return rng.choice(pool)      # one seen before: found, or removed since
    if roll < 0.9:
        return rng.choice([rng.getrandbits(64), rng.randrange(64), 2**64 - 1, 0])
    return rng.choice([-1, -2**70, 2**64, 2**80 + 3, "h", (1, 2)])     # not a 64-bit hash: kept aside


def check_same(index, reference: dict):
    assert len(index) == len(reference)
    assert dict(index.items()) == reference and index == reference
    assert sorted(index.keys(), key=repr) == sorted(reference, key=repr)
    assert sorted(index.values()) == sorted(reference.values())


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("seed", range(6))
def test_the_index_does_what_a_dict_does(form, seed):
    rng = random.Random(seed)
    index, reference, pool = FORMS[form](), {}, []
    for step in range(6000 if seed % 2 else 1500):
        h = random_key(rng, pool)
        pool.append(h)
        if step % 97 == 0:      # a read ahead: it changes nothing, whatever the keys
            start = rng.randrange(len(pool))
            index.warm(pool, start, rng.randrange(start, len(pool) + 1))
            index.warm_blocks(pool, [rng.randrange(len(pool)) for _ in range(rng.randrange(20))])
        op = rng.random()
        if op < 0.3:
            block_id = rng.randrange(2**40)
            assert index.setdefault(h, block_id) == reference.setdefault(h, block_id)
        elif op < 0.45:
            block_id = rng.randrange(100_000)
            index[h] = reference[h] = block_id
        elif op < 0.7:
            if h in reference:
                del index[h]
                del reference[h]
            else:
                with pytest.raises(KeyError):
                    del index[h]
        else:
            assert index.get(h) == reference.get(h) and index.get(h, -5) == reference.get(h, -5)
            assert (h in index) == (h in reference)
            if h in reference:
                assert index[h] == reference[h]
            else:
                with pytest.raises(KeyError):
                    index[h]
        if step % 500 == 0:
            check_same(index, reference)
    check_same(index, reference)
    copy = index.copy()
    index.update([(h, 1) for h in list(reference)[:50]])
    reference_copy = dict(reference)
    reference.update((h, 1) for h in list(reference)[:50])
    check_same(index, reference)
    check_same(copy, reference_copy)


@pytest.mark.parametrize("form", FORMS)
def test_a_full_table_of_neighbours_grows_and_empties_in_any_order(form):
    """Consecutive hashes (a test's small ints) fill runs of neighbouring slots: the table grows
    past them, and removing them in any order leaves every other one found."""
    rng = random.Random(3)
    index = FORMS[form]()
    keys = list(range(5000)) + [rng.getrandbits(64) for _ in range(5000)]
    for i, h in enumerate(keys):
        index[h] = i
    assert index.capacity >= 2 * len(keys) and len(index) == len(keys)
    rng.shuffle(keys)
    alive = dict(index.items())
    for h in keys[:7000]:
        del index[h]
        del alive[h]
        if len(alive) % 700 == 0:
            assert all(index.get(k) == v for k, v in alive.items())
    assert dict(index.items()) == alive


@pytest.mark.parametrize("cache_class", [PrefixCache, VllmPrefixCache])
def test_the_prefix_caches_index_is_the_table_where_compiled_and_a_dict_where_not(cache_class):
    index = cache_class(16, 4).hash_to_block_id
    import tracengine.engine.core_choice as core_choice
    assert type(index) is (block_index.BlockIndex if core_choice.COMPILED else dict)
