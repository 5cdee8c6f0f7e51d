"""What the compiled core's classes say to mypyc (tracengine/compiled.py), and the forms the
core keeps its per-block data in, picked by the core that runs.

- `mypyc_attr`: mypy_extensions' where it is installed, a decorator that does nothing where it is
  not (the pure-Python core needs none).
- `vec`, `extend`, `i64`: a block's links in the free queue and its reference count are machine
  integers in one array per kind. To mypyc (which reads the TYPE_CHECKING branch) they are
  librt's `vec[i64]`, a packed array its code indexes natively, storing no Python object per
  element. The compiled core runs on librt's; the Python core runs on lists, which interpreted
  code indexes faster. The core uses only what both do alike: `vec[i64](items)`, an index read or
  write, `len`, iteration, and `extend(array, items)`, which returns the array grown (the caller
  keeps the result and drops the old name, as librt's may return a new array).
- `new_block_index`: the prefix cache's index, hash -> block id: the compiled core's table of
  machine words (engine/block_index.py), the Python core's dict, which interpreted code indexes
  faster."""
from typing import TYPE_CHECKING

import tracengine.engine.core_choice as core_choice
from tracengine.engine.block_index import BlockIndex

try:
    from mypy_extensions import mypyc_attr
except ImportError:
    def mypyc_attr(*attrs: str, **kwattrs: object):  # type: ignore[no-redef,misc]
        return lambda cls: cls

if TYPE_CHECKING:
    from librt.vecs import extend as extend, vec as vec
    from mypy_extensions import i64 as i64
else:
    class ListOf:
        """`vec[i64]` in the Python core: `vec[i64](items)` is `list(items)`."""

        def __getitem__(self, item_type: type) -> type:
            return list

    def extend_list(array: list, items) -> list:
        """librt's `extend` for a list: grown in place."""
        array.extend(items)
        return array

    if core_choice.COMPILED:
        from librt.vecs import extend, vec
        from mypy_extensions import i64
    else:
        i64, vec, extend = int, ListOf(), extend_list


def new_block_index() -> BlockIndex | dict[int, int]:
    """An empty hash -> block id index, in the form the core that runs keeps it."""
    return BlockIndex() if core_choice.COMPILED else {}
