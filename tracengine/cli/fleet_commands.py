"""Fleets on the command line (docs/cluster.md): `simulate --replicas N --router NAME` and
`--prefill-replicas P --decode-replicas D`, with a sweep; `replay` (re-execution and what-if),
`stats`, `diff` and `export` of a fleet trace."""
import json

from tracengine.cli.common import EXIT_FAILED_CHECK, EXIT_OK
from tracengine.errors import TraceError, TracengineError
from tracengine.analysis.figures import to_json_object


def add_fleet_arguments(p, what_if: bool = False):
    """The fleet flags; on `replay`, `what_if`: they change a fleet trace's recorded fleet."""
    default = "the recorded" if what_if else "default"
    g = p.add_argument_group("fleet: replicas behind a router (docs/cluster.md)" +
                             (": a fleet trace's what-if" if what_if else ""),
                             "--set prefill.FIELD=V, decode.FIELD=V or replica[N].FIELD=V sets a pool's or a "
                             "replica's own config; --sweep takes these names, and the fleet flags' (replicas=2,4)")
    g.add_argument("--replicas", type=int, metavar="N", help="replicas, each the real scheduler with its own KV cache")
    g.add_argument("--router", metavar="NAME", help="round_robin (default), least_loaded, prefix_aware, random, "
                   "session_affinity, or a tracengine.fleet.routers.Router subclass as module:Class" +
                   ("; alone, the router a fleet trace is re-executed with" if what_if else ""))
    g.add_argument("--prefill-replicas", type=int, metavar="P", help="disaggregated: replicas that prefill")
    g.add_argument("--decode-replicas", type=int, metavar="D", help="disaggregated: replicas that decode")
    g.add_argument("--decode-router", metavar="NAME", help="the decode pool's router (default: --router)")
    g.add_argument("--router-seed", type=int, metavar="N", help=f"the random router's seed ({default} 0)")
    g.add_argument("--prefix-weight", type=float, metavar="X",
                   help=f"prefix_aware: weight of the blocks to prefill ({default} 1)")
    g.add_argument("--load-weight", type=float, metavar="X",
                   help=f"prefix_aware: weight of the KV blocks in use ({default} 1)")
    # --kv-bytes-per-token is the engine config's flag (a CPU tier's too), which a fleet's transfers also read
    g.add_argument("--kv-transfer-gbps", type=float, metavar="X",
                   help=f"KV transfer bandwidth in GB/s (gigabytes; {default} 0: no bandwidth cost)")
    g.add_argument("--kv-transfer-latency-ms", type=float, metavar="X",
                   help=f"fixed time of each KV transfer ({default} 0)")


def fleet_changes(args) -> dict:
    """The fleet flags given, by name (fleet/overrides.py's names, as a sweep names them)."""
    from tracengine.fleet.overrides import FLEET_NAMES
    return {name: getattr(args, name) for name in FLEET_NAMES if getattr(args, name, None) is not None}


def check_flags_not_swept(args):
    """A fleet flag and --sweep may not name the same field (one of the two would silently win)."""
    swept = {text.partition("=")[0].strip().replace("-", "_") for text in args.sweep}
    both = [name for name in fleet_changes(args) if name in swept]
    if both:
        raise TracengineError(f"--{both[0].replace('_', '-')} and --sweep both name {both[0]}; give its values "
                              "to --sweep alone")


def check_fleet_flags_of_one_engine(args):
    """A fleet flag (a router, KV transfers) with no fleet's shape given (--replicas, or the two
    pools) is refused, not dropped: the run would be one engine's, not the one asked for.
    `--replicas 1` with any of them is one engine by choice (docs/cluster.md)."""
    from tracengine.fleet.overrides import SHAPE_FIELDS, SPEC_FIELDS
    changes = fleet_changes(args)
    given = [f"--{name.replace('_', '-')}" for name in changes if name in SPEC_FIELDS and name != "kv_bytes_per_token"]
    if given and not any(name in changes for name in SHAPE_FIELDS):
        raise TracengineError(f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with a fleet: give "
                              "--replicas N (or --prefill-replicas P --decode-replicas D); without it the run is "
                              "one engine, which routes nothing")


