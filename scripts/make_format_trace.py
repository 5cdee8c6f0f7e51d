"""Writes traces/format-vN.trace (N: this FORMAT_VERSION): a small trace holding
every event type, kept forever so that the tests prove newer tracengines still
read it (format-v1.trace: tests/test_tracelog.py; format-v4.trace, a run
interrupted by SIGTERM after its last step, so its end frame holds a RunEnd:
tests/test_run_end.py). Run once per new format version (name the file after
it); never regenerate a released one.

    python scripts/make_format_trace.py [OUT]
"""
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracengine.signals import Terminated  # noqa: E402
from tracengine.testing import every_event_type, every_event_type_config  # noqa: E402
from tracengine.trace.tracelog import FORMAT_VERSION, TraceReader, TraceWriter, make_header  # noqa: E402


def main(out: Path) -> None:
    writer = TraceWriter(out, make_header(every_event_type_config()))
    every_event_type(writer)
    writer.end_with(Terminated("SIGTERM"))     # format 4's end frame: a RunEnd
    writer.close()
    with TraceReader(out) as reader:
        counts = collections.Counter(type(e).__name__ for e in reader.events())
        print(f"{out}: format version {FORMAT_VERSION}, {reader.num_frames} frames, {dict(counts)}, "
              f"{reader.run_end}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "traces"
         / f"format-v{FORMAT_VERSION}.trace")
