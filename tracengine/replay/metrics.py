"""The rows `replay --set` and `diff` put side by side. Every figure is one of
`tracengine stats` (tracengine/analysis/stats.py, docs/stats.md), read from
its figures, so a what-if table and `tracengine stats` of the what-if trace
agree by construction. Latencies are in engine steps (the wall-clock of a
what-if run is the synthetic runner's, not a model's)."""
from tracengine.analysis.figures import Stats, Summary
from tracengine.analysis.tables import make_table, table_text


def _dist(figures: Summary) -> str:
    if not figures.count:
        return "-"
    return f"{figures.mean:.1f} / {figures.p50:.1f} / {figures.p99:.1f}"


def rows(s: Stats) -> list[tuple[str, str]]:
    """(label, value) pairs of the stats of a run, in the order they are printed."""
    steps, requests, pre = s.steps, s.requests, s.preemption
    finishes = ", ".join(f"{n} {reason}" for reason, n in sorted(requests.finish_reasons.items())) or "0"
    if requests.num_aborted:
        finishes += f" ({requests.num_aborted} aborted)"
    return [
        ("steps", str(steps.num_steps)),
        ("prefill steps", str(steps.num_prefill_steps)),
        ("decode steps", str(steps.num_decode_steps)),
        ("requests", str(requests.num_requests)),
        ("finished", finishes),
        ("preemptions", str(pre.num_preemptions)),
        ("recomputed tokens", str(pre.num_recomputed_tokens)),
        ("prefix-cache hit blocks", str(s.prefix_cache.num_hit_blocks)),
        ("TTFT steps mean/p50/p99", _dist(s.latency.ttft.steps)),
        ("e2e steps mean/p50/p99", _dist(s.latency.e2e.steps)),
    ]


def side_by_side(left: Stats, right: Stats, left_name: str, right_name: str) -> str:
    """Two runs' stats as a table; a row that differs is marked `*`."""
    table = [[label, a, b, "" if a == b else "*"] for (label, a), (_, b) in zip(rows(left), rows(right))]
    return table_text(make_table(["", left_name, right_name, ""], table))
