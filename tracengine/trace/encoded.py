"""Token ids that carry their msgpack encoding, made once by the reader that hands
the prompt over instead of by every run that takes it: per shared block for a
Mooncake prompt (its hash ids' 512-token blocks; 1,000 prompts hold 13.9 million
tokens but 3 million distinct ones), in one piece for the other readers' prompts
and a recorded workload's (workload.formats.encoded_prompt).

`parts`, the encoding in pieces: joined after the array's header they are the
bytes msgspec writes for the list, so a trace writer copies them instead of
encoding every token, and the trace is the same byte for byte (TraceWriter)."""
import msgspec

_encode = msgspec.msgpack.Encoder().encode


def array_header(length: int) -> bytes:
    """The msgpack head of an array of `length` items (fixarray, array 16 or array 32)."""
    if length < 16:
        return bytes((0x90 | length,))
    if length < 0x10000:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


def encoded_items(token_ids) -> bytes:
    """The msgpack encoding of `token_ids`' items, without the array's head: pieces that
    join into the encoding of their concatenation."""
    return _encode(token_ids)[len(array_header(len(token_ids))):]     # a tuple encodes as an array too


def _read_only(self, *args, **kwargs):
    raise TypeError("EncodedTokens are read-only: their encoding would be stale")


class EncodedTokens(list):
    """A read-only list of token ids with `parts` (encoded_items of consecutive slices of
    it). In memory it is the list; `msgpack()` is its encoding."""
    __slots__ = ("parts",)

    def __init__(self, token_ids, parts: tuple[bytes, ...]):
        list.__init__(self, token_ids)
        self.parts = tuple(parts)

    @classmethod
    def from_pieces(cls, pieces, num_tokens: int) -> "EncodedTokens":
        """The first `num_tokens` of the concatenated pieces, each (token ids, encoded_items of
        them); only the last piece may be cut (its encoding is made again, cut)."""
        tokens = cls((), ())
        for piece in pieces:
            list.extend(tokens, piece[0])
        parts = [piece[1] for piece in pieces]
        cut = len(tokens) - num_tokens
        if cut > 0:
            last = pieces[-1][0]
            if cut >= len(last):
                raise ValueError(f"{len(tokens)} tokens in pieces cut to {num_tokens}: more than the last piece")
            list.__delitem__(tokens, slice(num_tokens, None))
            parts[-1] = encoded_items(last[:len(last) - cut])
        tokens.parts = tuple(parts)
        return tokens

    def msgpack(self) -> bytes:
        """The bytes msgspec's msgpack encoder writes for this list."""
        return array_header(len(self)) + b"".join(self.parts)

    def __reduce__(self):        # pickled (sweep workers) as it is, its encodings and all
        return EncodedTokens, (list(self), self.parts)

    append = extend = insert = pop = remove = clear = sort = reverse = _read_only
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only
