# The C types of block_hasher.py where Cython compiles it (the compiled core): xxh64's words
# and lanes are unsigned 64-bit, so the Python's `& MASK64` after each step is C's own wrap, and
# a list of words made as `[0] * n` is a C array of n of them.
cimport cython

# The masks are C constants, which the compiler folds away (a C unsigned 64-bit value needs none;
# the .py's assignments to them are the Python's)
cdef extern from *:
    """
    #define TRACENGINE_MASK64 0xFFFFFFFFFFFFFFFFULL
    #define TRACENGINE_MASK32 0xFFFFFFFFULL
    """
    const unsigned long long MASK64 "TRACENGINE_MASK64"
    const unsigned long long MASK32 "TRACENGINE_MASK32"

cdef unsigned long long PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME64_5, LANE1_START, LANE4_START
cdef Py_ssize_t MAX_WORDS_BLOCK
cdef unsigned long long BLOCK_WORDS[2049]

cpdef bint is_id_run(object token_ids)     # a C call from compute_hashes

@cython.locals(words="unsigned long long *", hashes=list, i=Py_ssize_t, has_parent=bint, digest="unsigned long long",
               at=Py_ssize_t, j=Py_ssize_t, word="long long", hash_id="unsigned long long",
               id_limit="unsigned long long")
cpdef list chain_hashes(list tokens, long long first, Py_ssize_t start, Py_ssize_t block_size,
                        Py_ssize_t num_blocks, object parent, long long block_tokens=*)

@cython.locals(j=Py_ssize_t, end=Py_ssize_t, rest=Py_ssize_t, v1="unsigned long long", v2="unsigned long long",
               v3="unsigned long long", v4="unsigned long long", h="unsigned long long", tail="unsigned long long")
cdef unsigned long long xxh64_words(unsigned long long *words, Py_ssize_t begin, Py_ssize_t length) noexcept

cdef unsigned long long xxh_round(unsigned long long acc, unsigned long long lane) noexcept
cdef unsigned long long merge_round(unsigned long long acc, unsigned long long lane) noexcept
cdef unsigned long long rotate_left(unsigned long long x, int bits) noexcept
