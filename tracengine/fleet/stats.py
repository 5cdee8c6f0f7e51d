"""A fleet trace (fleet/engine.py) read per replica and as a whole: `tracengine stats` of a fleet.

Each replica's events (those after a ReplicaScope naming it) are an ordinary trace of one
engine on the fleet's clock, so every per-replica figure is `stats`' own. The fleet's
latencies are per request from its arrival at the router: in a disaggregated fleet the
TTFT is the prefill replica's first token, and TPOT and end-to-end run to the decode
replica's last token. Load balance: requests and prompt tokens per replica, and the
imbalance, the busiest replica's requests over the mean (1.0: even)."""
import os

from tracengine.analysis.sessions import collect_sessions, session_line, session_stats
from tracengine.analysis.figures import summarize
from tracengine.analysis.stats import NS, goodput, stats
from tracengine.analysis.timeline import RequestTimeline
from tracengine.analysis.timeline_sink import RequestTimelineSink, fold_reads
from tracengine.trace.events import KVTransfer, ReplicaScope, RouteDecision, TraceHeader


def num_replicas(header: TraceHeader) -> int:
    """The replicas of the fleet a trace's header describes (1: one engine's trace)."""
    fleet = header.fleet
    if fleet.get("num_prefill_replicas"):
        return fleet["num_prefill_replicas"] + fleet.get("num_decode_replicas", 0)
    return fleet.get("num_replicas", 1)


def replica_headers(header: TraceHeader) -> list[TraceHeader]:
    """Each replica's header: the fleet's, with the replica's config (a pool's or a replica's
    own fields over every replica's, fleet/overrides.py); all the fleet's when none differs."""
    import msgspec

    from tracengine.engine.config import Config
    from tracengine.fleet.spec import FleetSpec
    from tracengine.fleet.overrides import replica_configs
    n = num_replicas(header)
    if not header.fleet:
        return [header]
    spec = FleetSpec.from_dict(header.fleet)
    if not spec.replica_config:
        return [header] * n
    return [msgspec.structs.replace(header, config=c.to_dict())
            for c in replica_configs(Config.from_dict(header.config), spec)]


class FleetTimelines:
    """An event sink (or a fold of a trace's events) keeping each replica's RequestTimeline,
    the routers' decisions and the KV transfers; passes every event on to `inner` if given.
    `lean`: each timeline keeps only what `stats` reads, as a run folded live does (RequestTimeline)."""
    enabled = True

    def __init__(self, header: TraceHeader, inner=None, lean: bool = False):
        self.header = header
        self.inner = inner if inner is not None and inner.enabled else None
        self.block_events, self.decode_seqs = fold_reads(self.inner, lean)
        self.lean = lean
        self.timelines = {r: RequestTimeline(h, lean) for r, h in enumerate(replica_headers(header))}
        self.routes: list[RouteDecision] = []
        self.transfers: list[KVTransfer] = []
        self.torn_tail: str | None = None
        self._current = self.timelines[0]

    def replica_sink(self, index: int):
        """The sink of replica `index`'s engine: with no writer behind, a live fold of its own into
        the replica's timeline (analysis/timeline_sink.py), which needs no ReplicaScope to say whose
        an event is and takes kept tokens without their events; else this sink, in the trace's order."""
        if self.inner is not None:
            return self
        timeline = self.timelines.get(index)
        sink = RequestTimelineSink(timeline.header if timeline is not None else self.header, lean=self.lean)
        self.timelines[index] = sink.timeline
        return sink

    def emit(self, event) -> None:
        if self.inner is not None:
            self.inner.emit(event)
        t = type(event)
        if t is ReplicaScope:
            timeline = self.timelines.get(event.replica)
            if timeline is None:
                timeline = self.timelines[event.replica] = RequestTimeline(self.header, self.lean)
            self._current = timeline
        elif t is RouteDecision:
            self.routes.append(event)
        elif t is KVTransfer:
            self.transfers.append(event)
        elif t is not TraceHeader:
            self._current.add(event)


def fold_fleet(path_or_events) -> FleetTimelines:
    """FleetTimelines of a trace path (read to its last complete frame) or of its events."""
    if isinstance(path_or_events, (str, os.PathLike)):
        from tracengine.trace.tracelog import TraceReader
        with TraceReader(path_or_events) as reader:
            folded = _fold(reader.events())
            folded.torn_tail = reader.describe_torn_tail()
        return folded
    return _fold(path_or_events)


