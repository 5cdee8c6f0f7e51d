"""`tracengine diff`: the first scheduling difference between two traces."""

from tracengine.cli.common import add_parser
from tracengine.trace.tracelog import TraceReader


def add_to(sub):
    p = add_parser(sub, "diff", "first scheduling divergence between two traces",
                   "Compare two traces' scheduling events step by step: print the first difference and\n"
                   "the two runs side by side (exit 1 when they differ).")
    p.add_argument("a", help="the first trace")
    p.add_argument("b", help="the second trace")
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.set_defaults(run=run)


def run(args) -> int:
    from tracengine.cli.backends import diff_commands
    with TraceReader(args.a) as reader_a, TraceReader(args.b) as reader_b:
        return diff_commands(reader_a.header, reader_b.header).diff(args, reader_a, reader_b)