def take_scoped_sets(args) -> dict:
    """The --set entries naming a pool or a replica (`decode.max_num_seqs=64`,
    `replica[2].num_kvcache_blocks=5000`), typed, taken out of `args.set` (the rest are every
    replica's, one engine's)."""
    from tracengine.fleet.overrides import SCOPED, parse_fleet_override
    scoped, rest = {}, []
    for text in args.set:
        name = text.partition("=")[0].strip().replace("-", "_")
        if SCOPED.fullmatch(name):
            key, value = parse_fleet_override(text)
            if key in scoped:
                raise TracengineError(f"{key} is given twice in --set")
            scoped[key] = value
        elif "[" in name or "." in name:
            raise TracengineError(f"--set {name}: a pool's or a replica's field is prefill.FIELD, decode.FIELD or "
                                  "replica[N].FIELD (N: its index in the fleet, the prefill pool first)")
        else:
            rest.append(text)
    args.set = rest
    return scoped


def fleet_spec_from_args(args, step_time, base=None, scoped: dict | None = None):
    """The FleetSpec the flags (and the pool and replica --set fields `scoped`) describe over
    `base` (a recorded fleet's; default FleetSpec()), or None for one engine when neither is given
    and there is no base."""
    changes = {**fleet_changes(args), **(scoped or {})}
    if base is None and not changes:
        return None
    from tracengine.fleet.spec import FleetSpec     # one engine's run has no fleet to describe
    from tracengine.fleet.overrides import resolve
    return resolve(base if base is not None else FleetSpec(), changes, step_time)[1]


def simulate_fleet_command(args, config, requests, step_time, spec, slo, on_progress) -> dict:
    """Runs the fleet, recording with --record; returns fleet_stats of the run."""
    from tracengine.fleet.stats import FleetTimelines, fleet_stats
    from tracengine.fleet.engine import fleet_header, simulate_fleet
    from tracengine.fleet.routers import router_classes
    routers = router_classes(spec)     # loaded once: a user's class is named in the header as it runs
    header = fleet_header(config, step_time, spec, routers)
    if args.record:
        from tracengine.trace.tracelog import TraceWriter
        with TraceWriter(args.record, header, deflate=False) as writer:
            sink = FleetTimelines(header, writer, lean=True)
            simulate_fleet(config, requests, step_time, spec, sink, header, on_progress, routers)
    else:
        sink = FleetTimelines(header, lean=True)     # a run folded live: what its stats read
        simulate_fleet(config, requests, step_time, spec, sink, header, on_progress, routers)
    return fleet_stats(sink, slo)


def print_fleet_stats(s: dict, title: str) -> None:
    from tracengine.fleet.stats import render_fleet
    from tracengine.cli.common import print_table
    print_table(render_fleet(s, title=title))


def fleet_stats_command(path, slo, as_json: bool) -> int:
    from tracengine.fleet.stats import fleet_stats
    s = fleet_stats(path, slo or None)
    if as_json:
        print(json.dumps(s, indent=2, default=to_json_object))
    else:
        print_fleet_stats(s, str(path))
    return EXIT_OK


# (label, key path into fleet_stats, scale, format) of the what-if's table
WHATIF_ROWS = [("duration ms", ("duration_s",), 1e3, "{:,.1f}")]
WHATIF_ROWS += [(f"{label} {p} ms", ("latency", name, p), 1e3, "{:,.2f}")
                for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "e2e")) for p in ("p50", "p90", "p99")]
WHATIF_ROWS += [("aborted", ("requests", "num_aborted"), 1, "{:,}"),
                ("cache hit", ("token_hit_rate",), 100, "{:.1f}%"),
                ("request imbalance", ("request_imbalance",), 1, "{:.2f}"),
                ("KV transfers", ("kv_transfer", "num_transfers"), 1, "{:,}")]


def fleet_whatif_command(path, events: list, overrides: dict, record, step_time, policy, as_json: bool) -> int:
    from tracengine.fleet.whatif import fleet_whatif
    from tracengine.trace.tracelog import write_trace
    result = fleet_whatif(events, None, overrides, step_time, str(path), policy)
    if record:
        write_trace(record, result.events)
    if as_json:
        drop = ("replicas", "per_request")
        changes = [{"name": n, "old": a, "new": b} for n, a, b in result.changes]
        print(json.dumps({"trace": str(path), "changes": changes,
                          "recorded": {k: v for k, v in result.recorded.items() if k not in drop},
                          "what_if": {k: v for k, v in result.new.items() if k not in drop}, "record": record},
                         indent=2, default=to_json_object))
        return EXIT_OK
    changes = ", ".join(f"{name} {'-' if a is None else a} -> {'-' if b is None else b}"
                        for name, a, b in result.changes) or "no change"
    print(f"fleet what-if on {path} in simulated time: {changes}")
    from tracengine.cli.steptime import describe_step_time
    print(f"step times: {describe_step_time(result.step_time, str(path))}")
    from tracengine.analysis.tables import make_table, table_text
    from tracengine.analysis.figures import figure_at
    rows = []
    for label, keys, scale, fmt in WHATIF_ROWS:
        a, b = figure_at(result.recorded, *keys), figure_at(result.new, *keys)
        cell = [("-" if v is None else fmt.format(v * scale)) for v in (a, b)]
        change = "-" if a in (None, 0) or b is None else f"{(b - a) / a:+.1%}"
        rows.append([label, *cell, change])
    print(table_text(make_table(["", "recorded", "what-if", "change"], rows)))
    if record:
        print(f"wrote {record}")
    return EXIT_OK


