"""The CPU tier of KV offloading, vLLM 0.33's way (`--kv-offloading-size`, the native backend:
vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, the OffloadingConnector's
scheduler side, over vllm/v1/kv_offload/cpu/manager.py, CPUOffloadingManager, and its LRU
policy, cpu/policies/lru.py). A chunk is one GPU block (vLLM's default blocks_per_chunk), known
by its block hash. The rules:

- What is stored, and when. After each schedule, every scheduled sequence offers the full
  blocks of its prompt that will be computed by the end of the step (`offload_prompt_only`, on
  by default), from the first it has not offered yet: its GPU prefix-cache hits too, unless it
  loaded from this tier (then from past what it loaded). A block the tier holds is not stored
  again (once); the others are taken together or not at all (a store that finds too few blocks
  to evict is offered again the next step). Taken blocks are in the tier at once but not
  readable: their copy starts at the next step's start, queued on the GPU-to-CPU link, and
  they become readable at the first step that starts after it ended.
- Eviction: LRU as vLLM's LRUCachePolicy ranks it. A block is ranked when a request first
  uses it (stores, finds stored, or loads it) by (the request's rank, minus its position), so
  within a request the tail goes before the head; when the request finishes, its blocks are
  ranked anew from tail to head, the head the most recent. The least ranked readable block
  no transfer reads goes first; the blocks being offered are never evicted for their own store.
- Lookup: a waiting sequence's leading blocks past its GPU prefix-cache hits, up to the first
  the tier misses, every full block of the sequence (a whole prompt may hit; its last token is
  then computed again). A sequence whose hit runs into a block still being written, or that
  has a transfer in flight itself (a preempted one), is skipped this step: it waits, and the
  sequences behind it are scheduled (vLLM's get_num_new_matched_tokens returning None).
- Loading: a hit of at least one block is loaded asynchronously (vLLM's default: no sync-load
  budget). The sequence holds GPU blocks for its GPU hits and the loaded blocks, computes
  nothing, and is set aside; its load starts at the step's start, queued on the CPU-to-GPU
  link. At the first step that starts after it ended the loaded blocks are registered in the
  GPU prefix cache and the sequence is scheduled before any waiting one.
- Time: a transfer of n bytes takes n / bandwidth (decimal GB/s: bytes per ns), each
  direction's transfers one after another.

Events (the sink's): CpuStore when blocks are taken (with the blocks that evicted), CpuHit
when a load starts, CpuLoad when it has ended and the sequence runs."""
import heapq
from itertools import compress, repeat, takewhile
from operator import not_

from tracengine.engine.cpu_lru import LruPolicy
from tracengine.engine.sequence import Sequence
from tracengine.trace.events import CpuHit, CpuLoad, CpuStore
from tracengine.trace.sinks import NULL_SINK, EventSink

PENDING = -1     # a block's reference count while its copy to the tier is in flight
USED = b"\x01"    # a block's flag once its request used it


