"""`tracengine events` and `tracengine check`: a trace's events, and its integrity."""
import collections
import os
import sys

import msgspec

from tracengine.errors import TraceCorruptError, TracengineError
from tracengine.replay.render import format_event
from tracengine.trace.events import EVENT_TYPES, StepEnd, TraceHeader, to_builtins
from tracengine.trace.tracelog import TraceReader

EXIT_OK, EXIT_DAMAGED = 0, 1


def parse_step_range(text: str) -> tuple[int, int | None]:
    """`A` is one step; `A:B` steps A..B-1; either side of `:` may be empty."""
    first, sep, last = text.partition(":")
    try:
        start = int(first) if first.strip() else 0
        if not sep:
            return start, start + 1
        return start, int(last) if last.strip() else None
    except ValueError:
        raise TracengineError(f"--step expects a step or a range A:B, got {text!r}") from None


def involves_seq(event, seq_id: int) -> bool:
    if getattr(event, "seq_id", None) == seq_id or getattr(event, "by_seq_id", None) == seq_id:
        return True
    seqs = getattr(event, "seqs", ())
    return getattr(event, "blocked_seq_id", None) == seq_id or any(s.seq_id == seq_id for s in seqs)


def select_events(reader: TraceReader, args):
    """The events that pass every filter given: step range, sequence, types."""
    types = set(args.type or ())
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


def cmd_events(args) -> int:
    with TraceReader(args.trace) as reader:
        try:
            if args.json:
                encode = msgspec.json.Encoder().encode
                for event in select_events(reader, args):
                    sys.stdout.write(encode(to_builtins(event)).decode() + "\n")
            else:
                for event in select_events(reader, args):
                    sys.stdout.write(format_event(event) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:   # `tracengine events run.trace | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_OK
        if reader.torn_tail is not None:
            print(f"tracengine: note: {reader.describe_torn_tail()}; the events above are every complete step",
                  file=sys.stderr)
    return EXIT_OK


def cmd_check(args) -> int:
    try:
        reader = TraceReader(args.trace)
    except TraceCorruptError as exc:   # the header frame itself is damaged
        print(f"{args.trace}: damaged: {exc}")
        return EXIT_DAMAGED
    with reader:
        counts: collections.Counter[str] = collections.Counter()
        steps: list[int] = []
        damage = None
        try:
            for event in reader.events():
                counts[type(event).__name__] += 1
                if type(event) is StepEnd:
                    steps.append(event.step)
        except TraceCorruptError as exc:
            damage = exc
        print_summary(reader, counts, steps)
        if damage is not None:
            print(f"corruption: {damage}; nothing after it is read")
        if reader.torn_tail is not None:
            print(reader.describe_torn_tail())
        whole = damage is None and reader.torn_tail is None
        print(f"{args.trace}: {'whole' if whole else 'damaged'}")
        return EXIT_OK if whole else EXIT_DAMAGED


def print_summary(reader: TraceReader, counts, steps) -> None:
    header = reader.header
    num_events = sum(counts.values())
    file_size = os.path.getsize(reader.path)
    print(f"format version {header.format_version}, written by tracengine {header.tracengine_version}, "
          f"model {header.model.name}, device {header.device}")
    print(f"frames: {reader.num_frames} (header + {reader.num_frames - 1})")
    print(f"steps: {len(steps)}" + (f" ({steps[0]}..{steps[-1]})" if steps else ""))
    print(f"events: {num_events}")
    for name in EVENT_TYPES:
        if counts[name]:
            print(f"  {name:<18}{counts[name]:>10}")
    print(f"bytes: {file_size}" + (f", {file_size / num_events:.1f} per event" if num_events else ""))
    print("end frame: yes, the writer closed the trace" if reader.ended
          else "end frame: none, the trace is still being written or its writer was killed")
