"""`tracengine events`: a trace's events, one per line or one JSON object per line."""
import sys

import msgspec

from tracengine.analysis.render import format_event, involves_seq
from tracengine.cli.common import EXIT_OK, add_parser, parse_step_range
from tracengine.errors import TracengineError
from tracengine.trace.events import TraceHeader
from tracengine.trace.vllm_events import ALL_EVENT_TYPES as EVENT_TYPES
from tracengine.trace.views import to_builtins
from tracengine.trace.tracelog import TraceReader


def add_to(sub):
    p = add_parser(sub, "events", "list a trace's events",
                   "List a trace's events, one per line (the TraceHeader first), filtered by step,\n"
                   "sequence or type; --json prints one JSON object per event.")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--json", action="store_true", help="one JSON object per line: \"type\" and the event's fields")
    p.add_argument("--step", help="a step or a range A:B (B exclusive; either side may be empty)")
    p.add_argument("--seq", type=int, help="only events of this sequence")
    p.add_argument("--type", action="append", help="only events of this type (repeatable)")
    p.set_defaults(run=run)


def select_events(reader: TraceReader, args):
    """The events that pass every filter given: step range, sequence, types."""
    types = set(args.type or ())
    if args.seq is not None and args.seq < 0:
        raise TracengineError(f"--seq expects a sequence id >= 0, got {args.seq}")
    unknown = sorted(types - set(EVENT_TYPES))
    if unknown:
        raise TracengineError(f"unknown event type {unknown[0]!r}; known: {', '.join(EVENT_TYPES)}")
    start, stop = parse_step_range(args.step) if args.step is not None else (None, None)
    start_frame = 0 if start is None else reader.step_frame(start)
    for event in reader.events(start_frame):
        if type(event) is TraceHeader:
            if start is None and args.seq is None and (not types or "TraceHeader" in types):
                yield event
            continue
        if start is not None and event.step < start:
            continue
        if stop is not None and event.step >= stop:
            return
        if types and type(event).__name__ not in types:
            continue
        if args.seq is not None and not involves_seq(event, args.seq):
            continue
        yield event


def describe_filters(args) -> str:
    given = [f"--step {args.step}" if args.step is not None else "", f"--seq {args.seq}" if args.seq is not None else "",
             *(f"--type {t}" for t in args.type or ())]
    return " ".join(g for g in given if g)


def run(args) -> int:
    with TraceReader(args.trace) as reader:
        num_shown = 0
        if args.json:
            encode = msgspec.json.Encoder().encode
            for event in select_events(reader, args):
                sys.stdout.write(encode(to_builtins(event)).decode() + "\n")
                num_shown += 1
        else:
            for event in select_events(reader, args):
                sys.stdout.write(format_event(event) + "\n")
                num_shown += 1
        sys.stdout.flush()
        if reader.torn_tail is not None:
            print(f"tracengine: note: {reader.describe_torn_tail()}; the events above are every complete step",
                  file=sys.stderr)
        if not num_shown:
            last = reader.frames()[-1].step if reader.num_frames > 1 else None
            steps = f"steps 0..{last}" if last is not None else "no steps"
            print(f"tracengine: note: no event matches {describe_filters(args)} (the trace has {steps})",
                  file=sys.stderr)
    return EXIT_OK