class CpuTier:
    """The tier's blocks (`held`: hash -> its rank in the eviction order, cpu_lru.py), the
    reference counts that are not 0 (`busy`: PENDING while written, else the loads reading it;
    a block with none is evictable), the transfers in flight, and the sequences set aside while
    they load."""

    def __init__(self, num_blocks: int, block_size: int, block_bytes: int, gbps: float,
                 sink: EventSink = NULL_SINK):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.block_bytes = block_bytes
        self.gbps = gbps
        self.sink = sink
        # a real run's copies of the blocks (runner/kv_host.py's HostKVBuffer: store, load, evict);
        # None in simulated time and re-execution, where a block is its hash alone
        self.copier = None
        self.step = 0
        self.now_ns = 0
        self.busy: dict[int, int] = {}
        self.policy = LruPolicy(self.busy)
        self.held = self.policy.ranks
        self.num_evictable = 0
        self.d2h_free_ns = self.h2d_free_ns = 0    # when each direction's link is next free
        self.queued_stores: list[tuple[int, list[int], list[int]]] = []   # (seq_id, keys, GPU blocks): next step
        self.fenced: dict[int, int] = {}         # GPU block -> when the store copying it ends
        self.store_done: dict[int, int] = {}     # seq_id -> when its last store started ends
        self.flush_until_ns = 0                  # the step's forward pass waits for stores until then
        self.transfers: list[tuple[int, int, bool, int, list[int]]] = []   # heap: (done_ns, id, is_store, seq_id, keys)
        self.num_transfers = 0
        self.in_flight: dict[int, int] = {}      # seq_id -> its transfers in flight
        self.next_offered: dict[int, int] = {}   # seq_id -> its first block not offered yet
        # seq_id -> the blocks it used: a flag per block index, and its block hashes (a request's
        # blocks are a run of its chain: the flags give them head first with no sort)
        self.used: dict[int, tuple[bytearray, list[int]]] = {}
        self.loads: dict[int, tuple[int, int]] = {}  # seq_id of a sequence set aside -> (first block, blocks)
        self.loaded: set[int] = set()            # of those, the ones whose load has ended
        self.finished: list[int] = []            # requests finished since the last schedule
        # over the tier's life
        self.num_hit_blocks = self.num_stored_blocks = self.num_evicted_blocks = 0

    # -- time ---------------------------------------------------------------------------------

    def duration_ns(self, num_blocks: int) -> int:
        return transfer_ns(num_blocks, self.block_bytes, self.gbps)

    def begin_step(self, step: int, now_ns: int):
        """A step starts at `now_ns`: the transfers that ended by then complete, and the stores
        offered last step start."""
        self.step, self.now_ns = step, now_ns
        transfers = self.transfers
        while transfers and transfers[0][0] <= now_ns:
            _, _, is_store, seq_id, keys = heapq.heappop(transfers)
            self._complete(is_store, seq_id, keys)
        self.flush_until_ns = 0
        fenced, store_done = self.fenced, self.store_done
        if self.d2h_free_ns <= now_ns:      # no store is copying: no GPU block is fenced
            fenced.clear()
        for seq_id, keys, block_ids in self.queued_stores:
            start = max(self.d2h_free_ns, now_ns)
            self.d2h_free_ns = done = start + self.duration_ns(len(keys))
            self._start(done, True, seq_id, keys)
            if self.copier is not None:
                self.copier.store(keys, block_ids)
            fenced.update(dict.fromkeys(block_ids, done))
            store_done[seq_id] = done
        self.queued_stores = []

    def reuse(self, block_ids: list[int]):
        """GPU blocks handed out again this step: a store still copying one of them is waited
        for before the step's forward pass (vLLM's jobs_to_flush)."""
        if self.fenced:
            done = max(map(self.fenced.pop, block_ids, repeat(0)), default=0)
            if done > self.flush_until_ns:
                self.flush_until_ns = done

    def preempted(self, seq_id: int):
        """A preempted sequence's stores in flight are waited for before the step's forward pass."""
        done = self.store_done.get(seq_id, 0)
        if done > self.flush_until_ns:
            self.flush_until_ns = done

    def flush_wait_ns(self) -> int:
        """How long the step's forward pass waits for the stores it flushes."""
        return max(0, self.flush_until_ns - self.now_ns)

    def next_done_ns(self) -> int | None:
        """When the next transfer in flight ends (None: none is)."""
        return self.transfers[0][0] if self.transfers else None

    def _start(self, done_ns: int, is_store: bool, seq_id: int, keys: list[int]):
        self.num_transfers += 1
        heapq.heappush(self.transfers, (done_ns, self.num_transfers, is_store, seq_id, keys))

    def _complete(self, is_store: bool, seq_id: int, keys: list[int]):
        busy, policy = self.busy, self.policy
        if is_store:       # a block being written is never evicted: each of `keys` is still here
            for key in keys:
                del busy[key]
            self.num_evictable += len(keys)
            policy.mark_evictable_n(keys)
        else:
            released = []
            for key in keys:
                count = busy[key]
                if count == 1:
                    del busy[key]
                    released.append(key)
                else:
                    busy[key] = count - 1
            if released:
                self.num_evictable += len(released)
                policy.mark_evictable_n(released)
        if self.in_flight[seq_id] == 1:
            del self.in_flight[seq_id]
        else:
            self.in_flight[seq_id] -= 1
        if not is_store and seq_id in self.loads:
            self.loaded.add(seq_id)

    # -- lookup and loads ---------------------------------------------------------------------

    def lookup(self, seq: Sequence, num_gpu_hits: int) -> int | None:
        """Blocks of `seq` past its `num_gpu_hits` GPU prefix-cache hits that the tier holds,
        up to the first miss; None: the sequence waits (a block still being written, or a
        transfer of its own in flight)."""
        self.next_offered[seq.seq_id] = 0        # starting over: every block is offered again
        if self.in_flight.get(seq.seq_id):
            return None
        keys = seq.hash_full_blocks()[num_gpu_hits:seq.num_tokens // self.block_size]
        num = self.num_held_blocks(keys)
        return None if PENDING in map(self.busy.get, keys[:num]) else num

    def num_held_blocks(self, keys: list[int]) -> int:
        """How many of `keys` the tier holds, up to the first it does not (those being written too:
        they are readable once their copy ends)."""
        return sum(1 for _ in takewhile(self.held.__contains__, keys))

    def start_load(self, seq: Sequence, first_block: int, num_blocks: int):
        """Load `num_blocks` blocks of `seq` from `first_block` on (its lookup's hit, GPU blocks
        allocated for them); the sequence is set aside until `take_loaded`."""
        seq_id = seq.seq_id
        keys = seq.block_hashes[first_block:first_block + num_blocks]
        busy = self.busy
        counts = list(map(busy.get, keys, repeat(0)))
        self.num_evictable -= counts.count(0)      # read by a load: not evictable
        busy.update(zip(keys, map((1).__add__, counts)))
        self._access(seq, first_block, keys)
        if self.copier is not None:
            self.copier.load(keys, seq.block_table[first_block:first_block + num_blocks])
        start = max(self.h2d_free_ns, self.now_ns)
        self.h2d_free_ns = done = start + self.duration_ns(num_blocks)
        self._start(done, False, seq_id, keys)
        self.in_flight[seq_id] = self.in_flight.get(seq_id, 0) + 1
        self.loads[seq_id] = (first_block, num_blocks)
        self.next_offered[seq_id] = first_block + num_blocks   # vLLM's chunk-level policy
        self.num_hit_blocks += num_blocks
        if self.sink.enabled:
            self.sink.emit(CpuHit(self.step, seq_id, first_block, list(keys), start, done))

    def is_loaded(self, seq_id: int) -> bool:
        return seq_id in self.loaded

    def take_loaded(self, seq: Sequence) -> int:
        """The load of `seq` has ended: its computed tokens (GPU hits and loaded blocks, at most
        all but the last token), recorded; the caller registers the blocks."""
        self.loaded.discard(seq.seq_id)
        first_block, num_blocks = self.loads.pop(seq.seq_id)
        num_cached_tokens = min((first_block + num_blocks) * self.block_size, seq.num_tokens - 1)
        if self.sink.enabled:
            self.sink.emit(CpuLoad(self.step, seq.seq_id, num_blocks, num_cached_tokens))
        return num_cached_tokens

    def drop(self, seq_id: int):
        """A sequence set aside was aborted: its load, if still in flight, only releases its blocks."""
        self.loads.pop(seq_id, None)
        self.loaded.discard(seq_id)

    # -- stores ---------------------------------------------------------------------------------

    def offer_stores(self, seqs: list[Sequence]):
        """After a schedule: each scheduled sequence offers its prompt's full blocks computed by
        the end of the step; then the requests that finished since the last schedule are ranked."""
        size = self.block_size
        for seq in seqs:
            end = min(seq.num_cached_tokens + seq.num_scheduled_tokens, seq.num_prompt_tokens) // size
            start = self.next_offered.get(seq.seq_id, 0)
            if end > start:
                end = min(end, len(seq.block_table), len(seq.hash_full_blocks()))
                if end > start and self._store(seq, start, end):
                    self.next_offered[seq.seq_id] = end
        for seq_id in self.finished:
            self.store_done.pop(seq_id, None)
            flags, hashes = self.used.pop(seq_id, (b"", []))
            self.policy.finish(list(compress(hashes, flags)), seq_id)
            self.next_offered.pop(seq_id, None)
        self.finished = []

    def _store(self, seq: Sequence, start: int, end: int) -> bool:
        """prepare_store of blocks [start, end) of `seq`: False when too few can be evicted. The
        blocks it stores and those it finds readable are its use of them, even when it fails."""
        keys = seq.block_hashes[start:end]
        held, size, seq_id = self.held, self.block_size, seq.seq_id
        ranks = list(map(held.get, keys))       # None: the tier does not hold the block
        positions = range((start + 1) * size, (end + 1) * size, size)
        # its use of the blocks it stores and of those it finds readable (not of those being written)
        used = self._used(seq)
        if ranks.count(None) == len(keys):      # none held: it stores them all, in one run
            new, new_positions, block_ids = keys, positions, seq.block_table[start:end]
            used[start:end] = USED * (end - start)
            self.policy.request_rank(seq_id)
        else:
            # each block's count: None when the tier does not hold it, 0 when no transfer holds it
            counts = [None if rank is None else self.busy.get(key, 0) for key, rank in zip(keys, ranks)]
            new = [key for key, count in zip(keys, counts) if count is None]
            new_positions = [position for position, count in zip(positions, counts) if count is None]
            ready = [count is not None and count != PENDING and not flag
                     for count, flag in zip(counts, used[start:end])]
            ready_keys = list(compress(keys, ready))
            if new or ready_keys:
                if PENDING not in counts:
                    used[start:end] = USED * (end - start)
                else:
                    for i, count in enumerate(counts, start):
                        if count != PENDING:
                            used[i] = 1
                self.policy.access(ready_keys, compress(positions, ready), seq_id)
            if not new:
                return True
            table = seq.block_table
            block_ids = [table[start + i] for i, count in enumerate(counts) if count is None]
        num_to_evict = len(new) - (self.num_blocks - len(held))
        if num_to_evict > 0:
            evicted = self.policy.evict(num_to_evict, set(keys)) if num_to_evict <= self.num_evictable else None
            if evicted is None:
                return False
            self.num_evictable -= len(evicted)
            self.num_evicted_blocks += len(evicted)
            if self.copier is not None:
                self.copier.evict(evicted)
        else:
            evicted = []
        self.busy.update(dict.fromkeys(new, PENDING))
        self.policy.insert_n(new, seq_id, new_positions)
        self.queued_stores.append((seq_id, new, block_ids))
        self.in_flight[seq_id] = self.in_flight.get(seq_id, 0) + 1
        self.num_stored_blocks += len(new)
        if self.sink.enabled:
            self.sink.emit(CpuStore(self.step, seq_id, start + keys.index(new[0]), new, evicted))
        return True

    def _access(self, seq: Sequence, first_block: int, keys: list[int]):
        """A request's use of its blocks `keys` from `first_block` on: those it uses for the first
        time are ranked (vLLM's on_request_access)."""
        used, size = self._used(seq), self.block_size
        end = first_block + len(keys)
        unused = list(map(not_, used[first_block:end]))
        if any(unused):
            used[first_block:end] = USED * len(keys)
            self.policy.access(list(compress(keys, unused)),
                               compress(range((first_block + 1) * size, (end + 1) * size, size), unused), seq.seq_id)

    def _used(self, seq: Sequence) -> bytearray:
        """The flags of the blocks `seq` used, one for each block it has a hash for."""
        used = self.used.get(seq.seq_id)
        if used is None:
            used = self.used[seq.seq_id] = (bytearray(), seq.block_hashes)
        flags = used[0]
        if len(flags) < len(seq.block_hashes):
            flags.extend(bytes(len(seq.block_hashes) - len(flags)))
        return flags

    @property
    def ref_counts(self) -> dict[int, int]:
        """Every block the tier holds -> its reference count (as the reference tier has them)."""
        return {key: self.busy.get(key, 0) for key in self.held}

    def request_finished(self, seq_id: int):
        """The request finished or was aborted: ranked at the next schedule's end."""
        self.finished.append(seq_id)


def transfer_ns(num_blocks: int, block_bytes: int, gbps: float) -> int:
    """How long a copy of `num_blocks` blocks of `block_bytes` takes at `gbps` decimal GB/s (bytes
    per ns), rounded up; 0 at 0 GB/s (transfers take no time)."""
    return -(-num_blocks * block_bytes * 1000 // round(gbps * 1000)) if gbps else 0
