"""The CPU tier's rules (cpu_tier.py) in a plain form: a record per block, the transfers in
a list, eviction by sorting every evictable block by its rank. It makes the same decisions
and emits the same events (tests/test_cpu_tier.py runs both under the mixed policy)."""
from tracengine.engine.sequence import Sequence
from tracengine.trace.events import CpuHit, CpuLoad, CpuStore
from tracengine.trace.sinks import NULL_SINK


class TierBlock:
    def __init__(self, rank):
        self.readers = 0          # loads reading it
        self.written = False      # its copy to the tier has ended
        self.rank = rank


class ReferenceCpuTier:

    def __init__(self, num_blocks: int, block_size: int, block_bytes: int, gbps: float, sink=NULL_SINK):
        self.num_blocks, self.block_size, self.block_bytes, self.gbps = num_blocks, block_size, block_bytes, gbps
        self.sink = sink
        self.step = self.now_ns = 0
        self.blocks: dict[int, TierBlock] = {}
        self.clock = 0                           # ranks handed out
        self.request_rank: dict[int, int] = {}
        self.used: dict[int, dict[int, int]] = {}    # seq_id -> key -> position, the blocks it used
        self.links = {"to_cpu": 0, "to_gpu": 0}      # when each is next free
        self.queued: list[tuple[int, list[int]]] = []
        self.transfers: list[dict] = []
        self.num_transfers = 0
        self.offered: dict[int, int] = {}
        self.loads: dict[int, tuple[int, int]] = {}
        self.loaded: list[int] = []
        self.finished: list[int] = []
        self.copying: dict[int, int] = {}      # GPU block -> when the store copying it ends
        self.flush_until = 0

    @property
    def ref_counts(self) -> dict[int, int]:
        return {key: b.readers if b.written else -1 for key, b in self.blocks.items()}

    def _rank_of(self, seq_id: int) -> int:
        if seq_id not in self.request_rank:
            self.clock += 1
            self.request_rank[seq_id] = self.clock
        return self.request_rank[seq_id]

    def _transfer(self, link: str, n: int, is_store: bool, seq_id: int, keys: list[int]) -> tuple[int, int]:
        start = max(self.links[link], self.now_ns)
        done = start + (-(-n * self.block_bytes * 1000 // round(self.gbps * 1000)) if self.gbps else 0)
        self.links[link] = done
        self.num_transfers += 1
        self.transfers.append({"done": done, "order": self.num_transfers, "store": is_store, "seq_id": seq_id,
                               "keys": keys})
        return start, done

    def begin_step(self, step: int, now_ns: int):
        self.step, self.now_ns = step, now_ns
        for t in sorted((t for t in self.transfers if t["done"] <= now_ns), key=lambda t: (t["done"], t["order"])):
            self.transfers.remove(t)
            for key in t["keys"]:
                if t["store"]:
                    if key in self.blocks:
                        self.blocks[key].written = True
                else:
                    self.blocks[key].readers -= 1
            if not t["store"] and t["seq_id"] in self.loads:
                self.loaded.append(t["seq_id"])
        self.flush_until = 0
        for seq_id, keys, block_ids in self.queued:
            _, done = self._transfer("to_cpu", len(keys), True, seq_id, keys)
            for block_id in block_ids:
                self.copying[block_id] = done
        self.queued = []

    def reuse(self, block_ids):
        for block_id in block_ids:
            self.flush_until = max(self.flush_until, self.copying.pop(block_id, 0))

    def preempted(self, seq_id: int):
        self.flush_until = max([self.flush_until] + [t["done"] for t in self.transfers
                                                     if t["store"] and t["seq_id"] == seq_id])

    def flush_wait_ns(self) -> int:
        return max(0, self.flush_until - self.now_ns)

    def next_done_ns(self):
        return min((t["done"] for t in self.transfers), default=None)

    def _busy(self, seq_id: int) -> bool:
        return any(t["seq_id"] == seq_id for t in self.transfers) or any(s == seq_id for s, _ in self.queued)

    def _use(self, seq_id: int, keys: list[tuple[int, int]]):
        """First uses rank a held block no lower than (the request's rank, minus its position)."""
        used = self.used.setdefault(seq_id, {})
        first = [(k, p) for k, p in keys if k not in used]
        if not first:
            return
        rank = self._rank_of(seq_id)
        for key, position in first:
            used[key] = position
            if key in self.blocks and self.blocks[key].rank < (rank, -position):
                self.blocks[key].rank = (rank, -position)

    def lookup(self, seq: Sequence, num_gpu_hits: int):
        self.offered[seq.seq_id] = 0
        if self._busy(seq.seq_id):
            return None
        num = 0
        for key in seq.hash_full_blocks()[num_gpu_hits:seq.num_tokens // self.block_size]:
            if key not in self.blocks:
                break
            if not self.blocks[key].written:
                return None
            num += 1
        return num

    def start_load(self, seq: Sequence, first_block: int, num_blocks: int):
        keys = seq.block_hashes[first_block:first_block + num_blocks]
        for key in keys:
            self.blocks[key].readers += 1
        self._use(seq.seq_id, [(k, (first_block + i + 1) * self.block_size) for i, k in enumerate(keys)])
        start, done = self._transfer("to_gpu", num_blocks, False, seq.seq_id, keys)
        self.loads[seq.seq_id] = (first_block, num_blocks)
        self.offered[seq.seq_id] = first_block + num_blocks
        if self.sink.enabled:
            self.sink.emit(CpuHit(self.step, seq.seq_id, first_block, list(keys), start, done))

    def is_loaded(self, seq_id: int) -> bool:
        return seq_id in self.loaded

    def take_loaded(self, seq: Sequence) -> int:
        self.loaded.remove(seq.seq_id)
        first_block, num_blocks = self.loads.pop(seq.seq_id)
        n = min((first_block + num_blocks) * self.block_size, seq.num_tokens - 1)
        if self.sink.enabled:
            self.sink.emit(CpuLoad(self.step, seq.seq_id, num_blocks, n))
        return n

    def drop(self, seq_id: int):
        self.loads.pop(seq_id, None)
        if seq_id in self.loaded:
            self.loaded.remove(seq_id)

    def offer_stores(self, seqs: list[Sequence]):
        size = self.block_size
        for seq in seqs:
            start = self.offered.get(seq.seq_id, 0)
            end = min(min(seq.num_cached_tokens + seq.num_scheduled_tokens, seq.num_prompt_tokens) // size,
                      len(seq.block_table), len(seq.hash_full_blocks()))
            if end > start and self._store(seq, start, end):
                self.offered[seq.seq_id] = end
        for seq_id in self.finished:
            used = self.used.pop(seq_id, {})
            self.request_rank.pop(seq_id, None)
            for key in sorted(used, key=used.__getitem__, reverse=True):     # tail first, the head last
                if key in self.blocks:
                    self.clock += 1
                    self.blocks[key].rank = (self.clock, 0)
            self.offered.pop(seq_id, None)
        self.finished = []

    def _store(self, seq: Sequence, start: int, end: int) -> bool:
        keys = seq.block_hashes[start:end]
        size, blocks = self.block_size, self.blocks
        self._use(seq.seq_id, [(k, (start + i + 1) * size) for i, k in enumerate(keys)
                               if k not in blocks or blocks[k].written])
        new = [k for k in keys if k not in blocks]
        if not new:
            return True
        evicted = []
        num_to_evict = len(new) - (self.num_blocks - len(blocks))
        if num_to_evict > 0:
            candidates = sorted((b.rank, k) for k, b in blocks.items() if b.written and not b.readers and k not in keys)
            if len(candidates) < num_to_evict:
                return False
            evicted = [k for _, k in candidates[:num_to_evict]]
            for key in evicted:
                del blocks[key]
        rank = self._rank_of(seq.seq_id)
        for key in new:
            blocks[key] = TierBlock((rank, -self.used[seq.seq_id][key]))
        self.queued.append((seq.seq_id, new, [seq.block_table[start + i] for i, k in enumerate(keys) if k in new]))
        if self.sink.enabled:
            self.sink.emit(CpuStore(self.step, seq.seq_id, start + keys.index(new[0]), new, evicted))
        return True

    def request_finished(self, seq_id: int):
        self.finished.append(seq_id)
