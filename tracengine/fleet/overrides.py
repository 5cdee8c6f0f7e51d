"""What a fleet's run, what-if or sweep can change, by name (docs/cluster.md):

- a config field of every replica: `max_num_seqs=64`, as one engine's `--set`;
- a config field of one pool, or of one replica, as Dynamo and llm-d configure their prefill
  and decode workers apart: `prefill.max_num_batched_tokens=8192`, `decode.max_num_seqs=256`,
  `replica[2].num_kvcache_blocks=5000` (the replica's index in the fleet, the prefill pool
  first). The most specific wins: a replica's own, then its pool's, then every replica's;
- a field of the fleet itself, by its flag's name: `replicas`, `prefill_replicas`,
  `decode_replicas`, `router`, `decode_router`, `router_seed`, `prefix_weight`, `load_weight`,
  `kv_bytes_per_token`, `kv_transfer_gbps`, `kv_transfer_latency_ms`.

A replica's or a pool's fields travel in FleetSpec.replica_config, flat (`"decode.max_num_seqs":
256`), as the trace header's `fleet` holds them."""
import dataclasses
import re

from tracengine.engine.config import Config, parse_override
from tracengine.errors import ConfigError

# a flag's name -> (FleetSpec field, the field's value of the flag's)
SPEC_FIELDS = {"router": ("router", str), "decode_router": ("decode_router", str),
               "router_seed": ("router_seed", int), "prefix_weight": ("prefix_weight", float),
               "load_weight": ("load_weight", float), "kv_bytes_per_token": ("kv_bytes_per_token", int),
               "kv_transfer_gbps": ("kv_transfer_gbps", float),
               "kv_transfer_latency_ms": ("kv_transfer_latency_ns", lambda ms: round(ms * 1e6))}
SHAPE_FIELDS = {"replicas": "num_replicas", "prefill_replicas": "num_prefill_replicas",
                "decode_replicas": "num_decode_replicas"}
FLEET_NAMES = (*SHAPE_FIELDS, *SPEC_FIELDS)
FLAG_TYPES = {"replicas": int, "prefill_replicas": int, "decode_replicas": int, "router": str, "decode_router": str,
              "router_seed": int, "prefix_weight": float, "load_weight": float, "kv_bytes_per_token": int,
              "kv_transfer_gbps": float, "kv_transfer_latency_ms": float}
SCOPED = re.compile(r"(?:replica\[(\d+)\]|(prefill|decode))\.(\w+)")
# One block size across the fleet: a router hashes a prompt's blocks once for every replica.
UNSCOPED = ("kvcache_block_size",)


def parse_fleet_override(text: str) -> tuple[str, object]:
    """`name=value` of a fleet's what-if or sweep: a fleet field (typed as its flag), a pool's
    or a replica's config field (`prefill.max_num_seqs`, `replica[2].num_kvcache_blocks`,
    typed as the field), or every replica's config field (parse_override)."""
    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    if sep and name in FLEET_NAMES:
        kind = FLAG_TYPES[name]
        try:
            return name, kind(raw.strip())
        except ValueError:
            raise ConfigError(f"{name} expects {'an int' if kind is int else 'a number'}, got {raw.strip()!r}") \
                from None
    scoped = SCOPED.fullmatch(name)
    if scoped is not None:
        field, value = parse_override(f"{scoped.group(3)}={raw}" if sep else scoped.group(3))
        if field in UNSCOPED:
            raise ConfigError(f"{name}: {field} is one for the whole fleet (a router hashes a prompt's blocks once)")
        return f"{name[:scoped.start(3)]}{field}", value
    return parse_override(text)


def is_fleet_name(name: str) -> bool:
    """Whether `name` (of an override) changes the fleet: a fleet field, or a pool's or replica's."""
    return name in FLEET_NAMES or SCOPED.fullmatch(name) is not None


def split_overrides(overrides: dict) -> tuple[dict, dict, dict]:
    """(every replica's config fields, the fleet's fields by flag name, pool and replica fields)."""
    config, fleet, scoped = {}, {}, {}
    for name, value in overrides.items():
        (fleet if name in FLEET_NAMES else scoped if SCOPED.fullmatch(name) else config)[name] = value
    return config, fleet, scoped


