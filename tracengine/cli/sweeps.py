"""The flags that say where a sweep runs and what it keeps (docs/sweeps.md): `--executor
local|ray`, `--ray-address`, the result cache (`--cache-dir`, `--no-cache`) and
`--variant-timeout`, for `replay --sweep` and `simulate --sweep`; and `simulate --search
request_rate`, the capacity search."""
import time

from tracengine.errors import TracengineError

EXIT_OK = 0


def add_executor_arguments(g):
    """Into the sweep flags' group."""
    g.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where the variants run: local worker processes (default) or Ray tasks (the 'ray' extra)")
    g.add_argument("--ray-address", metavar="ADDRESS", help="a Ray cluster's head (host:port, or auto for the one "
                   "this machine joined); default: a local cluster started for the run")
    g.add_argument("--cache-dir", metavar="DIR", help="the result cache (default: tracengine/sweeps in the user's "
                   "cache directory); a variant run before is read from it")
    g.add_argument("--no-cache", action="store_true", help="run every variant, read and store nothing")
    g.add_argument("--variant-timeout", type=float, metavar="SECONDS",
                   help="stop a variant that runs longer; its row says it timed out")


def add_search_arguments(p):
    g = p.add_argument_group("capacity search (docs/sweeps.md)")
    g.add_argument("--search", choices=("request_rate",), help="per config, the highest request rate at which "
                   "--goodput of the requests meet every --slo; --plot then draws the share of good requests and "
                   "TTFT p99 against the rate")
    g.add_argument("--goodput", type=float, default=0.99, metavar="SHARE",
                   help="the share of requests that must meet every --slo (default 0.99)")
    g.add_argument("--search-precision", type=float, default=0.1, metavar="RATE",
                   help="the step of the rates searched, in requests/s (default 0.1): the answer passes, "
                   "one step above it fails")


def check_executor_flags(args, runs_many: bool):
    """The executor flags go with --sweep or --search; their values are checked before any run."""
    given = [flag for flag, on in (("--executor", args.executor != "local"), ("--ray-address", args.ray_address),
                                   ("--cache-dir", args.cache_dir), ("--no-cache", args.no_cache),
                                   ("--variant-timeout", args.variant_timeout is not None)) if on]
    if given and not runs_many:
        raise TracengineError(f"{', '.join(given)} go with --sweep")
    if args.ray_address is not None and args.executor != "ray":
        raise TracengineError("--ray-address goes with --executor ray")
    if args.no_cache and args.cache_dir:
        raise TracengineError("give one of --cache-dir and --no-cache")
    if args.ray_address is not None and args.jobs is not None:
        raise TracengineError("--jobs sizes a Ray cluster started for the run; one at --ray-address has its own CPUs")
    if args.variant_timeout is not None and not args.variant_timeout > 0:
        raise TracengineError(f"--variant-timeout must be a positive number of seconds, got {args.variant_timeout}")


def executor_of(args):
    from tracengine.sim.executors import make_executor
    return make_executor(args.executor, args.jobs, args.ray_address)


def cache_of(args):
    from tracengine.sim.cache import ResultCache
    return None if args.no_cache else ResultCache(args.cache_dir)


def run_sweep_rows(spec, source, prepared, variants: list[dict], args):
    """(rows, a line saying where they came from) of every variant, on the flags' executor and cache."""
    from tracengine.sim.executors import run_variants
    from tracengine.sim.spec import Variant
    start = time.perf_counter()
    with executor_of(args) as executor:
        run = run_variants(spec, source, [Variant(v) for v in variants], executor, prepared, cache_of(args),
                           args.variant_timeout)
        workers = executor.num_workers(max(run.num_computed, 1))
    where = f"on {workers} {executor.name} worker{'s' if workers > 1 else ''}"
    cached = f" ({run.num_cached} from the cache)" if run.num_cached else ""
    line = f"{len(variants)} variants in {time.perf_counter() - start:.2f} s {where}{cached}"
    return run.rows, line, {"executor": executor.name, "num_cached": run.num_cached, "num_computed": run.num_computed}


def print_sweep(spec, source, prepared, variants, args, meta: dict | None = None) -> int:
    """The sweep's table, or with --json (`meta` given) one object: `meta`'s keys, where the
    rows came from, and each variant's overrides with its row of figures (sim.sweep.row_of or
    step_row_of: stats' own; which, the variant object's `figures` says)."""
    from tracengine.sim.sweep import plot_rows, render_rows
    if args.plot:    # fail before the runs, not after them
        require_matplotlib()
    figures = prepared.runner(spec, source, None).figures
    rows, line, where = run_sweep_rows(spec, source, prepared, variants, args)
    if meta is not None and getattr(args, "json", False):
        import json
        if args.plot:
            plot_rows(args.plot, variants, rows, args.plot_figure, figures)
        print(json.dumps({**meta, **where, "plot": args.plot or None,
                          "variants": [{"set": v, "figures": r} for v, r in zip(variants, rows)]}, indent=2))
        return EXIT_OK
    print(render_rows(variants, rows, figures))
    print(f"{line}; {figures.units}")
    if args.plot:
        plot_rows(args.plot, variants, rows, args.plot_figure, figures)
        print(f"wrote {args.plot}")
    return EXIT_OK


