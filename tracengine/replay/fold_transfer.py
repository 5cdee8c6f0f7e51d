"""The fold of a disaggregated fleet's decode replica (fleet/engine.py): a KV transfer puts the
prompt's full blocks into its prefix cache, with no event of its own but the KVTransfer.

A KVTransfer lands between the replica's steps, and the request it carries enters at the
replica's next step, landings in the order they came: so the blocks are taken in when its
RequestAdded comes (its prompt gives the block hashes the KVTransfer does not carry), before
the request is added, as sim/kv_transfer.install_prompt_kv took them in: the leading blocks the cache holds
are hits (never the last one), the others come from the head of the free queue and are
registered under their hashes, then all are released, the last first."""
from tracengine.engine.hash_id_prompt import request_prompt
from tracengine.engine.sequence import Sequence
from tracengine.replay.projection import Projection
from tracengine.trace.events import KVTransfer, RequestAdded


class TransferProjection(Projection):
    """Projection of a replica that KV transfers land on."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.landed: dict[int, KVTransfer] = {}     # seq_id -> its transfer, until it enters
        self.handlers[KVTransfer] = self.kv_transfer

    def kv_transfer(self, e: KVTransfer):
        if e.seq_id in self.landed:
            raise ValueError(f"seq {e.seq_id} lands twice before it enters")
        self.landed[e.seq_id] = e

    def request_added(self, e: RequestAdded):
        transfer = self.landed.pop(e.seq_id, None)
        if transfer is not None and transfer.num_blocks > 0:
            self._take_in(e, transfer.num_blocks)
        super().request_added(e)

    def _take_in(self, e: RequestAdded, num_blocks: int):
        prompt = request_prompt(e)
        if len(prompt) < num_blocks * self.block_size:
            raise ValueError(f"seq {e.seq_id}'s transfer holds {num_blocks} blocks, its prompt fewer")
        hashes = Sequence(e.seq_id, prompt[:num_blocks * self.block_size], self.block_size).hash_full_blocks()
        # as install_prompt_kv through the block manager: the hits, the rest handed out and
        # registered, then all released, the last first
        pool, prefix_cache = self.pool, self.prefix_cache
        hits = prefix_cache.lookup(hashes[:num_blocks - 1])     # the hit rule: never the last block
        pool.touch(hits)
        new = pool.get_new_blocks(num_blocks - len(hits))
        prefix_cache.evict(new)
        prefix_cache.insert(new, hashes[len(hits):])
        pool.free_blocks((hits + new)[::-1])
