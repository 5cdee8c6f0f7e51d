"""Writes traces/format-v1.trace: a small trace of format version 1 holding
every event type, kept forever so that tests/test_tracelog.py proves newer
tracengines still read it. Run once per new format version (name the file
after it); never regenerate a released one.

    python scripts/make_format_trace.py [OUT]
"""
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracengine.testing import every_event_type, every_event_type_config  # noqa: E402
from tracengine.trace.tracelog import FORMAT_VERSION, TraceReader, TraceWriter, make_header  # noqa: E402


def main(out: Path) -> None:
    with TraceWriter(out, make_header(every_event_type_config())) as writer:
        every_event_type(writer)
    with TraceReader(out) as reader:
        counts = collections.Counter(type(e).__name__ for e in reader.events())
        print(f"{out}: format version {FORMAT_VERSION}, {reader.num_frames} frames, {dict(counts)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "traces"
         / f"format-v{FORMAT_VERSION}.trace")
