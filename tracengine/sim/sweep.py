"""Sweeps: one run per point of a grid of config values (`--sweep NAME=V1,V2`,
repeatable), one row of figures per variant; where they run, executors.py says.

Every figure of a row is read from `tracengine stats`' dict of that run
(analysis/stats.py), so a row equals the stats of the same run made alone: in
ms and tokens/s in simulated time, in steps for a step-exact sweep (whose runs
have no time of their own).
A variant is a function of its overrides only (spec.py makes it data); the
workload is read and the step-time model fitted once, before any variant runs."""
import itertools
from dataclasses import dataclass

from tracengine.engine.config import parse_override
from tracengine.errors import ConfigError
from tracengine.analysis.figures import Stats

# (key, column title, format) of a row in simulated time, after the swept values
COLUMNS = [("throughput", "tok/s", "{:,.1f}"), ("ttft_p50_ms", "TTFT p50", "{:,.2f}"),
           ("ttft_p99_ms", "TTFT p99", "{:,.2f}"), ("tpot_p50_ms", "TPOT p50", "{:,.2f}"),
           ("tpot_p99_ms", "TPOT p99", "{:,.2f}"), ("e2e_p50_ms", "e2e p50", "{:,.2f}"),
           ("e2e_p99_ms", "e2e p99", "{:,.2f}"), ("preemptions", "preempt", "{:,}"),
           ("goodput", "goodput/s", "{:,.3f}")]
FIGURES = [key for key, _, _ in COLUMNS]
# A step-exact sweep's (--arrivals steps): its runs have no time of their own (their step
# durations are the what-if replayer's wall clock, not serving), so its figures are in steps,
# as `tracengine stats` counts them, and have no goodput (objectives are times)
STEP_COLUMNS = [("tokens_per_step", "tok/step", "{:,.2f}"), ("ttft_p50_steps", "TTFT p50 steps", "{:,.1f}"),
                ("ttft_p99_steps", "TTFT p99 steps", "{:,.1f}"), ("tpot_p50_steps", "TPOT p50 steps", "{:,.2f}"),
                ("tpot_p99_steps", "TPOT p99 steps", "{:,.2f}"), ("e2e_p50_steps", "e2e p50 steps", "{:,.1f}"),
                ("e2e_p99_steps", "e2e p99 steps", "{:,.1f}"), ("preemptions", "preempt", "{:,}")]
STEP_FIGURES = [key for key, _, _ in STEP_COLUMNS]


@dataclass(frozen=True)
class SweepFigures:
    """What a kind of sweep shows: its columns, the figure --plot draws by default, and its units."""
    columns: list
    default_figure: str
    units: str

    @property
    def names(self) -> list[str]:
        return [key for key, _, _ in self.columns]


TIMED_OUT = "timed_out_s"      # the key of a timed-out row (sim/executors.py): the limit it ran past, in s


def is_timed_out(row: dict) -> bool:
    return TIMED_OUT in row


IN_TIME = SweepFigures(COLUMNS, "ttft_p99_ms", "latencies in ms from arrival, throughput in completion tokens/s")
IN_STEPS = SweepFigures(STEP_COLUMNS, "ttft_p99_steps",
                        "latencies in steps from the step a request was added, throughput in completion tokens "
                        "per step")


def parse_sweep(texts: list[str], parse=parse_override) -> list[dict]:
    """The grid of `NAME=V1,V2,...` texts, each value typed as `--set` types it (`parse`: a
    fleet's names too, fleet/overrides.py; a vLLM trace's, vLLM's fields); a name once."""
    axes, names = [], set()
    for text in texts:
        name, sep, raw = text.partition("=")
        values = [v for v in raw.split(",") if v.strip()] if sep else []
        if not values:
            raise ConfigError(f"--sweep expects NAME=V1,V2,..., got {text!r}")
        parsed = [parse(f"{name}={v}") for v in values]
        if parsed[0][0] in names:
            raise ConfigError(f"--sweep names {parsed[0][0]} twice")
        seen = set()
        for _, value in parsed:     # a value twice is the same run twice, and two equal rows
            if value in seen:
                raise ConfigError(f"--sweep gives {parsed[0][0]} the value {value!r} twice")
            seen.add(value)
        names.add(parsed[0][0])
        axes.append(parsed)
    return [dict(point) for point in itertools.product(*axes)]


def _ms(seconds):
    return None if seconds is None else seconds * 1e3


