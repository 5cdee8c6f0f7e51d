# The C types of block_index.py where Cython compiles it (the compiled core): the slots are a C
# array of unsigned 64-bit words (the array's buffer), a hash and a slot's index C integers, so a
# search is a loop over machine words; the constants are C's (the .py's assignments are the Python's).
cimport cython

cdef extern from *:
    """
    #define TRACENGINE_INDEX_ALL_ONES 0xFFFFFFFFFFFFFFFFULL
    #define TRACENGINE_INDEX_SPREAD 0x9E3779B97F4A7C15ULL
    """
    const unsigned long long MASK64 "TRACENGINE_INDEX_ALL_ONES"
    const unsigned long long NO_BLOCK "TRACENGINE_INDEX_ALL_ONES"
    const unsigned long long SPREAD "TRACENGINE_INDEX_SPREAD"

cdef Py_ssize_t MIN_CAPACITY
cdef object HASH_LIMIT
cdef Py_ssize_t LINE_WORDS

cdef class BlockIndex:
    cdef unsigned long long[::1] slots
    cdef public Py_ssize_t capacity, size
    cdef int shift
    cdef public dict others
    cdef unsigned long long warmth
    cdef long long[::1] homes

    cdef _allocate(self, Py_ssize_t capacity)
    cdef inline Py_ssize_t _home(self, unsigned long long h) noexcept
    @cython.locals(k=Py_ssize_t, n=Py_ssize_t, homes="long long[::1]")
    cpdef warm(self, list hashes, Py_ssize_t start, Py_ssize_t stop)
    @cython.locals(held=list, block_id=Py_ssize_t)
    cpdef warm_blocks(self, list hashes, list block_ids)
    @cython.locals(total="unsigned long long", k=Py_ssize_t, last=Py_ssize_t, slots="unsigned long long[::1]")
    cdef _read_slots(self, long long[::1] homes, Py_ssize_t n)
    @cython.locals(mask=Py_ssize_t, i=Py_ssize_t)
    cdef Py_ssize_t _find(self, unsigned long long h) noexcept
    @cython.locals(i=Py_ssize_t, block_id="unsigned long long")
    cpdef object get(self, object h, object default=*)
    cpdef object setdefault(self, object h, object block_id)
    @cython.locals(i=Py_ssize_t, found="unsigned long long")
    cdef object _setdefault(self, unsigned long long h, object block_id)
    @cython.locals(i=Py_ssize_t)
    cdef _set(self, unsigned long long h, unsigned long long block_id)
    cdef _put(self, Py_ssize_t i, unsigned long long h, unsigned long long block_id)
    @cython.locals(i=Py_ssize_t)
    cdef bint _remove(self, unsigned long long h)
    @cython.locals(old="unsigned long long[::1]", k=Py_ssize_t, i=Py_ssize_t)
    cdef _grow(self)
    @cython.locals(slots="unsigned long long[::1]", mask=Py_ssize_t, j=Py_ssize_t)
    cdef _remove_at(self, Py_ssize_t i)

cpdef bint is_hash(object h)
