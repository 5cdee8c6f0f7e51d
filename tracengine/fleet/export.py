"""A fleet trace (fleet/engine.py) as Chrome trace-event JSON: `tracengine export` of a fleet.

Each replica is exported as one engine is (analysis/export.py), as two processes of its own:
"replica R" (its steps and counters) and "replica R requests" (one thread per request it
served). Process 0, "router", holds an instant per routing decision (the request, the chosen
replica and every candidate's score). A KV transfer is a flow from the request's thread on its
prefill replica, where the transfer leaves, to its thread on the decode replica, where it lands."""
import msgspec

from tracengine.analysis.export import ENGINE_PID, REQUESTS_PID, _meta, _us, trace_events
from tracengine.fleet.stats import FleetTimelines, fold_fleet
from tracengine.analysis.timeline import RequestTimeline

ROUTER_PID = 0


def replica_pid(replica: int, pid: int) -> int:
    """A replica's process for the single-engine export's `pid` (ENGINE_PID or REQUESTS_PID)."""
    return 2 * replica + pid


def fleet_trace_events(folded: FleetTimelines) -> dict:
    events = _meta(ROUTER_PID, 0, "process", "router", 0)
    for replica, timeline in sorted(folded.timelines.items()):
        doc = trace_events(timeline)
        names = {ENGINE_PID: f"replica {replica}", REQUESTS_PID: f"replica {replica} requests"}
        for e in doc["traceEvents"]:
            pid = e["pid"]
            e["pid"] = replica_pid(replica, pid)
            if e["ph"] == "M" and e["name"] == "process_name":
                e["args"] = {"name": names[pid]}
            elif e["ph"] == "M" and e["name"] == "process_sort_index":
                e["args"] = {"sort_index": e["pid"]}
            events.append(e)
    for d in folded.routes:
        events.append({"ph": "i", "s": "p", "pid": ROUTER_PID, "tid": 0, "name": f"route s{d.seq_id}",
                       "cat": "route", "ts": _us(d.arrival_ns),
                       "args": {"seq_id": d.seq_id, "pool": d.pool, "replica": d.replica,
                                "scores": dict(zip(map(str, d.candidates), d.scores))}})
    for flow_id, t in enumerate(folded.transfers, 1):
        landing = _arrival(folded.timelines.get(t.replica), t.seq_id)
        if landing is None:
            continue
        common = {"name": "kv transfer", "cat": "kv_transfer", "id": flow_id}
        args = {"seq_id": t.seq_id, "num_tokens": t.num_tokens, "num_bytes": t.num_bytes,
                "duration_ns": t.duration_ns, "num_blocks": t.num_blocks}
        events.append({**common, "ph": "s", "pid": replica_pid(t.src_replica, REQUESTS_PID), "tid": t.seq_id + 1,
                       "ts": _us(landing - t.duration_ns), "args": args})
        events.append({**common, "ph": "f", "bp": "e", "pid": replica_pid(t.replica, REQUESTS_PID),
                       "tid": t.seq_id + 1, "ts": _us(landing), "args": args})
    header = folded.header
    metadata = {"num_replicas": len(folded.timelines), "fleet": dict(header.fleet),
                "format_version": header.format_version, "config": header.config}
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata}


def _arrival(timeline: RequestTimeline | None, seq_id: int) -> int | None:
    req = timeline.requests.get(seq_id) if timeline is not None else None
    return None if req is None else timeline.arrival_ns(req)


def export_fleet_perfetto(source, out_path) -> dict:
    """Write the Chrome trace-event JSON of a fleet trace (a path or its events) to `out_path`."""
    doc = fleet_trace_events(fold_fleet(source))
    with open(out_path, "wb") as f:
        f.write(msgspec.json.encode(doc))
    return doc
