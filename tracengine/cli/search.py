"""`simulate --search request_rate` (docs/sweeps.md): per config, the highest request rate (of a
sessions file: sessions per second) at which `--goodput` of the requests meet every `--slo`, by
sim/search.py on the sweep's executor and cache; the rate per config with its figures, and
`--plot` of the probes."""
import time

from tracengine.cli.common import EXIT_OK
from tracengine.cli.outputs import check_outputs
from tracengine.cli.steptime import describe_step_time, input_files, print_unvaried_note
from tracengine.cli.sweeps import cache_of, check_plot_format, executor_of, require_matplotlib
from tracengine.errors import TracengineError


def add_search_arguments(p):
    g = p.add_argument_group("capacity search (docs/sweeps.md)")
    g.add_argument("--search", choices=("request_rate",), help="per config, the highest request rate (a sessions "
                   "file: sessions started per second) at which --goodput of the requests meet every --slo; --plot "
                   "then draws the share of good requests and TTFT p99 against the rate")
    g.add_argument("--goodput", type=float, metavar="SHARE",
                   help="the share of requests that must meet every --slo (default 0.99)")
    g.add_argument("--search-precision", type=float, metavar="RATE",
                   help="the step of the rates searched, in requests/s (a sessions file: sessions/s; default "
                   "0.1): the answer passes, one step above it fails")


# (key, column title, format) of a capacity search's row, after the config's values; the rate's
# title names its unit (RATE_TITLES)
SEARCH_COLUMNS = [("rate", "max req/s", "{:,.2f}"), ("good_request_share", "good", "{:.1%}"),
                  ("next_good_request_share", "good +1 step", "{:.1%}"), ("throughput", "tok/s", "{:,.1f}"),
                  ("ttft_p99_ms", "TTFT p99", "{:,.2f}"), ("tpot_p99_ms", "TPOT p99", "{:,.2f}")]


DEFAULT_GOODPUT, DEFAULT_PRECISION = 0.99, 0.1
RATE_TITLES = {"requests/s": "max req/s", "sessions/s": "max sessions/s"}


def rate_unit(requests) -> tuple[str, str]:
    """(the unit of a search's rate, what the workload is counted in): a sessions file's rate is
    its sessions' first turns' (sim/spec.native_rate)."""
    from tracengine.workload.sessions import has_sessions
    if not has_sessions(requests):
        return "requests/s", f"{len(requests):,} requests"
    num_sessions = len({r.session_id for r in requests})
    return "sessions/s", f"{num_sessions:,} sessions ({len(requests):,} turns)"


def check_search_flags(args):
    """--goodput and --search-precision shape a --search: without one nothing would read them."""
    if not args.search and (args.goodput is not None or args.search_precision is not None):
        raise TracengineError("--goodput and --search-precision go with --search request_rate")


