"""The CPU tier's eviction order: vLLM 0.33's LRUCachePolicy (vllm/v1/kv_offload/cpu/policies/lru.py).

A block is ranked (a, -position): `a` from one counter. A request takes the next value when it
first uses a block (stores it, finds it stored, loads it), and ranks its blocks (a, -position),
raising a block's rank, never lowering it; when it finishes, its blocks take the next values in
turn, tail first, so its head is the most recent. The least ranked readable block that no load
reads is evicted first.

vLLM keeps the evictable blocks in a heap, a push a block and a pop or two an eviction. Here the
ranks fall in bands that never interleave nor share: a request's (a, -p) for its one `a`, here
a * POSITIONS + (POSITIONS - 1 - p), and a finish's run of values, here (its first value, i) for
its i-th block, the counter still moving past the run, which orders them as vLLM's ranks are
ordered. A rank's band is its int >> 40: a request's `a`, a finish's first value, each a value
of the counter no other band takes, and a block has one rank in a band. A band is a group: its
blocks' keys in a deque in rank order, and a heap orders the groups (one entry a group, not a
block). A request's blocks become evictable head to tail (their stores end in the order they
were offered), so each run of them goes to the front of its group at once; a finish's group is
built in order. A key in a group is current while its block is evictable and ranked in the
group's band: a block ranked anew, evicted or read by a load leaves stale keys, which are
skipped. A finished request's blocks are all ranked anew, so its band's group is dropped whole.
A block that arrives out of order (a load's, released in the middle of its band) goes to a heap
of its own, as the int rank << 64 | key, checked against the block's rank when it is taken."""
import heapq
from collections import deque
from itertools import filterfalse

POSITION_BITS = 40
POSITIONS = 1 << POSITION_BITS     # a rank (a, -position) is the int a * POSITIONS + POSITIONS - 1 - position
KEY_BITS = 64           # an entry of the others' heap is rank << KEY_BITS | key (a block hash: 64 bits)
KEY_MASK = (1 << KEY_BITS) - 1
TAKEN = -2              # a block's reference count while an eviction holds it


