"""`tracengine simulate`: a workload file (or a synthetic workload) through the real
scheduler in simulated time, with no model (docs/simulation.md); one run or a sweep."""
from tracengine.cli.common import EXIT_OK, add_parser, print_table
from tracengine.cli.fleet_commands import add_fleet_arguments
from tracengine.cli.flags import (DEFAULT_VOCAB_SIZE, add_config_arguments, add_synthetic_arguments,
                                  add_workload_arguments, config_overrides, workload_for_simulation, workload_spec)
from tracengine.cli.outputs import check_outputs
from tracengine.cli.steptime import (add_step_time_arguments, describe_step_time, input_files, print_unvaried_note,
                                     step_time_from_args)
from tracengine.cli.search import add_search_arguments, check_search_flags
from tracengine.cli.sweeps import add_sweep_arguments, check_executor_flags, print_sweep, sweep_options
from tracengine.errors import TracengineError
from tracengine.process.progress import RequestProgress


def add_to(sub):
    p = add_parser(sub, "simulate", "run a workload through the real scheduler in simulated time, no model",
                   "Run a workload file (or a synthetic workload) through the real Scheduler and BlockManager\n"
                   "with no model and no torch: requests enter at their arrival times, each step lasts what\n"
                   "the step-time model says, tokens come from the synthetic runner. The --record trace is an\n"
                   "ordinary trace: stats, tui, diff, export and replay read it (docs/simulation.md).")
    p.add_argument("workload_file", nargs="?", metavar="WORKLOAD",
                   help="Mooncake JSONL, Azure CSV or tracengine JSONL (docs/workloads.md)")
    p.add_argument("--record", metavar="PATH", help="write the simulated run's trace to PATH")
    p.add_argument("--force", action="store_true", help="overwrite --record if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar (it goes to stderr)")
    p.add_argument("--vocab-size", type=int, metavar="N",
                   help="token ids of a length-only workload stay below N (default: the roofline model's, else 151936)")
    src = p.add_argument_group("synthetic workload (instead of a WORKLOAD file)")
    add_synthetic_arguments(src)
    src.add_argument("--max-tokens", type=int, help="completion tokens per request, over the workload's")
    src.add_argument("--ignore-eos", action="store_true", default=None, help="run every request to its max tokens")
    add_workload_arguments(p)
    add_config_arguments(p, "config (num_kvcache_blocks is required: a simulation has no device to size the cache)")
    add_step_time_arguments(p)
    add_sweep_arguments(p)
    add_search_arguments(p)
    add_fleet_arguments(p)
    p.add_argument("--scheduler", choices=("tracengine", "vllm", "sglang"), default="tracengine",
                   help="whose scheduler: tracengine's, or vLLM's or SGLang's own (installed; --set takes "
                   "their config fields, docs/vllm.md, docs/sglang.md)")
    p.set_defaults(run=run)


def simulation_progress(num_requests: int | None, enabled: bool = True) -> RequestProgress:
    """Finished requests (of `num_requests`; None: not known before the end) and the simulated
    time so far; `on_progress` is its update."""
    return RequestProgress("Simulating", num_requests, "{task.fields[simulated_s]:,.1f} s simulated", enabled,
                           simulated_s=0.0)


