"""The prefix cache's index in the compiled core: a block hash -> the block holding it, with
what a dict of them does for the prefix cache (prefix_cache.py), in one open-addressed table
of machine words.

A dict finds a key through a slot of its index, an entry, and the key's own object: three
places in memory, which for the index of 100,000 blocks' hashes are three cache misses a
lookup. Here a hash and its block id sit side by side in one array of 64-bit words (a hash
in [0, 2**64), as block_hasher.py makes them; a block id below 2**63), so a lookup reads one
place: the slot the hash's high bits after one multiply name (Fibonacci hashing), and the
next ones while they hold other hashes (linear probing). A removal moves the hashes after it
back (backward-shift deletion), so no tombstone lengthens a later search; the table doubles
when half full. A key that is not such a hash (a test's, another engine's) is kept in a dict.

The table is larger than a core's caches, so a search waits on memory. Where many come at once
(a lookup's hashes, the blocks a step registers or hands out again), `warm` reads the slot each
will start at first, in a loop of nothing but reads, which the processor keeps in flight together.

Cython compiles this module where the core is compiled (tracengine/compiled.py), its types in
the .pxd beside it; the Python core uses a dict itself (engine/native.py), which interpreted code
indexes faster than this table. tests/test_block_index.py holds both forms of the table to a
dict on every operation the prefix cache uses."""
from array import array
from collections.abc import Iterable, Iterator
from typing import Any, Final

MASK64: Final = 0xFFFFFFFFFFFFFFFF     # a product kept to 64 bits, as C's unsigned arithmetic keeps it
NO_BLOCK: Final = 0xFFFFFFFFFFFFFFFF   # the block id of an empty slot (a block id is below 2**63)
SPREAD: Final = 0x9E3779B97F4A7C15     # 2**64 / the golden ratio: a hash's slot is its product's high bits
MIN_CAPACITY: Final = 1024      # slots, a power of two
HASH_LIMIT: Final = 1 << 64     # the table holds the ints in [0, HASH_LIMIT): 64-bit hashes
LINE_WORDS: Final = 8           # the words of a 64-byte cache line: four slots


