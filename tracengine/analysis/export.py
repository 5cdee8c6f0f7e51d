"""A trace as Chrome trace-event JSON (object form), which ui.perfetto.dev and
chrome://tracing open: `tracengine export run.trace --perfetto out.json`.

Layout:
- process "engine" (pid 1): thread "steps" with one complete event ("X") per
  step named prefill/decode, and inside it schedule/model/postprocess; an
  "idle" span for each gap in which no request was in flight (the engine
  waited for the next arrival); counters ("C") for free KV blocks, batch
  size, tokens per step and queue lengths.
- process "requests" (pid 2): one thread per request (tid = seq_id + 1) with
  its lifecycle as back-to-back "X" spans: waiting, prefill (one per chunk),
  decode (merged over consecutive steps), paused (running but left out of a
  step: prefill-first), preempted; an instant ("i") at its arrival and at
  each preemption. The first span starts at the arrival.

Each request's events are written once it has finished (and the next step has begun), so
the export holds the requests in flight, never the whole trace (analysis/export_stream.py).

Timestamps are integer microseconds on the trace's time axis (each step lasts
its StepEnd durations and begins its gap_ns after the one before;
tracengine/analysis/timeline.py), floored from the cumulative nanoseconds, so
spans meet exactly and every track is monotonic."""
from tracengine.version import __version__
from tracengine.analysis.timeline import RequestTimeline, StepRecord

ENGINE_PID, REQUESTS_PID, STEPS_TID = 1, 2, 1


def _us(ns: int) -> int:
    return ns // 1000


def _meta(pid: int, tid: int, kind: str, name: str, sort_index: int | None = None) -> list[dict]:
    out = [{"ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": f"{kind}_name", "args": {"name": name}}]
    if sort_index is not None:
        out.append({"ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": f"{kind}_sort_index",
                    "args": {"sort_index": sort_index}})
    return out


def _span(pid: int, tid: int, name: str, cat: str, start_ns: int, end_ns: int, args: dict) -> dict:
    ts = _us(start_ns)
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": ts, "dur": _us(end_ns) - ts,
            "args": args}


def _counter(name: str, ts_ns: int, values: dict) -> dict:
    return {"ph": "C", "pid": ENGINE_PID, "tid": STEPS_TID, "name": name, "ts": _us(ts_ns), "args": values}


def step_events(rec: StepRecord, start: int, idle: tuple[int, int] | None) -> list[dict]:
    """The engine track of one step that starts at `start` ns; `idle`: the idle part of the
    gap before it (from, to), if nothing was in flight."""
    d, end = rec.decision, rec.end
    events = []
    if idle is not None:        # nothing in flight: waiting for the next arrival
        a, b = idle
        events.append(_span(ENGINE_PID, STEPS_TID, "idle", "idle", a, b,
                            {"before_step": rec.step, "idle_ns": b - a, "gap_ns": end.gap_ns}))
    events.append(_span(ENGINE_PID, STEPS_TID, d.phase, "step", start, start + rec.duration_ns, {
        "step": rec.step, "batch_size": len(d.seqs), "num_batched_tokens": d.num_batched_tokens,
        "stop_reason": d.stop_reason, "blocked_seq_id": d.blocked_seq_id,
        "num_free_blocks": end.num_free_blocks, "seq_ids": [s.seq_id for s in d.seqs]}))
    t0 = start
    for name, ns in (("schedule", end.schedule_ns), ("model", end.model_ns), ("postprocess", end.postprocess_ns)):
        events.append(_span(ENGINE_PID, STEPS_TID, name, "phase", t0, t0 + ns, {"step": rec.step}))
        t0 += ns
    events.append(_counter("batch", start, {"num_seqs": len(d.seqs)}))
    events.append(_counter("tokens", start, {"num_batched_tokens": d.num_batched_tokens}))
    events.append(_counter("queues", start, {"num_waiting": d.num_waiting, "num_running": d.num_running}))
    events.append(_counter("free_kv_blocks", start + rec.duration_ns, {"num_free_blocks": end.num_free_blocks}))
    if rec.drafts[0]:     # speculative decoding: the drafts the step verified and those it kept
        events.append(_counter("drafts", start, {"num_draft_tokens": rec.drafts[0], "num_accepted_tokens": rec.drafts[1]}))
    return events


