"""The trace file, as the rest of tracengine uses it: write one (`TraceWriter`,
`write_trace`), read one (`TraceReader`, `open_trace`, following a file still being
written), make and check its header. The format is frames.py's; the writer and the reader
are writer.py's and reader.py's."""
from tracengine.trace.frames import END_FRAME, FORMAT_VERSION, READABLE_VERSIONS, ends_mid_step
from tracengine.trace.header import check_header, make_header, split_header
from tracengine.trace.reader import TraceReader, open_trace
from tracengine.trace.writer import TraceWriter, compact, compaction_temp, write_trace

__all__ = ["END_FRAME", "FORMAT_VERSION", "READABLE_VERSIONS", "TraceReader", "TraceWriter", "check_header",
           "compact", "compaction_temp", "ends_mid_step", "make_header", "open_trace", "split_header", "write_trace"]
