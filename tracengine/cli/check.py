"""`tracengine check`: a trace's integrity: frames, checksums, torn tail, end frame, and
that each event follows from the ones before it."""
import collections
import json
import os

from tracengine.cli.common import EXIT_FAILED_CHECK, EXIT_NOT_ENDED, EXIT_OK, EXIT_RUN_FAILED, add_parser
from tracengine.errors import TraceCorruptError, TraceError
from tracengine.trace.events import StepEnd
from tracengine.trace.vllm_events import ALL_EVENT_TYPES as EVENT_TYPES
from tracengine.trace.tracelog import TraceReader


def add_to(sub):
    p = add_parser(sub, "check", "integrity of a trace: frames, checksums, torn tail, events that follow",
                   "Check a trace: every frame's length and checksum, a torn last frame, the end frame,\n"
                   "and that each event follows from the ones before it (folded as replay would).\n"
                   "Exit 0 for a whole trace, 1 for damage, 3 for an intact trace without end frame,\n"
                   "4 for an intact trace whose run failed or was interrupted (the reason is printed).")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--fast", action="store_true", help="frames and checksums only: do not fold the events")
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.set_defaults(run=run)


def run(args) -> int:
    """Exit 0: whole; 1: damage (corruption, a torn tail, an event that does not
    follow); 3: intact but without end frame (still being written, or its writer killed);
    4: intact and closed, but its run failed or was interrupted (its RunEnd says why)."""
    try:
        reader = TraceReader(args.trace)
    except TraceCorruptError as exc:   # the header frame itself is damaged
        return report_check(args, None, {}, [], {"message": str(exc), "offset": exc.offset, "step": exc.step}, None)
    with reader:
        from tracengine.cli.scheduler_backend import note_not_recorded
        note_not_recorded(reader.header)
        counts: collections.Counter[str] = collections.Counter()
        steps: list[int] = []
        damage = impossible = None
        checker = None
        if not args.fast:
            try:
                from tracengine.cli.backends import commands_of
                checker = commands_of(reader.header).event_check(reader.header)    # a fleet's: each replica's
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
    run_end = reader.run_end if reader is not None else None
    if corruption or impossible or torn:
        status, code = "damaged", EXIT_FAILED_CHECK
    elif run_end is not None:
        status, code = run_end.outcome, EXIT_RUN_FAILED
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
            "corruption": corruption, "impossible": impossible,
            "not_recorded": list(header.not_recorded) if header else [],
            "run_end": None if run_end is None else {"step": run_end.step, "outcome": run_end.outcome,
                                                     "reason": run_end.reason}}, indent=2))
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
    if run_end is not None:
        print(f"run {run_end.outcome} after step {run_end.step}: {run_end.reason}" if run_end.step >= 0
              else f"run {run_end.outcome} before its first step: {run_end.reason}")
    notes = {EXIT_NOT_ENDED: " (intact, but no end frame: exit 3)",
             EXIT_RUN_FAILED: " (intact; the run did not finish: exit 4)"}
    print(f"{args.trace}: {status}" + notes.get(code, ""))
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
    if reader.run_end is not None:
        print(f"end frame: yes, the writer closed the trace; the run {reader.run_end.outcome}")
    elif reader.ended:
        print("end frame: yes, the writer closed the trace")
    else:
        print("end frame: none, the trace is still being written or its writer was killed")
