# The C types of synthetic_keys.py where Cython compiles it (the compiled core): a key's bytes in a
# C array of 64-bit words; the block hasher's xxh64 over words and its masks are C (cimported).
cimport cython

from tracengine.engine cimport block_hasher

@cython.locals(prefix="unsigned long long[8]", prefix_length=Py_ssize_t, modulus="unsigned long long", tokens=list,
               i=Py_ssize_t, seq_id="long long", position="long long", token="long long")
cpdef list synthetic_tokens(long long seed, list seq_ids, list positions, long long vocab_size, long long eos)

@cython.locals(prefix="unsigned long long[8]")
cpdef unsigned long long key_hash(long long seed, long long seq_id, long long position) noexcept

@cython.locals(words="unsigned long long[8]", k=int, length=Py_ssize_t)
cdef unsigned long long prefixed_key_hash(unsigned long long *prefix, Py_ssize_t prefix_length, long long seq_id,
                                          long long position) noexcept

@cython.locals(magnitude="unsigned long long")
cdef Py_ssize_t put_decimal(unsigned long long *words, Py_ssize_t length, long long value) noexcept

cdef unsigned long long DIGIT_PAIRS[100]

@cython.locals(chunk="unsigned long long", num_digits=int)
cdef Py_ssize_t put_digits(unsigned long long *words, Py_ssize_t length, unsigned long long magnitude) noexcept

@cython.locals(shift=int)
cdef void put_bytes(unsigned long long *words, Py_ssize_t at, unsigned long long chunk) noexcept
cdef Py_ssize_t put_byte(unsigned long long *words, Py_ssize_t at, unsigned long long byte) noexcept