def scope_fits(name: str, num_prefill: int, num_decode: int, num_replicas: int) -> str | None:
    """Why the pool or replica `name` names is not in the fleet of this shape; None when it is."""
    scoped = SCOPED.fullmatch(name)
    index, pool = scoped.group(1), scoped.group(2)
    if pool is not None:
        if not num_prefill:
            return f"{name}: a fleet without --prefill-replicas and --decode-replicas has no {pool} pool"
        return None
    total = num_prefill + num_decode if num_prefill else num_replicas
    if int(index) >= total:
        return f"{name}: the fleet has replicas 0..{total - 1}"
    return None


def replica_configs(config: Config, spec) -> list[Config]:
    """Each replica's config: `config`, then its pool's fields, then its own."""
    roles = spec.roles
    configs = []
    for index, role in enumerate(roles):
        fields = {}
        for name, value in spec.replica_config.items():
            scoped = SCOPED.fullmatch(name)
            if scoped.group(2) == role:
                fields.setdefault(scoped.group(3), value)
        for name, value in spec.replica_config.items():
            scoped = SCOPED.fullmatch(name)
            if scoped.group(1) is not None and int(scoped.group(1)) == index:
                fields[scoped.group(3)] = value
        configs.append(config.replace(**fields) if fields else config)
    return configs


def changed_spec(base, fleet: dict, scoped: dict):
    """`base` (a FleetSpec) with the fleet fields `fleet` (by flag name) and the pool and replica
    fields `scoped`. `replicas` makes the fleet aggregated, `prefill_replicas` and
    `decode_replicas` disaggregated (the one not given: `base`'s). Of `base`'s own pool and
    replica fields, those naming a pool or replica the new fleet lacks are dropped."""
    if "replicas" in fleet and ("prefill_replicas" in fleet or "decode_replicas" in fleet):
        raise ConfigError("give --replicas, or --prefill-replicas and --decode-replicas, not both")
    fields = {SPEC_FIELDS[name][0]: SPEC_FIELDS[name][1](value) for name, value in fleet.items()
              if name in SPEC_FIELDS}
    if "replicas" in fleet:
        # aggregated: a disaggregated base's decode router goes with its decode pool
        fields.update(num_replicas=fleet["replicas"], num_prefill_replicas=0, num_decode_replicas=0,
                      decode_router=fleet.get("decode_router", ""))
    elif "prefill_replicas" in fleet or "decode_replicas" in fleet:
        fields.update(num_prefill_replicas=fleet.get("prefill_replicas", base.num_prefill_replicas),
                      num_decode_replicas=fleet.get("decode_replicas", base.num_decode_replicas))
    shape = dataclasses.replace(base, replica_config={}, **fields)
    if shape.decode_router and not shape.disaggregated:
        raise ConfigError("--decode-router goes with --prefill-replicas and --decode-replicas")
    figures = (shape.num_prefill_replicas, shape.num_decode_replicas, shape.num_replicas)
    kept = {name: value for name, value in base.replica_config.items() if scope_fits(name, *figures) is None}
    return dataclasses.replace(shape, replica_config={**kept, **scoped})


def with_kv_bytes(spec, step_time):
    """`spec` with the KV bytes of a token of the roofline model `step_time` times, where it has none."""
    model = getattr(step_time, "model", None) if step_time is not None and step_time.kind == "roofline" else None
    if spec.kv_bytes_per_token or model is None:
        return spec
    return dataclasses.replace(spec, kv_bytes_per_token=2 * model.num_layers * model.num_kv_heads * model.head_dim
                               * model.dtype_bytes)


def complete_spec(spec, step_time, kv_bytes_given: bool = False):
    """`spec` ready to run: the KV bytes of a token from a roofline model unless given, and
    refused, before any run, a transfer bandwidth without them or a router that does not load."""
    from tracengine.fleet.routers import router_classes
    if not kv_bytes_given:
        spec = with_kv_bytes(spec, step_time)
    if spec.disaggregated and spec.kv_transfer_gbps and not spec.kv_bytes_per_token:
        raise ConfigError("--kv-transfer-gbps needs the KV bytes of a token: give --kv-bytes-per-token "
                          "(or a --roofline model)")
    router_classes(spec)
    return spec


def resolve(spec, overrides: dict, step_time) -> tuple[dict, object]:
    """(every replica's config fields, the fleet) of `overrides` (names as parse_fleet_override's)
    over the fleet `spec`."""
    config, fleet, scoped = split_overrides(overrides)
    return config, complete_spec(changed_spec(spec, fleet, scoped), step_time, "kv_bytes_per_token" in fleet)
