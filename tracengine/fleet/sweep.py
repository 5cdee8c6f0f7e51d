"""Sweeps of a fleet (docs/cluster.md): `simulate --replicas N ... --sweep NAME=V1,V2`, one row
per variant of the config (every replica's, a pool's or a replica's) or of the fleet itself
(`replicas`, `router`, ...: fleet/overrides.py). A row's figures are the fleet's (fleet/stats.py: latencies from each request's arrival at the router), in the columns of one
engine's sweep (sim/sweep.py); preemptions are summed over the replicas."""
from tracengine.sim.sweep import IN_TIME


def fleet_row_of(s: dict) -> dict:
    """The sweep figures of a fleet_stats dict."""
    lat = s["latency"]

    def ms(seconds):
        return None if seconds is None else seconds * 1e3

    return {"throughput": s["completion_tokens_per_s"],
            **{f"{name}_{p}_ms": ms(lat[name][p]) for name in ("ttft", "tpot", "e2e") for p in ("p50", "p99")},
            "preemptions": sum(p["stats"]["preemption"]["num_preemptions"] for p in s["replicas"]),
            "goodput": s["goodput"]["requests_per_s"] if s.get("goodput") else None}


class FleetVariant:
    """`tracengine simulate` of a fleet (`spec`) under base + overrides: config fields of every
    replica, of a pool or of one replica, and the fleet's own (fleet/overrides.py)."""
    figures = IN_TIME

    def __init__(self, requests: list, base: dict, step_time, spec, slo: dict | None = None):
        self.requests, self.base, self.step_time, self.spec, self.slo = requests, base, step_time, spec, slo

    def _resolve(self, overrides: dict):
        from tracengine.sim.engine import simulate_config
        from tracengine.fleet.overrides import resolve
        fields, spec = resolve(self.spec, {**self.base, **overrides}, self.step_time)
        return simulate_config(fields, self.requests), spec

    def check(self, overrides: dict):
        from tracengine.fleet.engine import check_fleet_requests
        check_fleet_requests(*self._resolve(overrides), self.requests)

    def __call__(self, overrides: dict) -> dict:
        from tracengine.fleet.stats import fleet_stats
        from tracengine.fleet.engine import simulate_fleet
        config, spec = self._resolve(overrides)
        return fleet_row_of(fleet_stats(simulate_fleet(config, self.requests, self.step_time, spec), self.slo))


def fleet_runner(spec, requests) -> FleetVariant:
    """The maker of a fleet sweep's variants (sim/spec.py): the fleet travels in the spec as data."""
    from tracengine.fleet.spec import FleetSpec
    from tracengine.sim.spec import step_time_of
    return FleetVariant(requests, spec.base, step_time_of(spec.step_time), FleetSpec.from_dict(spec.fleet), spec.slo)