class BlockIndex:
    """hash -> block id. `slots` holds each slot's hash and block id, one after the other."""

    def __init__(self) -> None:
        self.others: dict[Any, int] = {}     # the keys that are not 64-bit hashes
        self.warmth = 0     # what `warm` read, kept so that its reads are not left out
        self.homes = array("q")     # `warm`'s first slots, made once and grown as the table is
        self._allocate(MIN_CAPACITY)

    def _allocate(self, capacity: int) -> None:
        """`capacity` empty slots (a power of two)."""
        self.slots = array("Q", [0, NO_BLOCK]) * capacity
        self.capacity = capacity
        self.shift = 65 - int(capacity).bit_length()     # the product's top log2(capacity) bits name the slot
        self.size = 0

    def _home(self, h: int) -> int:
        """The slot where a search for `h` starts."""
        return ((h * SPREAD) & MASK64) >> self.shift

    def _find(self, h: int) -> int:
        """The slot holding `h`, or the empty one where it would go."""
        mask = self.capacity - 1
        i = self._home(h)
        while self.slots[2 * i + 1] != NO_BLOCK and self.slots[2 * i] != h:
            i = (i + 1) & mask
        return i

    def warm(self, hashes: list[Any], start: int, stop: int) -> None:
        """Read the slot where the search for each of hashes[start:stop] starts, before any of
        the searches: the table is larger than a core's caches, and a loop that does nothing but
        read, the slots named first, has its reads in flight at once, where each search alone
        would wait for its slot in turn."""
        if len(self.homes) < stop - start:
            self.homes = array("q", bytes(8 * max(stop - start, 2 * len(self.homes))))
        homes = self.homes
        n = 0
        for k in range(start, stop):
            h = hashes[k]
            if is_hash(h):
                homes[n] = 2 * self._home(h)
                n += 1
        self._read_slots(homes, n)

    def warm_blocks(self, hashes: list[Any], block_ids: list[int]) -> None:
        """`warm` for the hash each of `block_ids` holds: hashes[block_id]. The hash objects are
        gathered first, in a loop that does nothing else: made long before, each is a cache miss,
        and there their reads are in flight together."""
        held = [hashes[block_id] for block_id in block_ids]
        self.warm(held, 0, len(held))

    def _read_slots(self, homes: "array[int]", n: int) -> None:
        """Read the first n slots `homes` names (as word indexes), and the line after each: a
        search, or a removal's shift, may go on there."""
        total, slots, last = self.warmth, self.slots, 2 * self.capacity - 1
        for k in range(n):
            total = (total + slots[homes[k]] + slots[(homes[k] + LINE_WORDS) & last]) & MASK64
        self.warmth = total     # kept, so that the reads are not left out as unused

    def get(self, h: Any, default: Any = None) -> Any:
        if not is_hash(h):
            return self.others.get(h, default)
        i = self._find(h)
        block_id = self.slots[2 * i + 1]
        return default if block_id == NO_BLOCK else block_id

    def setdefault(self, h: Any, block_id: int) -> int:
        """The block `h` maps to, mapped to `block_id` first if it maps to none."""
        if not is_hash(h):
            return self.others.setdefault(h, block_id)
        return self._setdefault(h, block_id)

    def _setdefault(self, h: int, block_id: int) -> int:
        i = self._find(h)
        found = self.slots[2 * i + 1]
        if found != NO_BLOCK:
            return found
        self._put(i, h, block_id)
        return block_id

    def __getitem__(self, h: Any) -> int:
        block_id = self.get(h)
        if block_id is None:
            raise KeyError(h)
        return block_id

    def __setitem__(self, h: Any, block_id: int) -> None:
        if is_hash(h):
            self._set(h, block_id)
        else:
            self.others[h] = block_id

    def _set(self, h: int, block_id: int) -> None:
        i = self._find(h)
        if self.slots[2 * i + 1] != NO_BLOCK:
            self.slots[2 * i + 1] = block_id
        else:
            self._put(i, h, block_id)

    def _put(self, i: int, h: int, block_id: int) -> None:
        """`h` -> `block_id` into empty slot `i` (`_find`'s), the table grown first if half full."""
        if 2 * (self.size + 1) > self.capacity:
            self._grow()
            i = self._find(h)
        self.slots[2 * i] = h
        self.slots[2 * i + 1] = block_id
        self.size += 1

    def _grow(self) -> None:
        """Twice the slots, every hash in its place among them."""
        old = self.slots
        self._allocate(2 * self.capacity)
        for k in range(0, len(old), 2):
            if old[k + 1] != NO_BLOCK:
                i = self._find(old[k])
                self.slots[2 * i] = old[k]
                self.slots[2 * i + 1] = old[k + 1]
                self.size += 1

    def __delitem__(self, h: Any) -> None:
        if not is_hash(h):
            del self.others[h]
        elif not self._remove(h):
            raise KeyError(h)

    def _remove(self, h: int) -> bool:
        """Take `h` out; False where it is not in."""
        i = self._find(h)
        if self.slots[2 * i + 1] == NO_BLOCK:
            return False
        self._remove_at(i)
        return True

    def _remove_at(self, i: int) -> None:
        """Empty slot `i`, moving back each hash after it that a search would no longer reach."""
        slots, mask = self.slots, self.capacity - 1
        j = i
        while True:
            j = (j + 1) & mask
            if slots[2 * j + 1] == NO_BLOCK:
                break
            # the hash in j moves to i unless its search starts after i (cyclically, up to j)
            if (j - self._home(slots[2 * j])) & mask >= (j - i) & mask:
                slots[2 * i] = slots[2 * j]
                slots[2 * i + 1] = slots[2 * j + 1]
                i = j
        slots[2 * i] = 0
        slots[2 * i + 1] = NO_BLOCK
        self.size -= 1

    def __contains__(self, h: Any) -> bool:
        return self.get(h) is not None

    def __len__(self) -> int:
        return self.size + len(self.others)

    def items(self) -> list[tuple[Any, int]]:
        """(hash, block id) of each entry: the table's in slot order, then the others'."""
        slots = self.slots
        pairs: list[tuple[Any, int]] = [(slots[k], slots[k + 1]) for k in range(0, len(slots), 2)
                                        if slots[k + 1] != NO_BLOCK]
        return pairs + list(self.others.items())

    def keys(self) -> list[Any]:
        return [h for h, _ in self.items()]

    def values(self) -> list[int]:
        return [block_id for _, block_id in self.items()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def update(self, pairs: Iterable[tuple[Any, int]]) -> None:
        for h, block_id in pairs:
            self[h] = block_id

    def copy(self) -> "BlockIndex":
        other = BlockIndex()
        other.slots, other.capacity, other.shift, other.size = array("Q", self.slots), self.capacity, self.shift, self.size
        other.others = dict(self.others)
        return other

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (BlockIndex, dict)):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"BlockIndex({dict(self.items())!r})"


def is_hash(h: Any) -> bool:
    """Whether the table holds `h` (a 64-bit hash), not its dict of others."""
    return type(h) is int and 0 <= h < HASH_LIMIT
