"""`tracengine render`: a trace's step table, one line per step."""
import sys

from tracengine.analysis.render import involves_seq
from tracengine.cli.common import EXIT_OK, add_parser, parse_step_range
from tracengine.errors import TraceError
from tracengine.trace.events import StepEnd
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
    from tracengine.cli.backends import commands_of
    with TraceReader(args.trace) as reader:
        tables = commands_of(reader.header).step_tables(reader, steps, args.seq)     # a fleet's: one a replica
        if (steps is not None or args.seq is not None) and not any(map(has_step_line, tables)):
            refuse_filters(reader, args, steps)
        for table in tables:
            sys.stdout.write(table)
        sys.stdout.flush()
        if reader.torn_tail is not None:
            print(f"tracengine: note: {reader.describe_torn_tail()}; the table has every complete step",
                  file=sys.stderr)
    return EXIT_OK


def has_step_line(table: str) -> bool:
    """A step's line: the table's lines but its comments (the config, the legend, the replica)."""
    return any(line and not line.startswith("#") for line in table.splitlines())


def refuse_filters(reader, args, steps: tuple[int, int | None] | None):
    """--steps or --seq that keep no step: a one-line error naming what the trace has (an empty
    table would read as a trace with nothing in it)."""
    step_ids, seq_ids, seq_steps = set(), set(), set()
    for event in reader.events():
        if type(event) is StepEnd:
            step_ids.add(event.step)
        if getattr(event, "seq_id", None) is not None:
            seq_ids.add(event.seq_id)
        if args.seq is not None and involves_seq(event, args.seq):
            seq_steps.add(getattr(event, "step", None))
    has_steps = f"steps {min(step_ids)}..{max(step_ids)}" if step_ids else "no complete step"
    if steps is not None and not any(steps[0] <= s and (steps[1] is None or s < steps[1]) for s in step_ids):
        raise TraceError(f"--steps {args.steps}: not in {reader.path}, which has {has_steps}")
    if args.seq not in seq_ids:
        has_seqs = f"sequences {min(seq_ids)}..{max(seq_ids)}" if seq_ids else "no sequence"
        raise TraceError(f"--seq {args.seq}: not in {reader.path}, which has {has_seqs}")
    where = f"--steps {args.steps}" if steps is not None else f"{reader.path}'s complete steps"
    seq_steps &= step_ids
    has_seq = f"in steps {min(seq_steps)}..{max(seq_steps)}" if seq_steps else "in no complete step"
    raise TraceError(f"--seq {args.seq}: no step of {where} has an event of sequence {args.seq}, which is {has_seq}")