def run_search(args, overrides: dict, step_time, requests, source, prepared, maker: str | None = None,
               base: dict | None = None, parse=None) -> int:
    """The capacity of the base config, or of each --sweep variant; `requests`: the workload
    `source` read, in `prepared`; `overrides` the --set fields. Another engine's (`simulate
    --scheduler sglang`): `maker` its simulate runner (sim/spec.py's SIMULATE by default), `base`
    its whole config (the --set fields over its defaults) and `parse` how its swept values are typed."""
    from tracengine.analysis.stats import parse_slos
    from tracengine.sim.search import search_rates
    from tracengine.sim.spec import SIMULATE, SweepSpec, native_rate
    from tracengine.sim.sweep import parse_sweep
    if args.record:
        raise TracengineError("--record writes one run; a --search makes many")
    if args.plot_figure is not None:
        raise TracengineError("a --search's --plot draws the goodput and TTFT p99 against the rate: no --plot-figure")
    slo = parse_slos(args.slo) or None
    check_outputs({"--plot": args.plot}, input_files(args), args.force)
    if args.plot:
        check_plot_format(args.plot)
        require_matplotlib()
    configs = (parse_sweep(args.sweep) if parse is None else parse_sweep(args.sweep, parse)) if args.sweep else [{}]
    both = [name for name in configs[0] if name in overrides]
    if both:
        raise TracengineError(f"--set and --sweep both name {', '.join(both)}; give its values to --sweep alone")
    spec = SweepSpec(maker or SIMULATE, source.digest, overrides if base is None else base, step_time.to_dict(), slo)
    start_rate = native_rate(requests, source.params) or 1.0
    goodput = DEFAULT_GOODPUT if args.goodput is None else args.goodput
    precision = DEFAULT_PRECISION if args.search_precision is None else args.search_precision
    begin = time.perf_counter()
    with executor_of(args) as executor:
        search = search_rates(spec, source, configs, executor, prepared, goodput, precision, start_rate,
                              cache_of(args), args.variant_timeout)
        workers = executor.num_workers(len(configs) * 64)
    objectives = ", ".join(f"{name} {limit * 1e3:g} ms" for name, limit in slo.items())
    unit, counted = rate_unit(requests)
    sessions = unit == "sessions/s"
    started = " (sessions started per second; a later turn is sent its think time after its last" \
        " dependency finished)" if sessions else ""
    print(f"capacity of {counted} with {describe_step_time(step_time)}: the highest rate at which "
          f"{goodput:.1%} of the {'turns' if sessions else 'requests'} meet {objectives}, to {precision:g} "
          f"{unit}{started}")
    print(render_search(search.results, unit))
    never = [r for r in search.results if not r.saturated]
    if never:
        which = "; ".join(", ".join(f"{n}={v}" for n, v in r.overrides.items()) for r in never)
        print(f"never saturated{f' ({which})' if which else ''}: the {counted} met the objectives "
              f"at every rate probed, up to {never[0].rate:,.1f} {unit} (all of them at once, or nearly): "
              "too few to load the engine, so no rate is a capacity; give a workload with more "
              f"{'sessions' if sessions else 'requests'}")
    print(f"{search.num_probes} probes ({search.num_probes - search.num_computed} from the cache) in "
          f"{time.perf_counter() - begin:.2f} s on {workers} {executor.name} worker{'s' if workers > 1 else ''}; "
          f"latencies in ms at the rate found")
    print_unvaried_note(step_time)
    if args.plot:
        plot_search(args.plot, search.results, goodput, unit)
        print(f"wrote {args.plot}")
    return EXIT_OK


def search_row(r) -> dict:
    row = r.row or {}
    return {**row, "rate": r.rate, "next_good_request_share": (r.next_row or {}).get("good_request_share")}


def render_search(results, unit: str = "requests/s") -> str:
    """A line per config: its values, the rate found in `unit` (`< STEP`: one step already fails;
    `never saturated`: the search's last rate still passed, no capacity) and the figures at it."""
    names = list(results[0].overrides)
    rows = []
    for r in results:
        row = search_row(r)
        cells = ["-" if row.get(key) is None else fmt.format(row[key]) for key, _, fmt in SEARCH_COLUMNS]
        if r.rate is None:
            cells[0] = f"< {r.next_rate:g}"
        elif not r.saturated:
            cells[0] = "never saturated"
        rows.append([str(r.overrides[n]) for n in names] + cells)
    titles = [RATE_TITLES[unit]] + [title for _, title, _ in SEARCH_COLUMNS[1:]]
    from tracengine.analysis.tables import make_table, table_text     # rich, only when a table is printed
    return table_text(make_table(names + titles, rows, left_columns=0))


def plot_search(path: str, results, goodput: float, unit: str = "requests/s"):
    """The share of good requests and TTFT p99 against the rate, one line per config."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 6), sharex=True)
    for r in results:
        label = ", ".join(f"{n}={v}" for n, v in r.overrides.items()) or None
        rates = [x for x, _ in r.probes]
        top.plot(rates, [row["good_request_share"] for _, row in r.probes], marker="o", label=label)
        bottom.plot(rates, [row["ttft_p99_ms"] for _, row in r.probes], marker="o", label=label)
    top.axhline(goodput, color="grey", linestyle="--", linewidth=1)
    top.set_ylabel("share of good requests")
    bottom.set_ylabel("TTFT p99 (ms)")
    bottom.set_xlabel(f"{'session' if unit == 'sessions/s' else 'request'} rate ({unit})")
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda x, _: f"{x:g}")     # 300, not 3x10^2
    for ax in (top, bottom):
        ax.set_xscale("log")      # the bracketing's rates double
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(plain)
        ax.grid(True, alpha=0.3)
    if any(r.overrides for r in results):
        top.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
