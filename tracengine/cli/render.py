"""`tracengine render`: a trace's step table, one line per step."""
import sys

from tracengine.analysis.render import render_steps
from tracengine.cli.common import EXIT_OK, add_parser, parse_step_range
from tracengine.trace.tracelog import TraceReader


def add_to(sub):
    p = add_parser(sub, "render", "print a trace's step table, one line per step",
                   "Print a trace's step table: a config line, a legend, then one line per step (phase,\n"
                   "scheduled sequences as seq:tokens@cached, stop reason, arrivals, blocks, preemptions,\n"
                   "finishes, free blocks). The snapshot fixtures of tracengine.testing store this table.")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--steps", help="a step or a range A:B (B exclusive; either side may be empty)")
    p.add_argument("--seq", type=int, help="only the steps with an event of this sequence")
    p.set_defaults(run=run)


def run(args) -> int:
    """The step table of a trace, as the snapshot fixtures of tracengine.testing store it."""
    steps = parse_step_range(args.steps, "--steps") if args.steps is not None else None
    with TraceReader(args.trace) as reader:
        if reader.header.fleet:      # a fleet's: each replica's table (docs/cluster.md)
            from tracengine.fleet.stats import replica_streams
            _, streams = replica_streams(reader.events())
            for replica, events in sorted(streams.items()):
                sys.stdout.write(f"# replica {replica}\n" + render_steps(events, steps, args.seq))
        else:
            sys.stdout.write(render_steps(reader.events(), steps, args.seq))
        sys.stdout.flush()
        if reader.torn_tail is not None:
            print(f"tracengine: note: {reader.describe_torn_tail()}; the table has every complete step",
                  file=sys.stderr)
    return EXIT_OK
