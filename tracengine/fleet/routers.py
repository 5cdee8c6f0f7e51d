"""Routers: which replica of a pool serves a request, decided when it arrives, from the
replicas' state at that moment (docs/cluster.md).

A router is a `Router` subclass: `route(request, replicas)` returns one score per replica
of the pool, lower is better; the fleet takes the lowest, the first on a tie, and records
every score (a RouteDecision). A router of one's own is loaded by import path
(`module:Class`), as scheduling policies are; a trace names its router and never makes
tracengine import it on its own.

- `round_robin`: the replicas in turn (the score is how many turns away each is).
- `least_loaded`: the fewest outstanding requests (waiting, running, or routed and not yet
  entered), as Vidur's least-outstanding-requests; tokens do not count.
- `prefix_aware`: Dynamo's KV router cost, `prefix_weight * prefill blocks + load_weight *
  active blocks`: prefill blocks are the request's blocks the replica's prefix cache lacks
  plus the prompt blocks still to compute there; active blocks are the KV blocks in use. A
  replica with a CPU tier: the blocks past its GPU hits that the tier holds (up to its first
  miss, as vLLM's lookup) are loaded, not computed, and each counts `cpu_hit_weight` (1/2) of
  a prefill block.
- `random`: uniform, from `seed`.
- `session_affinity`: a session's turns go to the replica that served its first turn (whose
  prefix cache holds the history they are sent after); a first turn, or a request outside a
  session, to the fewest outstanding requests, as `least_loaded`.
"""
import random
from dataclasses import dataclass

from tracengine.engine.block_hasher import compute_hashes
from tracengine.engine.hash_id_prompt import HashIdPrompt
from tracengine.engine.user_classes import class_name, load_class


@dataclass
class RoutedRequest:
    """What a router knows of a request: its id, size and, for prefix-aware routing, the chained
    hashes of its prompt's full blocks (`block_hashes`, computed when first asked for)."""
    seq_id: int
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_ns: int
    block_size: int
    _hashes: list[int] | None = None
    session_id: str = ""        # a session's turn (workload/sessions.py); "": none

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def block_hashes(self) -> list[int]:
        """The hashes the block manager computes for the prompt's full blocks (compute_hash's chain)."""
        if self._hashes is None:
            prompt = self.prompt_token_ids
            self._hashes = prompt.block_hashes(self.block_size) if isinstance(prompt, HashIdPrompt) \
                else compute_hashes(prompt, self.block_size)
        return self._hashes


class Router:
    """Subclass and override `route`. Built with the fleet's router options as keywords."""
    name = ""

    def __init__(self, seed: int = 0, prefix_weight: float = 1.0, load_weight: float = 1.0):
        self.seed = seed
        self.prefix_weight = prefix_weight
        self.load_weight = load_weight

    def route(self, request: RoutedRequest, replicas: list) -> list[float]:
        """One score per replica of `replicas` (sim.fleet.Replica: its scheduler, its queue of
        routed requests and the figures a router reads), lower is better."""
        raise NotImplementedError


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self, **options):
        super().__init__(**options)
        self.next = 0

    def route(self, request, replicas):
        n = len(replicas)
        scores = [float((i - self.next) % n) for i in range(n)]
        self.next = (self.next + 1) % n
        return scores


class LeastLoaded(Router):
    name = "least_loaded"

    def route(self, request, replicas):
        return [float(r.num_requests) for r in replicas]


class PrefixAware(Router):
    name = "prefix_aware"
    # What a block found in a replica's CPU tier costs, in prefill blocks: it is loaded, not
    # computed, but its request still waits for the load and takes GPU blocks for it (0: a hit
    # like the GPU's; 1: a miss). A subclass sets its own.
    cpu_hit_weight = 0.5

    def route(self, request, replicas):
        hashes, size = request.block_hashes, request.block_size
        num_blocks = -(-request.num_prompt_tokens // size)
        scores = []
        for r in replicas:
            num_gpu_hits = r.num_cached_blocks(hashes)
            tier = r.scheduler.cpu_tier
            num_cpu_hits = tier.num_held_blocks(hashes[num_gpu_hits:]) if tier is not None else 0
            num_prefill_blocks = num_blocks - num_gpu_hits - num_cpu_hits + -(-r.num_prefill_tokens // size)
            scores.append(self.prefix_weight * (num_prefill_blocks + self.cpu_hit_weight * num_cpu_hits)
                          + self.load_weight * r.num_active_blocks)
        return scores


class Random(Router):
    name = "random"

    def __init__(self, **options):
        super().__init__(**options)
        self.rng = random.Random(self.seed)

    def route(self, request, replicas):
        chosen = self.rng.randrange(len(replicas))
        return [0.0 if i == chosen else 1.0 for i in range(len(replicas))]


class SessionAffinity(Router):
    name = "session_affinity"

    def __init__(self, **options):
        super().__init__(**options)
        self.replica_of: dict[str, int] = {}     # session -> the index of its replica in the pool

    def route(self, request, replicas):
        chosen = self.replica_of.get(request.session_id) if request.session_id else None
        if chosen is None:       # least_loaded's choice: the fleet takes the lowest, the first on a tie
            loads = [r.num_requests for r in replicas]
            chosen = loads.index(min(loads))
            if request.session_id:
                self.replica_of[request.session_id] = chosen
        return [0.0 if i == chosen else 1.0 for i in range(len(replicas))]


BUILTIN_ROUTERS: dict[str, type[Router]] = {cls.name: cls for cls in (RoundRobin, LeastLoaded, PrefixAware, Random,
                                                                      SessionAffinity)}


def load_router(spec: str) -> type[Router]:
    """The router named `spec`: a built-in, or module:Class imported (a name the user gave)."""
    return load_class(spec, BUILTIN_ROUTERS, Router, "router", "tracengine.fleet.routers.Router")


def router_name(cls: type[Router]) -> str:
    """What a trace records for a router class: a built-in's name, else module:Class."""
    return class_name(cls, BUILTIN_ROUTERS)


def router_classes(spec, routers: dict | None = None) -> dict[str, type[Router]]:
    """Each pool's router class: `routers`' (by pool), else the one the spec names, loaded."""
    routers = routers or {}
    pools = {"prefill": spec.router, "decode": spec.decode_router or spec.router} if spec.disaggregated \
        else {"all": spec.router}
    return {pool: routers.get(pool) or load_router(name) for pool, name in pools.items()}
