"""Instruction counts of the trace writer, for callgrind: writes the events of a
trace N times with one writer (`instep`: each frame deflated inside the step, the
writer before compaction; `now`: frames stored, the trace compacted at close, its
compaction included). Run it under callgrind with N and with 0 writes; the
difference over the frames written is the writer's instructions per frame, warm.

    valgrind --tool=callgrind --callgrind-out-file=cg.now.2 python benchmarks/callgrind_writer.py now 2 run.trace
    valgrind --tool=callgrind --callgrind-out-file=cg.now.0 python benchmarks/callgrind_writer.py now 0 run.trace
    (the "summary:" lines of the two files; python must be the interpreter itself, not a shim script)
"""
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record_overhead import InStepDeflateTraceWriter  # noqa: E402
from tracengine.trace.tracelog import TraceReader, TraceWriter  # noqa: E402

WRITERS = {"instep": InStepDeflateTraceWriter, "now": TraceWriter}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] not in WRITERS:
        print(__doc__, file=sys.stderr)
        return 2
    writer, times, source = WRITERS[argv[0]], int(argv[1]), argv[2]
    with TraceReader(source) as reader:
        header, *events = reader.events()
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(times):
            with writer(os.path.join(tmp, "out.trace"), header) as sink:
                for event in events:
                    sink.emit(event)
    return 0


if __name__ == "__main__":
    sys.exit(main())
