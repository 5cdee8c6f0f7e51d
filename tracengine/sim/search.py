"""The capacity search: per config, the highest request rate at which the share of requests
that meet every objective (`--slo`) is at least `--goodput`.

Rates are searched on a grid of `precision` steps (rate = k * precision), so the answer is
exact on that grid: the rate found met the goodput when it was run, and the rate one step
above it did not. From the workload's own rate (or 1 request/s) the search brackets by
doubling k until a rate fails, then bisects between the highest passing and the lowest
failing k until they are one step apart. Where goodput is not monotone in the rate, the
answer is the highest passing rate below the lowest failing one seen. Every config's probes
of a round run together on the executor, and with workers to spare a config probes several
rates a round (its interval split in as many parts), so a round narrows each interval more
than one halving."""
from dataclasses import dataclass, field

from tracengine.errors import TracengineError
from tracengine.sim.executors import run_variants
from tracengine.sim.spec import Variant
from tracengine.sim.sweep import TIMED_OUT, is_timed_out

# A rate that still passes at start * 2**24 ends the search: the workload never saturated the
# engine (its requests, all but at once, still met the objectives), so no rate is its capacity.
MAX_DOUBLINGS = 24


@dataclass
class ConfigSearch:
    """One config's search on the grid: `lo` the highest k that passed (0: none yet),
    `hi` the lowest k that failed (None: none yet)."""
    overrides: dict
    start_k: int
    lo: int = 0
    hi: int | None = None
    probes: dict = field(default_factory=dict)     # k -> row
    bounded: bool = True      # False: every rate probed passed, up to the cap

    @property
    def done(self) -> bool:
        return (self.hi is not None and self.hi - self.lo <= 1) or not self.bounded

    def proposals(self, num: int) -> list[int]:
        """Up to `num` grid points to probe next."""
        if self.hi is None:
            first = self.start_k if not self.probes else self.lo * 2
            return [first * 2 ** j for j in range(num) if first * 2 ** j <= self.start_k * 2 ** MAX_DOUBLINGS]
        parts = min(num, self.hi - self.lo - 1)
        ks = {self.lo + (self.hi - self.lo) * i // (parts + 1) for i in range(1, parts + 1)}
        return sorted(k for k in ks if self.lo < k < self.hi)

    def update(self, results: dict, passes):
        """Results of the probed k's: the lowest failing k is `hi`, the highest passing one below it `lo`."""
        self.probes.update(results)
        failing = [k for k, row in self.probes.items() if not passes(row)]
        self.hi = min(failing) if failing else None
        self.lo = max([k for k, row in self.probes.items() if passes(row) and (self.hi is None or k < self.hi)],
                      default=0)
        if self.hi is None and self.lo * 2 > self.start_k * 2 ** MAX_DOUBLINGS:
            self.bounded = False


@dataclass
class SearchResult:
    overrides: dict
    rate: float | None          # the highest rate found to pass; None when one step already fails
    row: dict | None            # the figures at `rate`
    next_rate: float | None     # one step above, where the goodput failed (None: unbounded)
    next_row: dict | None
    probes: list                # (rate, row) of every rate run, in rate order

    @property
    def saturated(self) -> bool:
        """False when every rate probed passed, up to the search's ceiling: `rate` is then that
        ceiling, not a capacity."""
        return self.rate is None or self.next_rate is not None


@dataclass
class CapacitySearch:
    results: list[SearchResult]     # one per config, in the order given
    num_probes: int                 # rates run, all configs together
    num_computed: int               # of them, not read from the cache


def search_rates(spec, source, configs: list[dict], executor, prepared, goodput: float, precision: float,
                 start_rate: float, cache=None, timeout=None) -> CapacitySearch:
    """The capacity of each config (overrides over the spec's base), probes on `executor`;
    `prepared`: as run_variants'."""
    if not spec.slo:
        raise TracengineError("--search needs an objective: --slo ttft=2s (tpot, e2e; repeatable)")
    if not 0 < goodput <= 1:
        raise TracengineError(f"--goodput is a share of requests in (0, 1], got {goodput!r}")
    if not precision > 0:
        raise TracengineError(f"--search-precision must be a positive rate, got {precision!r}")

    def passes(row):
        if is_timed_out(row):
            raise TracengineError(f"a probe ran past --variant-timeout {row[TIMED_OUT]:g} s; the search needs "
                                  "its answer: give a longer timeout")
        return row["good_request_share"] is not None and row["good_request_share"] >= goodput

    def rate(k):
        return round(k * precision, 9)

    searches = [ConfigSearch(c, max(1, round(start_rate / precision))) for c in configs]
    num_workers = executor.num_workers(len(configs) * 64)
    num_probes = num_computed = 0
    while True:
        active = [s for s in searches if not s.done]
        if not active:
            break
        per_config = max(1, num_workers // len(active))
        batch = [(s, k) for s in active for k in s.proposals(per_config) if k not in s.probes]
        run = run_variants(spec, source, [Variant(s.overrides, rate(k)) for s, k in batch], executor, prepared,
                           cache, timeout)
        num_probes, num_computed = num_probes + len(batch), num_computed + run.num_computed
        for s in active:
            s.update({k: row for (t, k), row in zip(batch, run.rows) if t is s}, passes)
    results = []
    for s in searches:
        nxt = s.lo + 1 if s.bounded else None
        results.append(SearchResult(s.overrides, rate(s.lo) if s.lo else None, s.probes.get(s.lo),
                                    rate(nxt) if nxt else None, s.probes.get(nxt) if nxt else None,
                                    [(rate(k), s.probes[k]) for k in sorted(s.probes)]))
    return CapacitySearch(results, num_probes, num_computed)
