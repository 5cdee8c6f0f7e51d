"""The core's per-block arrays (engine/native.py): librt's packed `vec[i64]` in the compiled
core, lists in the Python core. The core uses only what both do alike; this holds them to it."""
import pytest

from tracengine.engine import native

librt_vecs = pytest.importorskip("librt.vecs")
i64 = pytest.importorskip("mypy_extensions").i64
FORMS = {"librt": (librt_vecs.vec, librt_vecs.extend, i64), "list": (native.ListOf(), native.extend_list, int)}


def exercise(vec, extend, i64):
    array = vec[i64]([-1, -2])
    seen = [len(array), array[-1], array[-2]]
    array = extend(array, iter([-3] * 5))
    array[0], array[len(array) - 1] = 7, -9
    array[-2] = array[0] + 1
    seen += [len(array), list(array), [x for x in array], array[3]]
    copy = vec[i64](array)
    copy[1] = 42
    seen += [list(array), list(copy), list(vec[i64]()), list(extend(vec[i64](), range(3)))]
    with pytest.raises(IndexError):
        array[len(array)]
    return seen


def test_the_python_cores_lists_do_what_the_compiled_cores_vec_does():
    assert exercise(*FORMS["list"]) == exercise(*FORMS["librt"])


def test_the_core_runs_on_the_arrays_of_the_core_chosen():
    from tracengine.engine.core_choice import COMPILED
    from tracengine.engine.block_pool import BlockPool
    pool = BlockPool(4)
    pool.get_new_blocks(2)
    assert type(pool.ref_counts) is (type(librt_vecs.vec[i64]()) if COMPILED else list)
    assert list(pool.ref_counts) == [1, 1]
