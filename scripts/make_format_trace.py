"""Writes traces/format-vN.trace for this format version N: a small trace holding the
event types of its version, kept forever so that tests/test_tracelog.py proves newer
tracengines still read it. Version 1's holds one engine's event types; version 4's a fleet's
(testing.every_fleet_event_type: replica scopes, routing decisions, KV transfers); version 6's
one engine's run interrupted by SIGTERM after its last step, so that its end frame holds a RunEnd
(tests/test_run_end.py reads it); version 8's a server's aborts, each flushed as a between-steps
frame before the step it precedes or the end frame (testing.aborts_between_steps;
tests/test_between_steps.py reads it); version 9's the run of version 1's, its block id lists as
runs (tests/test_block_runs.py reads it as the same events as format-v1.trace). Run once
per new format version (name the file after it); never regenerate a released one.

    python scripts/make_format_trace.py [OUT]
"""
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracengine.process.signals import Terminated  # noqa: E402
from tracengine.testing import (aborts_between_steps, every_event_type, every_event_type_config,  # noqa: E402
                                every_fleet_event_type, fleet_event_type_header)
from tracengine.trace.tracelog import FORMAT_VERSION, TraceReader, TraceWriter, make_header  # noqa: E402


def main(out: Path) -> None:
    if FORMAT_VERSION >= 9:
        with TraceWriter(out, make_header(every_event_type_config())) as writer:
            every_event_type(writer)
    elif FORMAT_VERSION == 8:
        with TraceWriter(out, make_header(every_event_type_config())) as writer:
            aborts_between_steps(writer)
    elif FORMAT_VERSION >= 6:       # 7's own trace is traces/hash_ids_v7.trace
        writer = TraceWriter(out, make_header(every_event_type_config()))
        every_event_type(writer)
        writer.end_with(Terminated("SIGTERM"))     # format 6's end frame: a RunEnd
        writer.close()
    elif FORMAT_VERSION in (4, 5):
        with TraceWriter(out, fleet_event_type_header()) as writer:
            every_fleet_event_type(writer)
    else:
        with TraceWriter(out, make_header(every_event_type_config())) as writer:
            every_event_type(writer)
    with TraceReader(out) as reader:
        counts = collections.Counter(type(e).__name__ for e in reader.events())
        print(f"{out}: format version {FORMAT_VERSION}, {reader.num_frames} frames, {dict(counts)}, "
              f"{reader.run_end}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "traces"
         / f"format-v{FORMAT_VERSION}.trace")
