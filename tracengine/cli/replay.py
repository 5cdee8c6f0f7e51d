"""`tracengine replay`: re-execution (exit 0 when the trace reproduces, 1 at the first
divergence), `--state`, and the what-if: the recorded workload under another config, at
the recorded steps or in simulated time (docs/simulation.md), one run or a sweep."""

from tracengine.cli.common import add_parser
from tracengine.cli.fleet_commands import add_fleet_arguments
from tracengine.cli.flags import add_config_arguments, config_overrides
from tracengine.cli.outputs import note_torn_tail
from tracengine.cli.replay_runs import (check_flags_combine, run_replay, run_sweep_replay, run_timed_whatif,
                                        run_whatif, show_state)
from tracengine.cli.steptime import (add_step_time_arguments, step_time_from_args)
from tracengine.cli.sweeps import (add_sweep_arguments, check_executor_flags, check_plot_figure)
from tracengine.errors import TraceError
from tracengine.trace.tracelog import TraceReader


def add_to(sub):
    p = add_parser(sub, "replay", "re-execute a trace and prove it reproduces; --set for what-if",
                   "Re-execute a trace with the real scheduler and block manager, feeding the recorded\n"
                   "tokens, and compare every event (exit 1 at the first divergence). With --set, run the\n"
                   "recorded workload under another config (what-if) and compare the two side by side.")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--record", metavar="PATH", help="what-if: write the new run's trace")
    p.add_argument("--force", action="store_true", help="overwrite the --record file if it exists")
    p.add_argument("--state", type=int, metavar="STEP", help="print the folded state after STEP")
    p.add_argument("--arrivals", choices=("time", "steps"),
                   help="what-if: requests at their recorded arrival times in simulated time, or at their "
                   "recorded steps (default: time when the trace has arrival times)")
    add_config_arguments(p, "what-if: the recorded config with these fields changed")
    add_step_time_arguments(p)
    add_sweep_arguments(p)
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.add_argument("--policy", metavar="MODULE:CLASS",
                   help="the scheduling policy to run: needed for a trace of a policy of one's own (a trace never "
                   "makes tracengine import code); with a built-in trace, checks the given policy against it")
    add_fleet_arguments(p, what_if=True)
    p.set_defaults(run=run)


def run(args) -> int:
    with TraceReader(args.trace) as reader:
        if reader.header.engine == "vllm":     # vLLM's own scheduler: tracengine/vllm/
            from tracengine.cli.vllm_backend import run_replay as run_vllm_replay
            return run_vllm_replay(args)
    check_plot_figure(args)
    check_executor_flags(args, bool(args.sweep))
    from tracengine.cli.fleet_commands import take_scoped_sets
    scoped = take_scoped_sets(args)      # a pool's or a replica's fields: a fleet's (docs/cluster.md)
    overrides = config_overrides(args)
    check_flags_combine(args, overrides)
    if args.state is not None:
        return show_state(args.trace, args.state)
    step_time = step_time_from_args(args)
    timed = args.arrivals == "time" or step_time is not None
    from tracengine.cli.fleet_commands import fleet_changes, is_fleet_trace
    from tracengine.fleet.overrides import is_fleet_name
    fleet_trace = is_fleet_trace(args.trace)
    reshaped = any(name != "router" for name in fleet_changes(args)) or bool(scoped) or \
        any(is_fleet_name(text.partition("=")[0].strip().replace("-", "_")) for text in args.sweep)
    if fleet_trace or reshaped or args.router:
        return run_fleet_replay(args, fleet_trace, reshaped, overrides, timed, step_time, scoped)
    if not (overrides or args.record or timed or args.sweep):
        return run_replay(args.trace, args.json, args.policy)
    if timed and args.arrivals == "steps":
        raise TraceError("--step-time and --roofline time a what-if in simulated time; "
                         "they do not combine with --arrivals steps")
    with TraceReader(args.trace) as reader:    # read once, for the arrivals and the runs
        events = list(reader.events())
        note_torn_tail(reader)
    if args.arrivals is None:    # time when the trace has arrival times, steps otherwise
        from tracengine.replay.timed import has_arrivals
        timed = timed or has_arrivals(events)
    if args.sweep:
        return run_sweep_replay(args.trace, events, overrides, timed, step_time, args)
    if timed:
        return run_timed_whatif(args.trace, events, overrides, args.record, step_time, args.policy, args.json)
    return run_whatif(args.trace, events, overrides, args.record, args.json, args.policy)


def run_fleet_replay(args, fleet_trace: bool, reshaped: bool, overrides: dict, timed: bool, step_time,
                     scoped: dict) -> int:
    """A fleet trace re-executed whole (alone, --router: with that router), or a trace's workload
    through another fleet (docs/cluster.md), one or a sweep. `scoped`: the pools' and replicas'
    --set fields."""
    from tracengine.cli.fleet_commands import fleet_replay_command, fleet_spec_from_args, fleet_whatif_command
    from tracengine.fleet.spec import FleetSpec
    if args.arrivals == "steps":
        raise TraceError("a fleet runs in time: --arrivals steps is one engine's")
    with TraceReader(args.trace) as reader:
        events = list(reader.events())
        note_torn_tail(reader)
    if args.sweep:
        from tracengine.cli.fleet_sweeps import fleet_sweep_command
        return fleet_sweep_command(args, events, overrides, scoped, step_time)
    if fleet_trace and not (reshaped or overrides or args.record or timed):
        return fleet_replay_command(args.trace, events, args.json, args.policy, args.router)
    recorded = FleetSpec.from_dict(events[0].fleet) if fleet_trace else FleetSpec()
    spec = fleet_spec_from_args(args, step_time, recorded, scoped)
    return fleet_whatif_command(args.trace, events, spec, overrides, args.record, step_time, args.policy, args.json)