class LruPolicy:
    """`ranks`: every block the tier holds -> its rank. `busy`: the tier's reference counts that
    are not 0 (a block being written or read, or taken by an eviction): a block held and not busy
    is evictable."""

    def __init__(self, busy: dict[int, int]):
        self.busy = busy
        self.ranks: dict[int, int] = {}
        self.groups: dict[int, deque] = {}       # band -> its keys, least ranked first
        self.group_heap: list[int] = []          # the bands with keys (some perhaps emptied since)
        self.others: list[int] = []              # a heap of the entries that came out of order
        self.next_rank = 0
        self.request_ranks: dict[int, int] = {}  # seq_id -> its rank, given when first needed

    def request_rank(self, seq_id: int) -> int:
        rank = self.request_ranks.get(seq_id)
        if rank is None:
            self.next_rank += 1
            rank = self.request_ranks[seq_id] = self.next_rank
        return rank

    def request_base(self, seq_id: int) -> int:
        """A request's rank at position 0: its rank at position p is this minus p."""
        return self.request_rank(seq_id) * POSITIONS + POSITIONS - 1

    def insert_n(self, keys: list[int], seq_id: int, positions):
        """New blocks a request stores, at their `positions` (one for each key, in turn)."""
        self.ranks.update(zip(keys, map(self.request_base(seq_id).__sub__, positions)))

    def access(self, keys: list[int], positions, seq_id: int):
        """A request's first use of `keys`, head to tail, at their `positions`: each held one
        ranked no lower than (its rank, minus its position)."""
        base = self.request_base(seq_id)      # its rank given now even when no key is held yet
        ranks, busy = self.ranks, self.busy
        raised = [(key, rank) for key, rank, current in zip(keys, map(base.__sub__, positions), map(ranks.get, keys))
                  if current is not None and current < rank]
        if raised:
            ranks.update(raised)
            evictable = [key for key, _ in raised if key not in busy]
            if evictable:
                self.mark_evictable_n(evictable)

    def finish(self, keys_head_first: list[int], seq_id: int):
        """The request finished: its blocks the tier holds ranked anew, tail first, head last.
        Every block of its band is one of them, so the band's group is all stale: dropped."""
        request_rank = self.request_ranks.pop(seq_id, None)
        if request_rank is not None:
            self.groups.pop(request_rank, None)      # its heap entry goes when it comes first
        ranks = self.ranks
        keys = list(filter(ranks.__contains__, reversed(keys_head_first)))
        if not keys:
            return
        band = self.next_rank + 1
        self.next_rank += len(keys)
        ranks.update(zip(keys, range(band * POSITIONS, band * POSITIONS + len(keys))))
        group = deque(filterfalse(self.busy.__contains__, keys))
        if group and band not in self.groups:       # the band is new: it has no group yet
            self.groups[band] = group
            heapq.heappush(self.group_heap, band)
        elif group:
            for key in group:
                self._place(key)

    def mark_evictable_n(self, keys):
        """`keys` (no longer busy) become evictable. Those of one store (one band, head to
        tail: ranks falling) go to the front of their group at once."""
        ranks = list(map(self.ranks.__getitem__, keys))
        band = ranks[0] >> POSITION_BITS
        group = self.groups.get(band)
        if group:
            self._trim(group, band)
        # one band's blocks head to tail fall in rank, whether the band is a request's or a finish's
        if ranks[-1] >> POSITION_BITS == band and all(map(int.__gt__, ranks, ranks[1:])) and \
                (not group or ranks[0] < self.ranks[group[0]]):
            if group is None:
                self.groups[band] = group = deque()
            if not group:
                heapq.heappush(self.group_heap, band)
            group.extendleft(keys)
            return
        for key in keys:
            self._place(key)

    def _current(self, key: int, band: int) -> bool:
        rank = self.ranks.get(key)
        return rank is not None and key not in self.busy and rank >> POSITION_BITS == band

    def _trim(self, group: deque, band: int):
        """Stale keys off both ends of `group`, so that its ends are ranked."""
        while group and not self._current(group[0], band):
            group.popleft()
        while group and not self._current(group[-1], band):
            group.pop()

    def _place(self, key: int):
        """`key` at its rank: at an end of its group where it is in order there, else in the
        heap of the others."""
        ranks = self.ranks
        rank = ranks[key]
        band = rank >> POSITION_BITS
        group = self.groups.get(band)
        if group is None:
            self.groups[band] = deque((key,))
            heapq.heappush(self.group_heap, band)
            return
        self._trim(group, band)
        if not group:
            group.append(key)
            heapq.heappush(self.group_heap, band)
        elif rank < ranks[group[0]]:
            group.appendleft(key)
        elif rank > ranks[group[-1]]:
            group.append(key)
        else:
            heapq.heappush(self.others, rank << KEY_BITS | key)

    def _least(self) -> tuple[int, deque | None] | None:
        """The least current block's key, and the group it heads (None: the others' heap);
        stale keys and entries in front of it are dropped."""
        ranks, busy, groups, group_heap, others = self.ranks, self.busy, self.groups, \
            self.group_heap, self.others
        while others:
            entry = others[0]
            key = entry & KEY_MASK
            if key not in busy and ranks.get(key) == entry >> KEY_BITS:
                break
            heapq.heappop(others)
        while group_heap:
            band = group_heap[0]
            group = groups.get(band)
            while group:
                key = group[0]
                rank = ranks.get(key)
                if rank is not None and key not in busy and rank >> POSITION_BITS == band:
                    break
                group.popleft()
            if group:
                break
            heapq.heappop(group_heap)
            if group is not None:
                del groups[band]         # made anew if a block of the band comes again
        if not group_heap:
            return (others[0] & KEY_MASK, None) if others else None
        group = groups[group_heap[0]]
        head = group[0]
        if others and others[0] < ranks[head] << KEY_BITS | head:
            return others[0] & KEY_MASK, None
        return head, group

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        """The n least ranked evictable blocks not in `protected`, taken out; None (nothing
        changed) when there are fewer."""
        popped, num_taken = [], 0       # (key, its group or None, whether it is protected), in order
        ranks, busy, others = self.ranks, self.busy, self.others
        while num_taken < n:
            least = self._least()
            if least is None:
                break
            key, group = least
            if group is None:
                heapq.heappop(others)
                busy[key] = TAKEN                 # out of the running while this eviction lasts
                popped.append((key, None, key in protected))
                num_taken += key not in protected
                continue
            # the group's current keys, in order, while they come before the others' least
            band = ranks[key] >> POSITION_BITS
            bound = others[0] if others else None
            while group and num_taken < n:
                key = group[0]
                rank = ranks.get(key)
                if rank is None or key in busy or rank >> POSITION_BITS != band:
                    group.popleft()               # stale
                    continue
                if bound is not None and rank << KEY_BITS | key > bound:
                    break
                group.popleft()
                busy[key] = TAKEN
                kept = key in protected
                popped.append((key, group, kept))
                num_taken += not kept
        done = num_taken == n
        for key, group, kept in reversed(popped):
            if kept or not done:                   # put back where they were
                del busy[key]
                self._put_back(key, group)
        if not done:
            return None
        keys = [key for key, _, kept in popped if not kept]
        for key in keys:
            del ranks[key], busy[key]
        return keys

    def _put_back(self, key: int, group: deque | None):
        rank = self.ranks[key]
        if group is None:
            heapq.heappush(self.others, rank << KEY_BITS | key)
            return
        band = rank >> POSITION_BITS
        if self.groups.get(band) is not group:     # emptied and dropped meanwhile
            self.groups[band] = group
            heapq.heappush(self.group_heap, band)
        elif not group:
            heapq.heappush(self.group_heap, band)
        group.appendleft(key)
