"""The CPU tier's eviction order: vLLM 0.33's LRUCachePolicy (vllm/v1/kv_offload/cpu/policies/lru.py).

A block is ranked (a, -position): `a` from one counter. A request takes the next value when it
first uses a block (stores it, finds it stored, loads it), and ranks its blocks (a, -position),
raising a block's rank, never lowering it; when it finishes, its blocks take the next values in
turn, tail first, so its head is the most recent. The least ranked readable block that no load
reads is evicted first.

vLLM keeps the evictable blocks in a heap, a push a block and a pop or two an eviction. Here the
ranks fall in bands that never interleave: a request's (a, -p) for its one `a`, and a finish's
run of values, here (its first value, i) for its i-th block, the counter still moving past the
run, which orders them as vLLM's ranks are ordered. A rank's band is its int >> 40 (two
neighbouring bands may share one, which keeps the order). A band is a group, its blocks in a deque in rank order,
and a heap orders the groups (one entry a group, not a block). A request's blocks become
evictable head to tail (their stores end in the order they were offered), so each goes to the
front of its group; a finish's group is built in order. A block that arrives out of order (a
load's, released in the middle of its band) goes to a heap of its own. A group's or the heap's
entry is an int, rank << 64 | key, checked against the block's rank when it is taken: a block
ranked anew, evicted or read by a load leaves stale entries, which are skipped."""
import heapq
from collections import deque

POSITION_BITS = 40
POSITIONS = 1 << POSITION_BITS     # a rank (a, -position) is the int a * POSITIONS - position
KEY_BITS = 64           # an entry is rank << KEY_BITS | key (a block hash: 64 bits)
KEY_MASK = (1 << KEY_BITS) - 1


