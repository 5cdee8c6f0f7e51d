"""`tracengine replay TRACE --sweep ...` through a fleet (docs/cluster.md): a fleet trace's
workload, or one engine's, through every variant of a grid of fleet fields (`replicas`,
`router`, `prefix_weight`, ...), every replica's config fields, a pool's or a replica's
(`decode.max_num_seqs`, `replica[1].num_kvcache_blocks`), in simulated time; on the local
executor or Ray, behind the result cache, as one engine's sweep (cli/sweeps.py)."""
import os

from tracengine.errors import TracengineError


def fleet_sweep_command(args, events: list, overrides: dict, scoped: dict, step_time) -> int:
    """`events`: those of the trace at args.trace, read. The fleet flags, --set's fields of every
    replica and `scoped` (a pool's or a replica's) are every variant's base."""
    from tracengine.cli.fleet_commands import check_flags_not_swept, fleet_changes
    from tracengine.cli.steptime import describe_step_time, print_unvaried_note, step_time_json
    from tracengine.cli.sweeps import print_sweep, sweep_options
    from tracengine.fleet.whatif import prepare_fleet
    from tracengine.fleet.overrides import parse_fleet_override
    from tracengine.sim.spec import PreparedSources, Source
    path = args.trace
    check_flags_not_swept(args)
    base = {**overrides, **fleet_changes(args), **scoped}
    variants, slo = sweep_options(args, base, parse=parse_fleet_override)
    if args.record:
        raise TracengineError("--record writes one run; a --sweep makes many")
    source, prepared = Source.of("trace", path), PreparedSources()
    spec, model = prepare_fleet(prepared, source, events, step_time, os.path.basename(path), base, slo, args.policy)
    if not args.json:
        print(f"sweep of {path} through a fleet in simulated time (from the recorded one: "
              f"{_describe(spec.fleet)}); step times: {describe_step_time(model, path)}")
    meta = {"trace": str(path), "arrivals": "time", "step_time": step_time_json(model, path),
            "fleet": spec.fleet, "overrides": base}
    rc = print_sweep(spec, source, prepared, variants, args, meta)
    if not args.json:
        print_unvaried_note(model)
    return rc


def _describe(fleet: dict) -> str:
    if fleet.get("num_prefill_replicas"):
        return (f"{fleet['num_prefill_replicas']} prefill + {fleet['num_decode_replicas']} decode replicas, "
                f"router {fleet['router']}")
    return f"{fleet['num_replicas']} replica{'s' if fleet['num_replicas'] > 1 else ''}, router {fleet['router']}"
