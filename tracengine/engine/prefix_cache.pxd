# The C types of prefix_cache.py where Cython compiles it (the compiled core): the classes are
# extension types whose containers are typed, so a lookup, insert or evict indexes its lists and
# dicts directly, and moves each hash and block id as the object it is (never unboxed and reboxed).
cimport cython

from tracengine.engine.block_index cimport BlockIndex

cdef class PrefixCache:
    cdef public Py_ssize_t num_blocks, block_size
    cdef public BlockIndex hash_to_block_id
    cdef public dict token_ids
    cdef public list hashes
    cdef public object pool_queue

    cdef _cover(self, list block_ids)
    @cython.locals(index=BlockIndex)
    cdef _evicting(self, list block_ids)
    cdef _slots_up_to(self, Py_ssize_t end)
    @cython.locals(held=dict, size=Py_ssize_t, i=Py_ssize_t)
    cdef _hold_tokens(self, list block_ids, object token_ids)
    @cython.locals(index=BlockIndex, block_ids=list, i=Py_ssize_t, num_hashes=Py_ssize_t, warmed=Py_ssize_t)
    cpdef list lookup(self, list block_hashes, object tokens=*, Py_ssize_t limit=*)
    @cython.locals(hashes=list)
    cpdef insert(self, list block_ids, list block_hashes, object token_ids=*)
    @cython.locals(hashes=list, index=BlockIndex)
    cpdef evict(self, list block_ids)

cdef class VllmPrefixCache(PrefixCache):
    cdef public dict later_block_ids

    @cython.locals(hashes=list, index=BlockIndex)
    cpdef insert(self, list block_ids, list block_hashes, object token_ids=*)
    # a block id only indexes `hashes` here: a C index (checked, prefix_cache.py's first line)
    @cython.locals(hashes=list, index=BlockIndex, later=dict, block_id=Py_ssize_t)
    cpdef evict(self, list block_ids)