class LruPolicy:

    def __init__(self):
        self.ranks: dict[int, int] = {}
        self.evictable: set[int] = set()
        self.groups: dict[int, deque] = {}       # band -> its entries, least ranked first
        self.group_heap: list[int] = []          # the bands with entries (some perhaps emptied since)
        self.others: list[int] = []              # a heap of the entries that came out of order
        self.next_rank = 0
        self.request_ranks: dict[int, int] = {}  # seq_id -> its rank, given when first needed

    def request_rank(self, seq_id: int) -> int:
        rank = self.request_ranks.get(seq_id)
        if rank is None:
            self.next_rank += 1
            rank = self.request_ranks[seq_id] = self.next_rank
        return rank

    def insert_n(self, keys: list[int], seq_id: int, positions: dict[int, int]):
        """New blocks a request stores, at their `positions` (key -> position)."""
        base = self.request_rank(seq_id) * POSITIONS
        self.ranks.update(zip(keys, map(base.__sub__, map(positions.__getitem__, keys))))

    def access(self, keys: list[tuple[int, int]], seq_id: int):
        """A request's first use of `keys` ((key, position) pairs): ranked no lower than (its
        rank, minus the position)."""
        base = self.request_rank(seq_id) * POSITIONS      # given now even when no key is held yet
        ranks, evictable = self.ranks, self.evictable
        for key, position in keys:
            current = ranks.get(key)
            if current is not None and current < base - position:
                ranks[key] = base - position
                if key in evictable:
                    self._place(key)

    def finish(self, keys_head_first: list[int], seq_id: int):
        """The request finished: its blocks the tier holds ranked anew, tail first, head last."""
        self.request_ranks.pop(seq_id, None)
        ranks, evictable = self.ranks, self.evictable
        keys = [key for key in reversed(keys_head_first) if key in ranks]
        if not keys:
            return
        band = self.next_rank + 1
        self.next_rank += len(keys)
        new_ranks = range(band * POSITIONS, band * POSITIONS + len(keys))
        ranks.update(zip(keys, new_ranks))
        entries = deque(rank << KEY_BITS | key for key, rank in zip(keys, new_ranks) if key in evictable)
        if entries and band not in self.groups:       # the band is new: it has no group yet
            self.groups[band] = entries
            heapq.heappush(self.group_heap, band)
        elif entries:
            for entry in entries:
                self._place(entry & KEY_MASK)

    def mark_evictable_n(self, keys):
        """`keys` become evictable. Those of one store (one band, head to tail: ranks falling)
        go to the front of their group at once."""
        self.evictable.update(keys)
        ranks = list(map(self.ranks.__getitem__, keys))
        band = ranks[0] >> POSITION_BITS
        entries = [rank << KEY_BITS | key for rank, key in zip(ranks, keys)]
        group = self.groups.get(band)
        # one band's blocks head to tail fall in rank, whether the band is a request's or a finish's
        if (not group or entries[0] < group[0]) and all(map(int.__gt__, entries, entries[1:])) and \
                ranks[-1] >> POSITION_BITS == band:
            if group is None:
                self.groups[band] = group = deque()
            if not group:
                heapq.heappush(self.group_heap, band)
            group.extendleft(entries)
            return
        for key in keys:
            self._place(key)

    def mark_non_evictable(self, key: int):
        self.evictable.discard(key)

    def _place(self, key: int):
        """An entry for `key` at its rank: at an end of its group where it is in order there,
        else in the heap of the others."""
        rank = self.ranks[key]
        band, entry = rank >> POSITION_BITS, rank << KEY_BITS | key
        group = self.groups.get(band)
        if group is None:
            self.groups[band] = deque((entry,))
            heapq.heappush(self.group_heap, band)
        elif not group:
            group.append(entry)
            heapq.heappush(self.group_heap, band)
        elif entry < group[0]:
            group.appendleft(entry)
        elif entry > group[-1]:
            group.append(entry)
        else:
            heapq.heappush(self.others, entry)

    def _least(self) -> tuple[int, deque | None] | None:
        """The least entry that is current (a readable block no load reads, at its rank), and the
        group it heads (None: the others' heap); stale entries in front of it are dropped."""
        ranks, evictable, groups, group_heap, others = self.ranks, self.evictable, self.groups, \
            self.group_heap, self.others
        while others:
            entry = others[0]
            key = entry & KEY_MASK
            if key in evictable and ranks[key] == entry >> KEY_BITS:
                break
            heapq.heappop(others)
        while group_heap:
            band = group_heap[0]
            group = groups.get(band)
            while group:
                entry = group[0]
                key = entry & KEY_MASK
                if key in evictable and ranks[key] == entry >> KEY_BITS:
                    break
                group.popleft()
            if group:
                break
            heapq.heappop(group_heap)
            if group is not None:
                del groups[band]         # made anew if a block of the band comes again
        head = groups[group_heap[0]][0] if group_heap else None
        if others and (head is None or others[0] < head):
            return others[0], None
        return (head, groups[group_heap[0]]) if head is not None else None

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        """The n least ranked evictable blocks not in `protected`, taken out; None (nothing
        changed) when there are fewer."""
        popped, num_taken = [], 0       # (entry, its group or None, whether it is protected), in order
        ranks, evictable, others = self.ranks, self.evictable, self.others
        while num_taken < n:
            least = self._least()
            if least is None:
                break
            entry, group = least
            if group is None:
                heapq.heappop(others)
                key = entry & KEY_MASK
                evictable.discard(key)            # out of the running while this eviction lasts
                popped.append((entry, None, key in protected))
                num_taken += key not in protected
                continue
            # the group's current entries, in order, while they come before the others' least
            bound = others[0] if others else None
            while group and num_taken < n and (bound is None or group[0] <= bound):
                entry = group.popleft()
                key = entry & KEY_MASK
                if key not in evictable or ranks[key] != entry >> KEY_BITS:
                    continue                      # stale
                evictable.discard(key)
                kept = key in protected
                popped.append((entry, group, kept))
                num_taken += not kept
        done = num_taken == n
        for entry, group, kept in reversed(popped):
            if kept or not done:                   # put back where they were
                self.evictable.add(entry & KEY_MASK)
                self._put_back(entry, group)
        if not done:
            return None
        keys = [entry & KEY_MASK for entry, _, kept in popped if not kept]
        for key in keys:
            del self.ranks[key]
        return keys

    def _put_back(self, entry: int, group: deque | None):
        if group is None:
            heapq.heappush(self.others, entry)
            return
        band = entry >> (KEY_BITS + POSITION_BITS)
        if self.groups.get(band) is not group:     # emptied and dropped meanwhile
            self.groups[band] = group
            heapq.heappush(self.group_heap, band)
        elif not group:
            heapq.heappush(self.group_heap, band)
        group.appendleft(entry)
