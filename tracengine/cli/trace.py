"""`tracengine events`, `render` and `check`: a trace's events, its step table, and its integrity."""
import collections
import json
import os
import sys

import msgspec

from tracengine.errors import TraceCorruptError, TraceError, TracengineError
from tracengine.replay.fold import EventCheck
from tracengine.analysis.render import format_event, involves_seq, render_steps
from tracengine.trace.events import EVENT_TYPES, StepEnd, TraceHeader, to_builtins
from tracengine.trace.tracelog import TraceReader

EXIT_OK, EXIT_DAMAGED, EXIT_NOT_ENDED = 0, 1, 3


def parse_step_range(text: str, flag: str = "--step") -> tuple[int, int | None]:
    """`A` is one step; `A:B` steps A..B-1; either side of `:` may be empty."""
    first, sep, last = text.partition(":")
    try:
        start = int(first) if first.strip() else 0
        stop = start + 1 if not sep else int(last) if last.strip() else None
    except ValueError:
        raise TracengineError(f"{flag} expects a step or a range A:B, got {text!r}") from None
    if start < 0 or (stop is not None and stop <= start):
        raise TracengineError(f"{flag} expects a step >= 0 or a range A:B with 0 <= A < B, got {text!r}")
    return start, stop


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


def cmd_events(args) -> int:
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


def cmd_render(args) -> int:
    """The step table of a trace, as the snapshot fixtures of tracengine.testing store it."""
    steps = parse_step_range(args.steps, "--steps") if args.steps is not None else None
    with TraceReader(args.trace) as reader:
        sys.stdout.write(render_steps(reader.events(), steps, args.seq))
        sys.stdout.flush()
        if reader.torn_tail is not None:
            print(f"tracengine: note: {reader.describe_torn_tail()}; the table has every complete step",
                  file=sys.stderr)
    return EXIT_OK


def cmd_check(args) -> int:
    """Exit 0: whole; 1: damage (corruption, a torn tail, an event that does not
    follow); 3: intact but without end frame (still being written, or its writer killed)."""
    try:
        reader = TraceReader(args.trace)
    except TraceCorruptError as exc:   # the header frame itself is damaged
        return report_check(args, None, {}, [], {"message": str(exc), "offset": exc.offset, "step": exc.step}, None)
    with reader:
        counts: collections.Counter[str] = collections.Counter()
        steps: list[int] = []
        damage = impossible = None
        checker = None
        if not args.fast:
            try:
                checker = EventCheck(reader.header)
                if reader.header.fleet:      # each replica's events checked on their own (docs/cluster.md)
                    from tracengine.replay.fleet import FleetEventCheck
                    checker = FleetEventCheck(reader.header)
            except TraceError as exc:
                impossible = {"message": str(exc), "offset": reader.frames()[0].offset, "step": None}
        counts["TraceHeader"] = 1
        for i, frame in enumerate(reader.frames()[1:], 1):
            try:
                events = reader.read_frame(i)
            except TraceCorruptError as exc:
                damage = exc
                break
            for event in events:
                counts[type(event).__name__] += 1
                if type(event) is StepEnd:
                    steps.append(event.step)
            if checker is not None and impossible is None:
                try:
                    checker.frame(events)
                except TraceError as exc:
                    impossible = {"message": str(exc), "offset": frame.offset, "step": checker.step}
        damage = damage or reader.corruption
        corruption = None if damage is None else {"message": str(damage), "offset": damage.offset, "step": damage.step}
        return report_check(args, reader, counts, steps, corruption, impossible)


def report_check(args, reader: TraceReader | None, counts, steps, corruption, impossible) -> int:
    torn = reader.torn_tail if reader is not None else None
    ended = reader is not None and reader.ended
    if corruption or impossible or torn:
        status, code = "damaged", EXIT_DAMAGED
    else:
        status, code = ("whole", EXIT_OK) if ended else ("not ended", EXIT_NOT_ENDED)
    if args.json:
        header = reader.header if reader is not None else None
        print(json.dumps({
            "trace": str(args.trace), "status": status, "ended": ended, "folded": not args.fast,
            "format_version": header.format_version if header else None,
            "tracengine_version": header.tracengine_version if header else None,
            "num_frames": reader.num_frames if reader else 0, "num_steps": len(steps),
            "first_step": steps[0] if steps else None, "last_step": steps[-1] if steps else None,
            "num_events": sum(counts.values()), "event_counts": {n: counts[n] for n in EVENT_TYPES if counts[n]},
            "bytes": os.path.getsize(args.trace),
            "torn_tail": None if torn is None else {"offset": torn.offset, "nbytes": torn.nbytes},
            "corruption": corruption, "impossible": impossible}, indent=2))
        return code
    if reader is None:
        print(f"{args.trace}: damaged: {corruption['message']}")
        return code
    print_summary(reader, counts, steps)
    if corruption is not None:
        print(f"corruption: {corruption['message']}; nothing after it is read")
    if impossible is not None:
        print(f"impossible event: {impossible['message']} (frame at offset {impossible['offset']}); "
              f"replay would diverge there")
    if torn is not None:
        print(reader.describe_torn_tail())
    print(f"{args.trace}: {status}" + (" (intact, but no end frame: exit 3)" if code == EXIT_NOT_ENDED else ""))
    return code


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
