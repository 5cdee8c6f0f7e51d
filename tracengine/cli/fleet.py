"""Fleets on the command line (docs/cluster.md): `simulate --replicas N --router NAME` and
`--prefill-replicas P --decode-replicas D`; `replay`, `stats` and `diff` of a fleet trace."""
import json

from tracengine.cli.common import EXIT_FAILED_CHECK, EXIT_OK
from tracengine.errors import TracengineError


def is_fleet_trace(path) -> bool:
    """Whether the trace at `path` is a fleet's (its header has a fleet): the commands that read
    one take it whole (docs/cluster.md)."""
    import os

    from tracengine.trace.tracelog import TraceReader
    if not (os.path.isfile(path) and os.path.getsize(path)):
        return False      # the command's own reading says what is wrong
    with TraceReader(path) as reader:
        return bool(reader.header.fleet)


def add_fleet_arguments(p):
    g = p.add_argument_group("fleet: replicas behind a router (docs/cluster.md)")
    g.add_argument("--replicas", type=int, metavar="N", help="replicas, each the real scheduler with its own KV cache")
    g.add_argument("--router", metavar="NAME", help="round_robin (default), least_loaded, prefix_aware, random, "
                   "or a tracengine.sim.routers.Router subclass as module:Class")
    g.add_argument("--prefill-replicas", type=int, metavar="P", help="disaggregated: replicas that prefill")
    g.add_argument("--decode-replicas", type=int, metavar="D", help="disaggregated: replicas that decode")
    g.add_argument("--decode-router", metavar="NAME", help="the decode pool's router (default: --router)")
    g.add_argument("--router-seed", type=int, default=0, metavar="N", help="the random router's seed (default 0)")
    g.add_argument("--prefix-weight", type=float, default=1.0, metavar="X",
                   help="prefix_aware: weight of the blocks to prefill (default 1)")
    g.add_argument("--load-weight", type=float, default=1.0, metavar="X",
                   help="prefix_aware: weight of the KV blocks in use (default 1)")
    g.add_argument("--kv-bytes-per-token", type=int, metavar="N",
                   help="K and V bytes of one token, all layers (default: the --roofline model's)")
    g.add_argument("--kv-transfer-gbps", type=float, default=0.0, metavar="X",
                   help="KV transfer bandwidth in GB/s (gigabytes; default 0: no bandwidth cost)")
    g.add_argument("--kv-transfer-latency-ms", type=float, default=0.0, metavar="X",
                   help="fixed time of each KV transfer (default 0)")


def fleet_spec_from_args(args, step_time):
    """The FleetSpec the flags describe, or None for one engine given no fleet flag."""
    from tracengine.sim.fleet import FleetSpec, router_classes
    disaggregated = args.prefill_replicas is not None or args.decode_replicas is not None
    if disaggregated and args.replicas is not None:
        raise TracengineError("give --replicas, or --prefill-replicas and --decode-replicas, not both")
    if args.decode_router and not disaggregated:
        raise TracengineError("--decode-router goes with --prefill-replicas and --decode-replicas")
    if not disaggregated and args.replicas is None and args.router is None:
        return None
    kv_bytes = args.kv_bytes_per_token
    if kv_bytes is None:
        model = getattr(step_time, "model", None) if step_time.kind == "roofline" else None
        kv_bytes = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes if model else 0
    if disaggregated and args.kv_transfer_gbps and not kv_bytes:
        raise TracengineError("--kv-transfer-gbps needs the KV bytes of a token: give --kv-bytes-per-token "
                              "(or a --roofline model)")
    spec = FleetSpec(num_replicas=1 if args.replicas is None else args.replicas, router=args.router or "round_robin",
                     num_prefill_replicas=args.prefill_replicas or 0, num_decode_replicas=args.decode_replicas or 0,
                     decode_router=args.decode_router or "", router_seed=args.router_seed,
                     prefix_weight=args.prefix_weight, load_weight=args.load_weight, kv_bytes_per_token=kv_bytes,
                     kv_transfer_gbps=args.kv_transfer_gbps,
                     kv_transfer_latency_ns=round(args.kv_transfer_latency_ms * 1e6))
    router_classes(spec)      # a router that does not load fails here, before the run
    return spec


def simulate_fleet_command(args, config, requests, step_time, spec, slo, on_progress) -> dict:
    """Runs the fleet, recording with --record; returns fleet_stats of the run."""
    from tracengine.analysis.fleet import FleetTimelines, fleet_stats
    from tracengine.sim.fleet import fleet_header, router_classes, simulate_fleet
    routers = router_classes(spec)     # loaded once: a user's class is named in the header as it runs
    header = fleet_header(config, step_time, spec, routers)
    if args.record:
        from tracengine.trace.tracelog import TraceWriter
        with TraceWriter(args.record, header, deflate=False) as writer:
            sink = FleetTimelines(header, writer)
            simulate_fleet(config, requests, step_time, spec, sink, header, on_progress, routers)
    else:
        sink = FleetTimelines(header)
        simulate_fleet(config, requests, step_time, spec, sink, header, on_progress, routers)
    return fleet_stats(sink, slo)


def print_fleet_stats(s: dict, title: str) -> None:
    from tracengine.analysis.fleet import render_fleet
    from tracengine.cli.common import print_table
    print_table(render_fleet(s, title=title))


def fleet_stats_command(path, slo, as_json: bool) -> int:
    from tracengine.analysis.fleet import fleet_stats
    s = fleet_stats(path, slo or None)
    if as_json:
        print(json.dumps(s, indent=2))
    else:
        print_fleet_stats(s, str(path))
    return EXIT_OK


