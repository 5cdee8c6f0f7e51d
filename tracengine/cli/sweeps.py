"""The sweep flags of replay and simulate (`--sweep NAME=V1,V2`, --jobs, --slo, --plot, and
where the variants run and what is kept: `--executor local|ray`, `--ray-address`,
`--cache-dir`, `--no-cache`, `--variant-timeout`; docs/sweeps.md): checked before any run,
the grid run on the executor behind the result cache, its table or JSON printed."""
import os
import sys
import time

from tracengine.cli.common import EXIT_OK
from tracengine.cli.outputs import check_outputs
from tracengine.cli.steptime import input_files
from tracengine.errors import TracengineError


def add_sweep_arguments(p):
    g = p.add_argument_group("sweeps (one row per variant, in parallel; docs/sweeps.md)")
    g.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="run every value of a config field (repeatable: the grid of all of them)")
    g.add_argument("--jobs", type=int, metavar="N", help="local worker processes, or the CPUs of the Ray "
                   "cluster started for the run (default: one per core)")
    g.add_argument("--slo", action="append", default=[], metavar="NAME=VALUE",
                   help="goodput objective, e.g. ttft=200ms, tpot=50ms, e2e=2s (repeatable)")
    g.add_argument("--plot", metavar="OUT.png", help="draw --plot-figure against the first swept value "
                   "(needs matplotlib: the 'plot' extra)")
    g.add_argument("--plot-figure", help="the figure --plot draws: throughput, ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, "
                   "tpot_p99_ms, e2e_p50_ms, e2e_p99_ms, preemptions or goodput (default ttft_p99_ms); of a "
                   "step-exact sweep: tokens_per_step, ttft_p50_steps, ttft_p99_steps, tpot_p50_steps, "
                   "tpot_p99_steps, e2e_p50_steps, e2e_p99_steps or preemptions (default ttft_p99_steps)")
    add_executor_arguments(g)


def sweep_options(args, overrides: dict, figures=None, parse=None):
    """(variants, slo) of the sweep flags; variants is None without --sweep. `overrides`: the
    --set fields, which no --sweep may name too (one of the two would silently win). `figures`:
    the sweep's (replay.sweep.IN_TIME, the default, or IN_STEPS), which --plot-figure names one of.
    `parse`: how a swept value is typed (parse_sweep's; a vLLM trace's types vLLM's fields)."""
    from tracengine.analysis.stats import parse_slos
    check_plot_figure(args)
    slo = parse_slos(args.slo) or None
    check_executor_flags(args, bool(args.sweep))
    if not args.sweep:
        if args.plot or args.jobs is not None:
            raise TracengineError("--plot and --jobs go with --sweep")
        return None, slo
    from tracengine.sim.sweep import IN_STEPS, IN_TIME, parse_sweep     # one run has no grid: not imported for it
    figures = figures or IN_TIME
    if slo and figures is IN_STEPS:
        raise TracengineError("--slo objectives are times, and a step-exact sweep (--arrivals steps, or a trace "
                              "without arrival times) has none: its figures are in steps")
    args.plot_figure = args.plot_figure or figures.default_figure
    if args.plot_figure not in figures.names:
        of = " of a step-exact sweep (in steps)" if figures is IN_STEPS else ""
        raise TracengineError(f"--plot-figure{of} is one of {', '.join(figures.names)}, got {args.plot_figure!r}")
    if args.plot and args.plot_figure == "goodput" and not slo:
        raise TracengineError("--plot-figure goodput needs an --slo objective (without one no run has a goodput)")
    if args.jobs is not None and args.jobs <= 0:
        raise TracengineError(f"--jobs must be positive, got {args.jobs}")
    check_outputs({"--plot": args.plot}, input_files(args), getattr(args, "force", False))
    if args.plot:
        check_plot_format(args.plot)
    variants = parse_sweep(args.sweep) if parse is None else parse_sweep(args.sweep, parse)
    both = [name for name in variants[0] if name in overrides]
    if both:
        raise TracengineError(f"--set and --sweep both name {', '.join(both)}; give its values to --sweep alone")
    return variants, slo


def check_plot_figure(args):
    """--plot-figure names what --plot draws: without --plot nothing would read it."""
    if args.plot_figure is not None and not args.plot:
        raise TracengineError("--plot-figure goes with --plot (it names the figure the plot draws)")


PLOT_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")   # matplotlib's own


def check_plot_format(path: str):
    """The image format is the --plot file's extension; one matplotlib does not write is said
    before the runs (without one it would write PATH.png, beside the file that was checked)."""
    extension = os.path.splitext(path)[1].lstrip(".").lower()
    if extension not in PLOT_FORMATS:
        raise TracengineError(f"--plot {path!r}: name the image format by the extension, one of "
                              f"{', '.join('.' + f for f in PLOT_FORMATS)}")


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


def require_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TracengineError("--plot needs matplotlib: pip install 'tracengine[plot]'") from None


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


def say_kept(cache, num_variants: int):
    """On stderr, of a sweep stopped part way: the rows it finished, which a run again reads."""
    if cache is not None and cache.num_written:
        print(f"tracengine: {cache.num_written} of {num_variants} variants finished; their rows are kept in "
              f"{cache.directory}, which the sweep run again reads", file=sys.stderr)


def run_sweep_rows(spec, source, prepared, variants: list[dict], args):
    """(rows, a line saying where they came from) of every variant, on the flags' executor and cache."""
    from tracengine.sim.executors import run_variants
    from tracengine.sim.spec import Variant
    start = time.perf_counter()
    cache = cache_of(args)
    with executor_of(args) as executor:
        try:
            run = run_variants(spec, source, [Variant(v) for v in variants], executor, prepared, cache,
                               args.variant_timeout)
        except KeyboardInterrupt:
            say_kept(cache, len(variants))
            raise
        workers = executor.num_workers(max(run.num_computed, 1))
    where = f"on {workers} {executor.name} worker{'s' if workers > 1 else ''}"
    cached = f" ({run.num_cached} from the cache)" if run.num_cached else ""
    line = f"{len(variants)} variants in {time.perf_counter() - start:.2f} s {where}{cached}"
    return run.rows, line, {"executor": executor.name, "num_cached": run.num_cached, "num_computed": run.num_computed}
