"""The prefix-aware router and a replica's CPU tier (fleet/routers.py): a block the tier holds
past the replica's GPU hits is loaded, not computed, and costs half a prefill block."""
from types import SimpleNamespace

from tracengine.engine.cpu_tier import CpuTier
from tracengine.fleet.routers import PrefixAware, RoutedRequest


class StubReplica:
    """What the router reads of a replica: its GPU prefix cache's hashes and its CPU tier."""

    def __init__(self, gpu_hashes=(), tier=None, num_active_blocks=0):
        self.gpu_hashes = set(gpu_hashes)
        self.scheduler = SimpleNamespace(cpu_tier=tier)
        self.num_prefill_tokens = 0
        self.num_active_blocks = num_active_blocks

    def num_cached_blocks(self, hashes):
        n = 0
        while n < len(hashes) and hashes[n] in self.gpu_hashes:
            n += 1
        return n


def tier_holding(hashes) -> CpuTier:
    tier = CpuTier(num_blocks=16, block_size=4, block_bytes=4096, gbps=0.0)
    tier.held.update(dict.fromkeys(hashes, 0))      # held (ranked), no transfer on them
    return tier


def test_blocks_in_a_replicas_cpu_tier_cost_half_a_prefill_block():
    request = RoutedRequest(0, list(range(1, 17)), 4, 0, 4)        # 4 full blocks
    h = request.block_hashes
    replicas = [StubReplica(),                                     # nothing: 4 blocks to prefill
                StubReplica(tier=tier_holding(h[:3])),             # 3 in its tier: 1 + 3 / 2
                StubReplica(h[:1], tier_holding(h[1:3])),          # 1 on its GPU, 2 in its tier: 1 + 2 / 2
                StubReplica(tier=tier_holding(h[1:]))]             # its tier misses the first block: none counts
    assert PrefixAware().route(request, replicas) == [4.0, 2.5, 2.0, 4.0]


def test_without_a_tier_the_scores_are_the_gpus_alone():
    request = RoutedRequest(0, list(range(1, 17)), 4, 0, 4)
    h = request.block_hashes
    assert PrefixAware(load_weight=0.5).route(request, [StubReplica(h[:2], num_active_blocks=4), StubReplica()]) == \
        [2.0 + 2.0, 4.0]


def test_a_subclass_may_count_a_cpu_hit_as_a_miss():
    class CpuHitsAreMisses(PrefixAware):
        cpu_hit_weight = 1.0
    request = RoutedRequest(0, list(range(1, 17)), 4, 0, 4)
    assert CpuHitsAreMisses().route(request, [StubReplica(), StubReplica(tier=tier_holding(request.block_hashes))]) \
        == [4.0, 4.0]
