# The C types of block_hasher.py where Cython compiles it (the compiled core): xxh64's words
# and lanes are unsigned 64-bit, so the Python's `& MASK64` after each step is C's own wrap.
cimport cython

cdef unsigned long long MASK64, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME64_5, LANE1_START, LANE4_START

@cython.locals(has_parent=bint, digest="unsigned long long", block=Py_ssize_t)
cpdef list chain_hashes(list tokens, long long first, Py_ssize_t start, Py_ssize_t block_size,
                        Py_ssize_t num_blocks, object parent)

@cython.locals(num_words=Py_ssize_t, j=Py_ssize_t, v1="unsigned long long", v2="unsigned long long",
               v3="unsigned long long", v4="unsigned long long", h="unsigned long long")
cdef unsigned long long block_digest(list tokens, long long first, Py_ssize_t offset, Py_ssize_t block_size,
                                     bint has_parent, unsigned long long parent) except? 0

@cython.locals(word="long long")
cdef unsigned long long block_word(list tokens, long long first, Py_ssize_t offset, Py_ssize_t j,
                                   bint has_parent, unsigned long long parent) except? 0

cdef unsigned long long xxh_round(unsigned long long acc, unsigned long long lane) noexcept
cdef unsigned long long merge_round(unsigned long long acc, unsigned long long lane) noexcept
cdef unsigned long long rotate_left(unsigned long long x, int bits) noexcept
