"""What a fleet is made of (docs/cluster.md): replicas, or prefill and decode pools, their
routers and the KV transfers between them; and what a fleet trace's header says of it."""
from dataclasses import dataclass, field

from tracengine.errors import ConfigError
from tracengine.fleet.overrides import SCOPED, scope_fits
from tracengine.fleet.routers import Router, router_name


@dataclass
class FleetSpec:
    """The fleet: replicas (or prefill and decode pools), routers and KV transfers."""
    num_replicas: int = 1
    router: str = "round_robin"
    num_prefill_replicas: int = 0          # both > 0: disaggregated, num_replicas unused
    num_decode_replicas: int = 0
    decode_router: str = ""                # "": the same as `router`
    router_seed: int = 0
    prefix_weight: float = 1.0
    load_weight: float = 1.0
    kv_bytes_per_token: int = 0            # K and V of one token, all layers
    kv_transfer_gbps: float = 0.0          # GB/s; 0: no bandwidth cost
    kv_transfer_latency_ns: int = 0
    # a pool's or a replica's config fields, e.g. {"decode.max_num_seqs": 64} (fleet/overrides.py)
    replica_config: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.disaggregated:
            if self.num_prefill_replicas <= 0 or self.num_decode_replicas <= 0:
                raise ConfigError("a disaggregated fleet needs --prefill-replicas and --decode-replicas, both positive")
        elif self.num_replicas <= 0:
            raise ConfigError(f"--replicas must be positive, got {self.num_replicas}")
        if self.kv_bytes_per_token < 0 or self.kv_transfer_gbps < 0 or self.kv_transfer_latency_ns < 0:
            raise ConfigError("KV transfer figures (bytes per token, GB/s, latency) cannot be negative")
        for name in self.replica_config:
            reason = scope_fits(name, self.num_prefill_replicas, self.num_decode_replicas, self.num_replicas) \
                if SCOPED.fullmatch(name) else f"{name!r} names no pool or replica"
            if reason is not None:
                raise ConfigError(reason)

    @property
    def roles(self) -> list[str]:
        """Each replica's: "all", or "prefill" then "decode"."""
        return (["prefill"] * self.num_prefill_replicas + ["decode"] * self.num_decode_replicas
                if self.disaggregated else ["all"] * self.num_replicas)

    @property
    def disaggregated(self) -> bool:
        return self.num_prefill_replicas > 0 or self.num_decode_replicas > 0

    @property
    def total_replicas(self) -> int:
        return self.num_prefill_replicas + self.num_decode_replicas if self.disaggregated else self.num_replicas

    @property
    def is_single(self) -> bool:
        """One engine: its trace is the one simulated engine's, no fleet event in it."""
        return not self.disaggregated and self.num_replicas == 1 and not self.replica_config

    def transfer_ns(self, num_tokens: int) -> tuple[int, int]:
        """(bytes, ns) of shipping `num_tokens` tokens' KV."""
        num_bytes = num_tokens * self.kv_bytes_per_token
        wire_ns = round(num_bytes / self.kv_transfer_gbps) if self.kv_transfer_gbps else 0   # GB/s = bytes/ns
        return num_bytes, self.kv_transfer_latency_ns + wire_ns

    def to_dict(self) -> dict:
        """Flat, as a trace header's `fleet` holds it: the pool and replica fields by their names."""
        return {**{name: getattr(self, name) for name in self.__dataclass_fields__ if name != "replica_config"},
                **self.replica_config}

    @classmethod
    def from_dict(cls, values: dict) -> "FleetSpec":
        fields = {k: v for k, v in values.items() if k in cls.__dataclass_fields__ and k != "replica_config"}
        return cls(**fields, replica_config={k: v for k, v in values.items() if SCOPED.fullmatch(k)})


def header_fields(spec: FleetSpec, routers: dict[str, type[Router]]) -> dict:
    """TraceHeader.fleet: the spec, each pool's router named as it ran; nothing for one engine."""
    if spec.is_single:
        return {}
    fields = spec.to_dict()
    for pool, cls in routers.items():
        fields["decode_router" if pool == "decode" else "router"] = router_name(cls)
    return fields
