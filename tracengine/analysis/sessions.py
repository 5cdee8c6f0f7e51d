"""Per-session figures of a trace whose requests are turns of sessions (workload/sessions.py):
`tracengine stats`' "sessions" (docs/stats.md).

A session lasts from its first turn's arrival to the end of the step its last turn finished in
(or was aborted before). Its time is spent waiting on the server (some turn of it sent and not
yet finished: the union of its turns' arrival-to-finish spans, so parallel turns of an agentic
session count once) or thinking (no turn of it in flight: the user's or the tool's time before
the next turn is sent). A turn that was aborted, or finished with an error, ended its session
early: its later turns were never sent."""
from dataclasses import dataclass, field

from tracengine.analysis.timeline import RequestTimeline

NS = 1e9


@dataclass
class SessionSpan:
    """A session's turns as the trace has them."""
    session_id: str
    spans: list[tuple[int, int]] = field(default_factory=list)   # (arrival, finish or abort) ns of each turn
    num_turns: int = 0
    num_unfinished: int = 0     # turns still running when the trace ends
    ended_early: bool = False   # a turn was aborted or failed

    def add(self, arrival_ns: int, end_ns: int | None, failed: bool) -> None:
        self.num_turns += 1
        self.ended_early |= failed
        if end_ns is None:
            self.num_unfinished += 1
        else:
            self.spans.append((arrival_ns, end_ns))

    def figures(self) -> dict:
        spans = sorted(self.spans)
        start = spans[0][0] if spans else None
        server_ns, reach = 0, None      # the union of the spans: time some turn was in flight
        for a, b in spans:
            if reach is None or a > reach:
                server_ns += b - a
                reach = b
            elif b > reach:
                server_ns += b - reach
                reach = b
        duration_ns = (max(b for _, b in spans) - start) if spans else 0
        return {"session_id": self.session_id, "num_turns": self.num_turns, "start_s": None if start is None else
                start / NS, "duration_s": duration_ns / NS, "server_s": server_ns / NS,
                "think_s": (duration_ns - server_ns) / NS, "ended_early": self.ended_early,
                "num_unfinished_turns": self.num_unfinished}


def _turn_end(t: RequestTimeline, req) -> tuple[int | None, bool]:
    """(when a turn ended: the end of its finishing step, or the start of the step it was aborted
    before; None while it runs, whether it ended its session early (aborted, or failed)."""
    if req.finish_step is not None:
        return t.end_ns(req.finish_step), req.finish_reason == "error"
    if req.abort is not None:
        return max(t.start_ns(req.abort.step), t.arrival_ns(req)), True
    return None, False


def collect_sessions(timelines: list[RequestTimeline]) -> dict[str, SessionSpan]:
    """The sessions of one engine's timeline, or of a fleet's replicas' (a turn arrives on the
    first replica that holds it and ends on the last: a disaggregated turn's decode replica)."""
    session_of: dict[int, str] = {}
    for t in timelines:
        session_of.update((seq_id, session_id) for seq_id, (session_id, _) in t.session_turns.items())
    first: dict[int, RequestTimeline] = {}
    last: dict[int, RequestTimeline] = {}
    for t in timelines:
        for seq_id in session_of.keys() & t.requests.keys():
            first.setdefault(seq_id, t)
            last[seq_id] = t
    sessions: dict[str, SessionSpan] = {}
    for seq_id, session_id in sorted(session_of.items()):
        end, failed = _turn_end(last[seq_id], last[seq_id].requests[seq_id])
        span = sessions.get(session_id)
        if span is None:
            span = sessions[session_id] = SessionSpan(session_id)
        span.add(first[seq_id].arrival_ns(first[seq_id].requests[seq_id]), end, failed)
    return sessions


def session_stats(sessions: dict[str, SessionSpan]) -> dict | None:
    """The "sessions" figures; None for a trace without sessions."""
    from tracengine.analysis.figures import summarize
    if not sessions:
        return None
    per_session = [span.figures() for span in sessions.values()]
    total_ns = sum(s["duration_s"] for s in per_session)
    server = sum(s["server_s"] for s in per_session)
    return {"num_sessions": len(per_session), "num_turns": sum(s["num_turns"] for s in per_session),
            "num_ended_early": sum(s["ended_early"] for s in per_session),
            "turns": summarize([s["num_turns"] for s in per_session]),
            "duration_s": summarize([s["duration_s"] for s in per_session]),
            "server_s": summarize([s["server_s"] for s in per_session]),
            "think_s": summarize([s["think_s"] for s in per_session]),
            "server_share": server / total_ns if total_ns else None,
            "per_session": per_session}


def timeline_sessions(t: RequestTimeline) -> dict | None:
    """session_stats of one engine's timeline."""
    return session_stats(collect_sessions([t])) if t.session_turns else None


def session_line(s: dict) -> str:
    """The text form: how many, how long, and where their time went."""
    d, share = s["duration_s"], s["server_share"]
    early = f" ({s['num_ended_early']} ended early)" if s["num_ended_early"] else ""
    time = "" if share is None else f"; {share:.1%} waiting on the server, {1 - share:.1%} thinking"
    return (f"{s['num_sessions']}{early}, {s['turns']['mean']:.1f} turns each; duration p50 "
            f"{d['p50'] * 1e3:,.1f} ms, p90 {d['p90'] * 1e3:,.1f} ms{time}")