def _fold(events) -> FleetTimelines:
    it = iter(events)
    folded = FleetTimelines(next(it))
    for event in it:
        folded.emit(event)
    return folded


def replica_streams(events, transfers: bool = False) -> tuple[TraceHeader, dict[int, list]]:
    """Each replica's events as a trace of its own (its header first: replica_headers'), by
    replica. `transfers`: each KVTransfer in the stream of the decode replica it lands on, where
    it landed (a fold of that stream takes its blocks in: replay/fold_transfer.py)."""
    it = iter(events)
    header = next(it)
    headers = replica_headers(header)
    streams: dict[int, list] = {}

    def stream(replica: int) -> list:
        if replica not in streams:
            streams[replica] = [headers[replica] if replica < len(headers) else header]
        return streams[replica]

    current = stream(0)
    for event in it:
        t = type(event)
        if t is ReplicaScope:
            current = stream(event.replica)
        elif t is KVTransfer:
            if transfers:
                stream(event.replica).append(event)
        elif t is not RouteDecision:
            current.append(event)
    return header, streams


def fleet_stats(source, slo: dict[str, float] | None = None) -> dict:
    """`stats` of each replica, and the fleet's figures (see the module docstring)."""
    folded = source if isinstance(source, FleetTimelines) else fold_fleet(source)
    fleet = folded.header.fleet or {}
    disaggregated = bool(fleet.get("num_prefill_replicas"))
    num_prefill = fleet.get("num_prefill_replicas", 0)
    per_replica, records = [], {}
    for index in range(num_replicas(folded.header)):
        timeline = folded.timelines.get(index) or RequestTimeline(folded.header)
        s = stats(timeline, slo)
        role = ("prefill" if index < num_prefill else "decode") if disaggregated else "all"
        per_replica.append({"replica": index, "role": role, "stats": s})
        for r in s["per_request"]:
            records.setdefault(r["seq_id"], []).append(r)
    requests = [_fleet_request(parts) for _, parts in sorted(records.items())]
    duration_s = max((p["stats"]["steps"]["total_s"] for p in per_replica), default=0.0)
    counts = [p["stats"]["requests"]["num_requests"] for p in per_replica]
    pool = [c for c, p in zip(counts, per_replica) if p["role"] != "decode"]
    # the cache hits of the replicas requests arrive at (a decode replica's are the transfers')
    first = [p["stats"]["prefix_cache"] for p in per_replica if p["role"] != "decode"]
    hits = sum(pc["num_hit_tokens"] or 0 for pc in first)
    lookups = sum(pc["num_lookup_tokens"] for pc in first)
    num_finished = sum(r["finish_step"] is not None for r in requests)
    num_completion = sum(r["num_completion_tokens"] for r in requests)
    transfers = folded.transfers
    return {
        "fleet": dict(fleet),
        "num_replicas": num_replicas(folded.header),
        "requests": {"num_requests": len(requests), "num_finished": num_finished,
                     # a request leaves on one replica: its client's, where it was then
                     "num_aborted": sum(p["stats"]["requests"]["num_aborted"] for p in per_replica)},
        "duration_s": duration_s,
        "completion_tokens_per_s": num_completion / duration_s if duration_s else None,
        "latency": {name: summarize([r[f"{name}_s"] for r in requests if r[f"{name}_s"] is not None])
                    for name in ("ttft", "tpot", "e2e")},
        "goodput": goodput(requests, slo, duration_s) if slo else None,
        "token_hit_rate": hits / lookups if lookups else None,
        "requests_per_replica": counts,
        "request_imbalance": max(pool) / (sum(pool) / len(pool)) if pool and sum(pool) else None,
        "kv_transfer": {"num_transfers": len(transfers), "num_bytes": sum(t.num_bytes for t in transfers),
                        "total_s": sum(t.duration_ns for t in transfers) / NS,
                        "mean_ms": sum(t.duration_ns for t in transfers) / len(transfers) / 1e6 if transfers else None},
        "num_route_decisions": len(folded.routes),
        "sessions": session_stats(collect_sessions([folded.timelines[i] for i in sorted(folded.timelines)])),
        "replicas": per_replica,
        "per_request": requests,
    }