def run(args) -> int:
    if args.scheduler == "vllm":
        from tracengine.cli.vllm_backend import run_simulate
        return run_simulate(args)
    if args.scheduler == "sglang":
        from tracengine.cli.sglang_backend import run_simulate as run_sglang_simulate
        return run_sglang_simulate(args)
    from tracengine.sim.engine import check_token_prompts, simulate_config, with_kv_bytes
    if args.workload_file and args.workload:
        raise TracengineError("give the workload file once: as WORKLOAD or as --workload")
    workload = args.workload_file or args.workload
    from tracengine.cli.fleet_commands import check_flags_not_swept, fleet_changes, take_scoped_sets
    from tracengine.fleet.overrides import is_fleet_name, parse_fleet_override
    scoped = take_scoped_sets(args)      # a pool's or a replica's fields: a fleet's (docs/cluster.md)
    overrides = config_overrides(args)
    check_flags_not_swept(args)
    check_search_flags(args)
    if args.search:     # its flags are checked by run_search, once the workload is read
        check_executor_flags(args, True)
        variants, slo = None, None
    else:
        variants, slo = sweep_options(args, {**overrides, **fleet_changes(args), **scoped}, parse=parse_fleet_override)
    fleet_swept = variants is not None and any(is_fleet_name(name) for name in variants[0])
    step_time = step_time_from_args(args)
    if step_time is None:
        raise TracengineError("simulate needs step times: --step-time FILE (tracengine calibrate) or --roofline CONFIG")
    if args.record and variants is not None:
        raise TracengineError("--record writes one run; a --sweep makes many")
    check_outputs({"--record": args.record}, input_files(args), args.force)
    vocab_size = args.vocab_size
    if vocab_size is None:
        vocab_size = step_time.model.vocab_size if step_time.kind == "roofline" else DEFAULT_VOCAB_SIZE
    elif vocab_size <= 0:
        raise TracengineError(f"--vocab-size must be positive, got {vocab_size}")
    from tracengine.cli.fleet_commands import fleet_spec_from_args
    base = None
    if fleet_swept:
        from tracengine.fleet.spec import FleetSpec     # one engine's run has no fleet to describe
        base = FleetSpec()
    fleet = fleet_spec_from_args(args, step_time, base, scoped)
    if fleet is not None and fleet.is_single and not fleet_swept:    # one replica: today's simulation, its trace
        from tracengine.cli.fleet_commands import check_fleet_flags_of_one_engine
        check_fleet_flags_of_one_engine(args)
        fleet = None
    # One run whose max_model_len is given reads its workload as it goes: its memory follows the
    # requests in flight, not the file (without it, the longest request sets max_model_len).
    lazy = not args.search and variants is None and fleet is None and "max_model_len" in overrides
    requests = workload_for_simulation(args, workload, vocab_size, lazy)
    if not isinstance(requests, list):
        return simulate_run(args, simulate_config(overrides, []), requests, step_time, slo, None)
    check_token_prompts(requests)
    if args.search or variants is not None:
        from tracengine.sim.spec import FLEET, SIMULATE, PreparedSources, SweepSpec, workload_source
        source, prepared = workload_source(workload_spec(args, workload=workload), vocab_size), PreparedSources()
        prepared.add(source, requests)
        if args.search:
            if fleet is not None:
                raise TracengineError("--search runs one engine; a fleet's capacity is not searched yet")
            from tracengine.cli.search import run_search
            return run_search(args, overrides, step_time, requests, source, prepared)
        spec = SweepSpec(SIMULATE, source.digest, overrides, step_time.to_dict(), slo) if fleet is None else \
            SweepSpec(FLEET, source.digest, overrides, step_time.to_dict(), slo, fleet=fleet.to_dict())
        where = f" through a fleet of {fleet.total_replicas} replicas" if fleet is not None else ""
        print(f"simulate {len(requests):,} requests{where} with {describe_step_time(step_time)}")
        rc = print_sweep(spec, source, prepared, variants, args)
        print_unvaried_note(step_time)
        return rc
    config = with_kv_bytes(simulate_config(overrides, requests), step_time)
    if fleet is not None:
        return simulate_fleet_run(args, config, requests, step_time, fleet, slo)
    return simulate_run(args, config, requests, step_time, slo, len(requests))


def simulate_run(args, config, requests, step_time, slo, num_requests: int | None) -> int:
    """One engine's run of `requests` (a list, or an iterator read as the run goes: `num_requests`
    None), its stats printed and its trace recorded."""
    import time
    from tracengine.analysis.timeline_sink import RequestTimelineSink
    from tracengine.sim.engine import simulate, simulation_header
    header = simulation_header(config, step_time)
    with simulation_progress(num_requests, enabled=not args.quiet) as progress:
        on_progress = (lambda num_finished, now_ns: progress.update(num_finished, simulated_s=now_ns / 1e9)) \
            if not args.quiet else None
        wall, cpu = time.perf_counter(), time.process_time()
        if args.record:
            from tracengine.trace.tracelog import TraceWriter
            with TraceWriter(args.record, header) as writer:
                sink = RequestTimelineSink(header, writer, lean=True)
                simulate(config, requests, step_time, sink, header, on_progress)
        else:
            sink = RequestTimelineSink(header, lean=True)
            simulate(config, requests, step_time, sink, header, on_progress)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    from tracengine.analysis.stats import render, stats
    s = stats(sink.timeline, slo)
    print(f"simulated {s['requests']['num_requests']:,} requests with {describe_step_time(step_time)}: "
          f"{s['steps']['num_steps']:,} steps in {wall:.2f} s wall, {cpu:.2f} s CPU")
    print_table(render(s, title="simulated run"))
    print_unvaried_note(step_time)
    if args.record:
        print(f"wrote {args.record}")
    return EXIT_OK


def simulate_fleet_run(args, config, requests, step_time, fleet, slo) -> int:
    import time
    from tracengine.cli.fleet_commands import print_fleet_stats, simulate_fleet_command
    with simulation_progress(len(requests), enabled=not args.quiet) as progress:
        on_progress = (lambda num_done, now_ns: progress.update(num_done, simulated_s=now_ns / 1e9)) \
            if not args.quiet else None
        wall, cpu = time.perf_counter(), time.process_time()
        s = simulate_fleet_command(args, config, requests, step_time, fleet, slo, on_progress)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    num_steps = sum(p["stats"]["steps"]["num_steps"] for p in s["replicas"])
    print(f"simulated {len(requests):,} requests with {describe_step_time(step_time)}: "
          f"{num_steps:,} replica steps in {wall:.2f} s wall, {cpu:.2f} s CPU")
    print_fleet_stats(s, "simulated fleet")
    print_unvaried_note(step_time)
    if args.record:
        print(f"wrote {args.record}")
    return EXIT_OK
