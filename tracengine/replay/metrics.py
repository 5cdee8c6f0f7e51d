"""Scheduling figures of a run, from its events: what `replay --set` and
`diff` put side by side. Latencies are in engine steps, counting the step
that produced the token: a request that arrives before step 3 and gets its
first token in step 3 has a TTFT of 1 step. Percentiles are `tracengine stats`' own."""
from tracengine.analysis.stats import summarize
from tracengine.trace.events import BlockAllocate, Preempt, RequestAdded, ScheduleDecision, SeqFinish, TokenSample


class RunMetrics:
    """Fed one event at a time with `add`; complete once the run's events are in."""

    def __init__(self):
        self.num_steps = 0
        self.num_prefill_steps = 0
        self.num_decode_steps = 0
        self.num_requests = 0
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0      # KV thrown away by preemption
        self.num_cache_hit_blocks = 0       # leading blocks found in the prefix cache
        self.finish_reasons: dict[str, int] = {}
        self._arrival: dict[int, int] = {}
        self._first_token: dict[int, int] = {}
        self.ttft_steps: list[int] = []
        self.e2e_steps: list[int] = []

    @classmethod
    def of(cls, events) -> "RunMetrics":
        metrics = cls()
        add = metrics.add
        for event in events:
            add(event)
        return metrics

    def add(self, e):
        t = type(e)
        if t is ScheduleDecision:
            self.num_steps += 1
            if e.phase == "prefill":
                self.num_prefill_steps += 1
            else:
                self.num_decode_steps += 1
        elif t is TokenSample:
            if e.kept and e.seq_id not in self._first_token:
                self._first_token[e.seq_id] = e.step
                self.ttft_steps.append(e.step - self._arrival.get(e.seq_id, 0) + 1)
        elif t is RequestAdded:
            self.num_requests += 1
            self._arrival[e.seq_id] = e.step
        elif t is BlockAllocate:
            self.num_cache_hit_blocks += e.num_cached_blocks
        elif t is Preempt:
            self.num_preemptions += 1
            self.num_recomputed_tokens += e.num_computed_tokens
        elif t is SeqFinish:
            self.finish_reasons[e.reason] = self.finish_reasons.get(e.reason, 0) + 1
            self.e2e_steps.append(e.step - self._arrival.get(e.seq_id, 0) + 1)

    @property
    def num_finished(self) -> int:
        return sum(self.finish_reasons.values())

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs, in the order they are printed."""
        def dist(values):
            figures = summarize(values)
            if not figures["count"]:
                return "-"
            return f"{figures['mean']:.1f} / {figures['p50']:.1f} / {figures['p99']:.1f}"
        finishes = ", ".join(f"{n} {reason}" for reason, n in sorted(self.finish_reasons.items())) or "0"
        return [
            ("steps", str(self.num_steps)),
            ("prefill steps", str(self.num_prefill_steps)),
            ("decode steps", str(self.num_decode_steps)),
            ("requests", str(self.num_requests)),
            ("finished", finishes),
            ("preemptions", str(self.num_preemptions)),
            ("recomputed tokens", str(self.num_recomputed_tokens)),
            ("prefix-cache hit blocks", str(self.num_cache_hit_blocks)),
            ("TTFT steps mean/p50/p99", dist(self.ttft_steps)),
            ("e2e steps mean/p50/p99", dist(self.e2e_steps)),
        ]


def side_by_side(left: RunMetrics, right: RunMetrics, left_name: str, right_name: str) -> str:
    rows = list(zip(left.rows(), right.rows()))
    width = max(len(label) for (label, _), _ in rows)
    col = max(len(left_name), len(right_name), *(len(a) for (_, a), _ in rows), *(len(b) for _, (_, b) in rows))
    lines = [f"{'':<{width}}  {left_name:>{col}}  {right_name:>{col}}"]
    for (label, a), (_, b) in rows:
        mark = "" if a == b else "  *"
        lines.append(f"{label:<{width}}  {a:>{col}}  {b:>{col}}{mark}")
    return "\n".join(lines)