def _fleet_request(parts: list[dict]) -> dict:
    """One request's fleet figures from its replica records: one, or a prefill's and a decode's
    (the prefill's comes first: its replica index is lower)."""
    first = parts[0]
    out = {"seq_id": first["seq_id"], "arrival_s": first["arrival_s"], "num_prompt_tokens": first["num_prompt_tokens"],
           "ttft_s": first["ttft_s"], "tpot_s": first["tpot_s"], "e2e_s": first["e2e_s"],
           "finish_step": first["finish_step"], "num_completion_tokens": first["num_completion_tokens"]}
    if len(parts) > 1:
        decode = parts[-1]
        out["num_completion_tokens"] += decode["num_completion_tokens"]
        out["finish_step"] = decode["finish_step"]
        out["e2e_s"] = out["tpot_s"] = None
        if decode["e2e_s"] is not None and first["ttft_s"] is not None:
            last_s = decode["arrival_s"] + decode["e2e_s"]
            out["e2e_s"] = last_s - first["arrival_s"]
            if decode["num_completion_tokens"]:
                out["tpot_s"] = (last_s - first["arrival_s"] - first["ttft_s"]) / decode["num_completion_tokens"]
    return out


def render_fleet(s: dict, title: str = ""):
    """The text form: the fleet's figures, then one row per replica."""
    from rich.console import Group
    from rich.table import Table

    def ms(value):
        return "-" if value is None else f"{value * 1e3:,.2f}"

    f = s["fleet"]
    shape = (f"{f.get('num_prefill_replicas')} prefill + {f.get('num_decode_replicas')} decode replicas, routers "
             f"{f.get('router')} / {f.get('decode_router') or f.get('router')}" if f.get("num_prefill_replicas")
             else f"{s['num_replicas']} replicas, router {f.get('router')}")
    r = s["requests"]
    aborted = f", {r['num_aborted']} aborted" if r.get("num_aborted") else ""
    lines = [f"{title + chr(10) if title else ''}{shape}: {r['num_requests']} requests ({r['num_finished']} finished"
             f"{aborted}) in {s['duration_s'] * 1e3:,.1f} ms"]
    lat = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("fleet latency", "n", "mean ms", "p50 ms", "p90 ms", "p99 ms"):
        lat.add_column(col, justify="left" if col == "fleet latency" else "right")
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "end-to-end")):
        x = s["latency"][name]
        lat.add_row(label, str(x["count"]), *(ms(x[k]) for k in ("mean", "p50", "p90", "p99")))
    hit = "-" if s["token_hit_rate"] is None else f"{s['token_hit_rate']:.1%}"
    imbalance = "-" if s["request_imbalance"] is None else f"{s['request_imbalance']:.2f}"
    other = [f"prefix cache: {hit} of prompt tokens hit; request imbalance {imbalance} (busiest / mean)"]
    if s["goodput"] is not None:
        g = s["goodput"]
        per_s = "-" if g["requests_per_s"] is None else f"{g['requests_per_s']:,.3f}"
        other.append(f"goodput: {g['num_good_requests']} of {r['num_requests']} requests met the SLO, "
                     f"{per_s} requests/s")
    if s["sessions"] is not None:
        other.append(f"sessions: {session_line(s['sessions'])}")
    kv = s["kv_transfer"]
    if kv["num_transfers"]:
        other.append(f"KV transfers: {kv['num_transfers']}, {kv['num_bytes'] / 1e9:,.3f} GB, "
                     f"mean {kv['mean_ms']:,.3f} ms")
    rep = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("replica", "role", "requests", "prompt tokens", "completion tokens", "cache hit", "TTFT p50 ms",
                "TTFT p99 ms", "steps", "preemptions"):
        rep.add_column(col, justify="left" if col == "role" else "right")
    for p in s["replicas"]:
        x = p["stats"]
        hit = x["prefix_cache"]["token_hit_rate"]
        rep.add_row(str(p["replica"]), p["role"], str(x["requests"]["num_requests"]),
                    f"{x['tokens']['num_prompt_tokens']:,}", f"{x['tokens']['num_completion_tokens']:,}",
                    "-" if hit is None else f"{hit:.1%}", ms(x["latency"]["ttft"]["seconds"]["p50"]),
                    ms(x["latency"]["ttft"]["seconds"]["p99"]), f"{x['steps']['num_steps']:,}",
                    str(x["preemption"]["num_preemptions"]))
    return Group(*lines, "", lat, "", *other, "", rep)