def request_spans(t: "RequestTimeline", req) -> list[tuple[str, int, int, dict]]:
    """The request's lifecycle as (name, first step, end step exclusive, args), back to back
    (`t`: a RequestTimeline, or the stream's RequestClock, which has the same step clock)."""
    spans: list[tuple[str, int, int, dict]] = []

    def add(name, a, b, args):
        if b <= a:
            return
        if name == "decode" and spans and spans[-1][0] == "decode" and spans[-1][2] == a:
            prev = spans.pop()     # one decode span over consecutive decode steps
            a, args = prev[1], {"num_tokens": prev[3]["num_tokens"] + 1}
        spans.append((name, a, b, args))

    last = t.num_steps if req.finish_step is None else req.finish_step + 1
    kept = set(req.token_steps)
    preempts = {p.step: p for p in req.preempts}
    marks = sorted([(s, 1, phase, n) for s, phase, n in req.scheduled] + [(s, 0, "preempt", 0) for s in preempts])
    cursor, gap = req.added_step, "waiting"
    chunk = 0
    for step, _, kind, num_tokens in marks:
        add(gap, cursor, step, {})
        if kind == "preempt":
            gap, cursor, chunk = "preempted", step, 0
            continue
        if kind == "prefill":
            add("prefill", step, step + 1, {"chunk": chunk, "num_tokens": num_tokens,
                                            "recompute": step > min(preempts, default=step)})
            chunk += 1
            gap = "paused" if step in kept else "waiting"
        else:
            add("decode", step, step + 1, {"num_tokens": 1})
            gap = "paused"
        cursor = step + 1
    add(gap, cursor, last, {})
    return spans


def request_events(t: "RequestTimeline", req) -> list[dict]:
    tid = req.seq_id + 1
    events = _meta(REQUESTS_PID, tid, "thread", f"seq {req.seq_id}", req.seq_id)
    preempts = {p.step: p for p in req.preempts}
    arrival = t.arrival_ns(req)
    events.append({"ph": "i", "s": "t", "pid": REQUESTS_PID, "tid": tid, "name": "arrival", "cat": "arrival",
                   "ts": _us(arrival), "args": {"seq_id": req.seq_id, "added_step": req.added_step,
                                                "arrival_ns": arrival, "num_prompt_tokens": req.num_prompt_tokens}})
    for i, (name, a, b, args) in enumerate(request_spans(t, req)):
        if name == "preempted" and a in preempts:
            p = preempts[a]
            events.append({"ph": "i", "s": "t", "pid": REQUESTS_PID, "tid": tid, "name": "preempt",
                           "cat": "preempt", "ts": _us(t.start_ns(a)),
                           "args": {"step": a, "by_seq_id": p.by_seq_id, "num_computed_tokens": p.num_computed_tokens,
                                    "num_freed_blocks": len(p.freed_block_ids)}})
        start = t.start_ns(a)
        if i == 0 and arrival < start:         # waiting from its arrival, before the step it entered
            if name == "waiting":
                start = arrival
            else:
                events.append(_span(REQUESTS_PID, tid, "waiting", "request", arrival, start,
                                    {"seq_id": req.seq_id, "steps": []}))
        events.append(_span(REQUESTS_PID, tid, name, "request", start, t.start_ns(b),
                            {"seq_id": req.seq_id, "steps": [a, b - 1], **args}))
    return events


def metadata(header, num_steps: int, torn_tail: str | None) -> dict:
    """The export's "metadata": what made it, the time axis, the trace's header."""
    out = {"exporter": f"tracengine {__version__}", "num_steps": num_steps,
           "time_axis": "cumulative StepEnd gaps and durations (gap_ns, then schedule_ns + model_ns + "
                        "postprocess_ns); requests arrive at RequestAdded.arrival_ns",
           "torn_tail": torn_tail}
    if header is not None:
        out.update(format_version=header.format_version, tracengine_version=header.tracengine_version,
                   config=header.config, model=header.model.name, device=header.device, seed=header.seed)
    return out


def trace_events(t: RequestTimeline) -> dict:
    """The whole export of a folded timeline as a JSON-ready dict, in memory (a fleet's
    replicas, fleet/export.py; one engine's trace is streamed by export_perfetto)."""
    events = _meta(ENGINE_PID, 0, "process", "engine", 0) + _meta(REQUESTS_PID, 0, "process", "requests", 1)
    events += _meta(ENGINE_PID, STEPS_TID, "thread", "steps", 0)
    idle = {step: (a, b) for step, a, b in t.idle_gaps()}
    for rec in t.steps:
        events += step_events(rec, t.start_ns(rec.step), idle.get(rec.step))
    for req in t.requests.values():
        events += request_events(t, req)
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata(t.header, t.num_steps, t.torn_tail)}