# -- simulate --search ----------------------------------------------------------------------------

# (key, column title, format) of a capacity search's row, after the config's values
SEARCH_COLUMNS = [("rate", "max req/s", "{:,.2f}"), ("good_request_share", "good", "{:.1%}"),
                  ("next_good_request_share", "good +1 step", "{:.1%}"), ("throughput", "tok/s", "{:,.1f}"),
                  ("ttft_p99_ms", "TTFT p99", "{:,.2f}"), ("tpot_p99_ms", "TPOT p99", "{:,.2f}")]


def cmd_search(args, overrides: dict, step_time, requests, source, prepared) -> int:
    """`simulate --search request_rate`: the capacity of the base config, or of each --sweep variant."""
    from tracengine.analysis.stats import parse_slos
    from tracengine.cli.outputs import check_outputs
    from tracengine.cli.simulate import check_plot_format, describe_step_time, input_files, print_unvaried_note
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
    configs = parse_sweep(args.sweep) if args.sweep else [{}]
    both = [name for name in configs[0] if name in overrides]
    if both:
        raise TracengineError(f"--set and --sweep both name {', '.join(both)}; give its values to --sweep alone")
    spec = SweepSpec(SIMULATE, source.digest, overrides, step_time.to_dict(), slo)
    start_rate = native_rate(requests, source.params) or 1.0
    begin = time.perf_counter()
    with executor_of(args) as executor:
        search = search_rates(spec, source, configs, executor, prepared, args.goodput, args.search_precision,
                              start_rate, cache_of(args), args.variant_timeout)
        workers = executor.num_workers(len(configs) * 64)
    results = search.results
    if getattr(args, "json", False):
        import json
        print(json.dumps({"num_requests": len(requests), "goodput": args.goodput, "slo_s": slo,
                          "precision": args.search_precision, "overrides": overrides,
                          "results": [{"set": r.overrides, "rate": r.rate, "figures": r.row, "next_rate": r.next_rate,
                                       "next_figures": r.next_row, "probes": [{"rate": x, "figures": row}
                                                                              for x, row in r.probes]}
                                      for r in results], "plot": args.plot}, indent=2))
    else:
        objectives = ", ".join(f"{name} {limit * 1e3:g} ms" for name, limit in slo.items())
        print(f"capacity of {len(requests):,} requests with {describe_step_time(step_time)}: the highest rate at "
              f"which {args.goodput:.1%} of the requests meet {objectives}, to {args.search_precision:g} requests/s")
        print(render_search(results))
        print(f"{search.num_probes} probes ({search.num_probes - search.num_computed} from the cache) in "
              f"{time.perf_counter() - begin:.2f} s on {workers} {executor.name} worker{'s' if workers > 1 else ''}; "
              f"latencies in ms at the rate found")
        print_unvaried_note(step_time)
    if args.plot:
        plot_search(args.plot, results, args.goodput)
        if not getattr(args, "json", False):
            print(f"wrote {args.plot}")
    return EXIT_OK


def search_row(r) -> dict:
    row = r.row or {}
    return {**row, "rate": r.rate, "next_good_request_share": (r.next_row or {}).get("good_request_share")}


def render_search(results) -> str:
    names = list(results[0].overrides)
    table = [names + [title for _, title, _ in SEARCH_COLUMNS]]
    for r in results:
        row = search_row(r)
        cells = ["-" if row.get(key) is None else fmt.format(row[key]) for key, _, fmt in SEARCH_COLUMNS]
        if r.rate is None:
            cells[0] = f"< {r.next_rate:g}"
        elif r.next_rate is None:
            cells[0] = f">= {r.rate:,.2f}"
        table.append([str(r.overrides[n]) for n in names] + cells)
    widths = [max(len(line[c]) for line in table) for c in range(len(table[0]))]
    return "\n".join("  ".join(cell.rjust(widths[c]) for c, cell in enumerate(line)) for line in table)


def require_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TracengineError("--plot needs matplotlib: pip install 'tracengine[plot]'") from None


def plot_search(path: str, results, goodput: float):
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
    bottom.set_xlabel("request rate (requests/s)")
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