def fleet_export_command(path, out) -> int:
    from tracengine.analysis.fleet_export import export_fleet_perfetto
    doc = export_fleet_perfetto(path, out)
    print(f"wrote {out}: {len(doc['traceEvents']):,} trace events, {doc['metadata']['num_replicas']} replicas; "
          f"open it in ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


def fleet_router_arg(header, router: str | None) -> dict | None:
    """replay --router: the class to replay every pool with."""
    if not router:
        return None
    from tracengine.sim.routers import load_router
    cls = load_router(router)
    pools = ("prefill", "decode") if header.fleet.get("num_prefill_replicas") else ("all",)
    return {pool: cls for pool in pools}


def fleet_replay_command(path, events: list, as_json: bool, policy, router) -> int:
    from tracengine.analysis.render import format_event
    from tracengine.replay.fleet import reexecute_fleet
    result = reexecute_fleet(events, policy, fleet_router_arg(events[0], router))
    d = result.divergence
    if as_json:
        from tracengine.trace.events import to_builtins
        print(json.dumps({"trace": str(path), "reproduced": result.ok, "num_steps": result.num_steps,
                          "num_events": result.num_events, "seconds": result.seconds,
                          "divergence": None if d is None else {
                              "index": d.index, "replica": d.replica, "step": d.step, "seq_id": d.seq_id,
                              "reason": d.reason, "expected": None if d.expected is None else to_builtins(d.expected),
                              "actual": None if d.actual is None else to_builtins(d.actual)}}, indent=2))
        return EXIT_OK if result.ok else EXIT_FAILED_CHECK
    if result.ok:
        from tracengine.analysis.fleet import num_replicas
        print(f"{path}: a fleet of {num_replicas(events[0])} replicas, {result.num_steps} replica steps and "
              f"{result.num_events} events reproduced exactly ({result.seconds:.2f} s)")
        return EXIT_OK
    where = (f"routing of request s{d.seq_id}" if d.seq_id is not None
             else f"replica {d.replica}, step {d.step}")
    print(f"{path}: diverges at {where} (event #{d.index}): {d.reason}")
    print(f"  recorded: {format_event(d.expected, wall_clock=False) if d.expected is not None else '(nothing)'}")
    print(f"  replayed: {format_event(d.actual, wall_clock=False) if d.actual is not None else '(nothing)'}")
    return EXIT_FAILED_CHECK


def fleet_diff_command(args, a_events: list, b_events: list) -> int:
    """Two traces of which one at least is a fleet's: the first routing difference, then each
    replica's first scheduling difference."""
    from tracengine.analysis.fleet import fleet_stats, replica_streams
    from tracengine.replay.diff import diff_traces
    from tracengine.trace.events import RouteDecision, without_wall_clock
    routes_a = [e for e in a_events if type(e) is RouteDecision]
    routes_b = [e for e in b_events if type(e) is RouteDecision]
    first_route = next((i for i, (x, y) in enumerate(zip(routes_a, routes_b))
                        if without_wall_clock(x) != without_wall_clock(y)),
                       None if len(routes_a) == len(routes_b) else min(len(routes_a), len(routes_b)))
    (_, streams_a), (_, streams_b) = replica_streams(a_events), replica_streams(b_events)
    per_replica = {}
    for r in sorted(set(streams_a) | set(streams_b)):
        d = diff_traces(streams_a.get(r, [a_events[0]]), streams_b.get(r, [b_events[0]]))
        per_replica[r] = d.step
    stats_a, stats_b = fleet_stats(a_events), fleet_stats(b_events)
    identical = first_route is None and all(step is None for step in per_replica.values())
    route = None
    if first_route is not None:
        x = routes_a[first_route] if first_route < len(routes_a) else None
        y = routes_b[first_route] if first_route < len(routes_b) else None
        route = {"index": first_route, "a": _route_json(x), "b": _route_json(y)}
    if args.json:
        print(json.dumps({"a": str(args.a), "b": str(args.b), "identical": identical, "first_route_difference": route,
                          "first_difference_step_by_replica": per_replica,
                          "a_fleet": {k: v for k, v in stats_a.items() if k not in ("replicas", "per_request")},
                          "b_fleet": {k: v for k, v in stats_b.items() if k not in ("replicas", "per_request")}},
                         indent=2))
        return EXIT_OK if identical else EXIT_FAILED_CHECK
    if identical:
        print(f"no routing or scheduling difference over {len(per_replica)} replicas")
        return EXIT_OK
    if route is not None:
        a, b = route["a"], route["b"]
        print(f"first routing difference, decision #{first_route}: "
              f"a {_describe_route(a)}; b {_describe_route(b)}")
    for r, step in per_replica.items():
        print(f"replica {r}: " + ("no scheduling difference" if step is None else f"first difference at step {step}"))
    for label, s in (("a", stats_a), ("b", stats_b)):
        t = s["latency"]["ttft"]
        print(f"{label}: {s['duration_s'] * 1e3:,.1f} ms, TTFT p50 {_ms(t['p50'])} p99 {_ms(t['p99'])} ms, "
              f"cache hit {_pct(s['token_hit_rate'])}, imbalance {_num(s['request_imbalance'])}")
    return EXIT_FAILED_CHECK


def _route_json(e):
    return None if e is None else {"seq_id": e.seq_id, "pool": e.pool, "replica": e.replica, "scores": e.scores}


def _describe_route(r) -> str:
    return "(none)" if r is None else f"s{r['seq_id']} to replica {r['replica']} (scores {r['scores']})"


def _ms(x):
    return "-" if x is None else f"{x * 1e3:,.2f}"


def _pct(x):
    return "-" if x is None else f"{x:.1%}"


def _num(x):
    return "-" if x is None else f"{x:.2f}"