def row_of(s: Stats) -> dict:
    """The sweep figures of one run's stats (latencies in ms, goodput in requests/s)."""
    lat = s.latency
    return {"throughput": s.throughput.completion_tokens_per_s,
            "ttft_p50_ms": _ms(lat.ttft.seconds.p50), "ttft_p99_ms": _ms(lat.ttft.seconds.p99),
            "tpot_p50_ms": _ms(lat.tpot.seconds.p50), "tpot_p99_ms": _ms(lat.tpot.seconds.p99),
            "e2e_p50_ms": _ms(lat.e2e.seconds.p50), "e2e_p99_ms": _ms(lat.e2e.seconds.p99),
            "preemptions": s.preemption.num_preemptions,
            "goodput": s.goodput.requests_per_s if s.goodput is not None else None}


def step_row_of(s: Stats) -> dict:
    """The step-exact sweep figures of one run's stats (latencies in steps)."""
    lat, num_steps = s.latency, s.steps.num_steps
    return {"tokens_per_step": s.tokens.num_completion_tokens / num_steps if num_steps else None,
            **{f"{name}_{p}_steps": getattr(getattr(lat, name).steps, p)
               for name in ("ttft", "tpot", "e2e") for p in ("p50", "p99")},
            "preemptions": s.preemption.num_preemptions}


def render_rows(variants: list[dict], rows: list[dict], figures: SweepFigures = IN_TIME) -> str:
    """One line per variant; a variant stopped by its timeout (sim/executors.py: a row of
    `timed_out_s` alone) has no figures, and a last column says so."""
    from tracengine.analysis.tables import make_table, table_text
    names = list(variants[0]) if variants else []
    show = [c for c in figures.columns if c[0] != "goodput" or any(r.get("goodput") is not None for r in rows)]
    timed_out = any(map(is_timed_out, rows))
    cells = [[str(v[n]) for n in names] + ["-" if r.get(key) is None else fmt.format(r[key]) for key, _, fmt in show]
             + ([f"timed out ({r[TIMED_OUT]:g} s)" if is_timed_out(r) else "ok"] if timed_out else [])
             for v, r in zip(variants, rows)]
    header = names + [title for _, title, _ in show] + (["status"] if timed_out else [])
    return table_text(make_table(header, cells, left_columns=0))


def plot_rows(path: str, variants: list[dict], rows: list[dict], figure: str, figures: SweepFigures = IN_TIME):
    """`figure` against the first swept value, one line per combination of the others."""
    if figure not in figures.names:
        raise ConfigError(f"--plot-figure is one of {', '.join(figures.names)}, got {figure!r}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'tracengine[plot]'") from None
    names = list(variants[0])
    x_name, others = names[0], names[1:]
    lines: dict[tuple, list] = {}
    for v, r in zip(variants, rows):
        lines.setdefault(tuple(v[n] for n in others), []).append((v[x_name], r.get(figure)))
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, points in lines.items():
        points = [(x, y) for x, y in points if y is not None]
        label = ", ".join(f"{n}={value}" for n, value in zip(others, key)) or None
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    ax.set_xlabel(x_name)
    ax.set_ylabel(dict((k, t) for k, t, _ in figures.columns)[figure] + (" (ms)" if figure.endswith("_ms") else ""))
    if others:
        ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class TracengineSimulation:
    """How `simulate` runs tracengine's engine (sim/engine.py), for SimulateVariant."""

    @staticmethod
    def check(fields: dict, requests: list) -> None:
        from tracengine.engine.scheduler import Scheduler
        from tracengine.sim.runners import check_requests
        from tracengine.sim.engine import simulate_config
        check_requests(Scheduler(simulate_config(fields, requests)), requests)

    @staticmethod
    def run(fields: dict, requests: list, step_time) -> list:
        from tracengine.sim.engine import simulate, simulate_config
        return simulate(simulate_config(fields, requests), requests, step_time)


class SimulateVariant:
    """`tracengine simulate` of timed requests under base + overrides, through `engine` (its
    `check(fields, requests)` and `run(fields, requests, step_time) -> events`): tracengine's
    by default, vLLM's scheduler's with `--scheduler vllm` (vllm/simulate.VllmSimulation)."""
    figures = IN_TIME

    def __init__(self, requests: list, base: dict, step_time, slo: dict | None = None, engine=TracengineSimulation):
        self.requests, self.base, self.step_time, self.slo, self.engine = requests, base, step_time, slo, engine

    def check(self, overrides: dict):
        self.engine.check({**self.base, **overrides}, self.requests)

    def __call__(self, overrides: dict) -> dict:
        from tracengine.analysis.stats import stats
        return row_of(stats(self.engine.run({**self.base, **overrides}, self.requests, self.step_time), self.slo))
