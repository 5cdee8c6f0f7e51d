"""`tracengine replay`: re-execution (exit 0 when the trace reproduces, 1 at the first
divergence), `--state`, and the what-if: the recorded workload under another config, at
the recorded steps or in simulated time (docs/simulation.md), one run or a sweep."""

from tracengine.cli.common import add_parser
from tracengine.cli.fleet_commands import add_fleet_arguments
from tracengine.cli.flags import add_config_arguments
from tracengine.cli.steptime import (add_step_time_arguments)
from tracengine.cli.sweeps import (add_sweep_arguments)


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
    from tracengine.cli.backends import commands_for_trace
    return commands_for_trace(args.trace).replay(args)