def fleet_export_command(path, out) -> int:
    from tracengine.fleet.export import export_fleet_perfetto
    doc = export_fleet_perfetto(path, out)
    print(f"wrote {out}: {len(doc['traceEvents']):,} trace events, {doc['metadata']['num_replicas']} replicas; "
          f"open it in ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


def fleet_router_arg(header, router: str | None) -> dict | None:
    """replay --router: the class to replay every pool with."""
    if not router:
        return None
    from tracengine.fleet.routers import load_router
    cls = load_router(router)
    pools = ("prefill", "decode") if header.fleet.get("num_prefill_replicas") else ("all",)
    return {pool: cls for pool in pools}


def fleet_replay_command(path, events: list, as_json: bool, policy, router) -> int:
    from tracengine.analysis.render import format_event
    from tracengine.fleet.replay import reexecute_fleet
    result = reexecute_fleet(events, policy, fleet_router_arg(events[0], router))
    d = result.divergence
    if as_json:
        from tracengine.trace.views import to_builtins
        print(json.dumps({"trace": str(path), "reproduced": result.ok, "num_steps": result.num_steps,
                          "num_events": result.num_events, "seconds": result.seconds,
                          "divergence": None if d is None else {
                              "index": d.index, "replica": d.replica, "step": d.step, "seq_id": d.seq_id,
                              "reason": d.reason, "expected": None if d.expected is None else to_builtins(d.expected),
                              "actual": None if d.actual is None else to_builtins(d.actual)}}, indent=2))
        return EXIT_OK if result.ok else EXIT_FAILED_CHECK
    if result.ok:
        from tracengine.fleet.stats import num_replicas
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
    from tracengine.fleet.stats import fleet_stats, replica_streams
    from tracengine.analysis.stats import format_number, format_percent
    from tracengine.replay.diff import diff_traces
    from tracengine.trace.events import RouteDecision
    from tracengine.trace.views import without_wall_clock
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
                         indent=2, default=to_json_object))
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
              f"cache hit {format_percent(s['token_hit_rate'])}, "
              f"imbalance {format_number(s['request_imbalance'], '{:.2f}')}")
    return EXIT_FAILED_CHECK


def _route_json(e):
    return None if e is None else {"seq_id": e.seq_id, "pool": e.pool, "replica": e.replica, "scores": e.scores}


def _describe_route(r) -> str:
    return "(none)" if r is None else f"s{r['seq_id']} to replica {r['replica']} (scores {r['scores']})"


def _ms(x):
    return "-" if x is None else f"{x * 1e3:,.2f}"


def fleet_step_tables(reader, steps, seq) -> list[str]:
    """A fleet trace's step tables, one per replica (docs/cluster.md)."""
    from tracengine.analysis.render import render_steps
    from tracengine.fleet.stats import replica_streams
    _, streams = replica_streams(reader.events())
    return [f"# replica {replica}\n" + render_steps(events, steps, seq) for replica, events in sorted(streams.items())]


def fleet_tui_command(path, follow: bool) -> int:
    """A fleet trace in the viewer, one replica at a time."""
    if follow:
        raise TraceError("a fleet trace is shown whole: --follow follows one engine's")
    from tracengine.tui.fleet_app import run_fleet_tui
    return run_fleet_tui(path)


def fleet_event_check(header):
    """Each replica's events checked on their own (fleet/replay.py)."""
    from tracengine.fleet.replay import FleetEventCheck
    return FleetEventCheck(header)


def fleet_diff_of_readers(args, reader_a, reader_b) -> int:
    from tracengine.cli.outputs import note_torn_tail
    a_events, b_events = list(reader_a.events()), list(reader_b.events())
    note_torn_tail(reader_a)
    note_torn_tail(reader_b)
    return fleet_diff_command(args, a_events, b_events)
