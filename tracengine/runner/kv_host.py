"""The CPU tier's memory in a real run (engine/cpu_tier.py decides, this copies): a host buffer
of the tier's blocks, each the K and V of one KV block in every layer, laid out as the runner's
cache is (dim 2 the block). A block hash is given a slot when its store starts and the GPU
block's K and V are copied there; a load copies the slots back into the GPU blocks allocated for
them; an eviction frees the slots. The engine runs a step's forward after its schedule, so a
store's copy (at the step's start) reads what the last forward wrote before any block is reused,
and a load's (when it starts, in the schedule) lands before the forward that first reads it."""
import torch


class HostKVBuffer:

    def __init__(self, kv_cache: torch.Tensor, num_blocks: int):
        shape = list(kv_cache.shape)
        shape[2] = num_blocks
        self.kv_cache = kv_cache
        self.buffer = torch.empty(shape, dtype=kv_cache.dtype, device="cpu",
                                  pin_memory=kv_cache.device.type == "cuda")
        self.reset()

    def reset(self):
        """Empty: every slot free (a fresh tier)."""
        self.slots: dict[int, int] = {}                   # block hash -> its slot
        self.free_slots = list(range(self.buffer.shape[2] - 1, -1, -1))

    def store(self, keys: list[int], block_ids: list[int]):
        """Copy GPU blocks `block_ids` to new slots for `keys`."""
        slots = [self.free_slots.pop() for _ in keys]
        self.slots.update(zip(keys, slots))
        self.buffer[:, :, slots] = self.kv_cache[:, :, block_ids].to("cpu")

    def load(self, keys: list[int], block_ids: list[int]):
        """Copy the slots of `keys` into GPU blocks `block_ids`."""
        slots = [self.slots[key] for key in keys]
        self.kv_cache[:, :, block_ids] = self.buffer[:, :, slots].to(self.kv_cache.device)

    def evict(self, keys: list[int]):
        self.free_slots.extend(map(self.slots.pop, keys))
