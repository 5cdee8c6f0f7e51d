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
        ref_counts = self.ref_counts
        hits = []
        for h in hashes[:num_blocks - 1]:       # the prefix cache's hit rule: never the last block
            block_id = self.hash_to_block_id.get(h)
            if block_id is None:
                break
            hits.append(block_id)
        self._take_hits(hits)
        new = []
        for h in hashes[len(hits):]:
            block_id = self.free.head()
            self._take_free_block(block_id)
            self._register(block_id, h)
            new.append(block_id)
        for block_id in reversed(hits + new):
            ref_counts[block_id] -= 1
            if ref_counts[block_id] == 0:
                self.free.append(block_id)
