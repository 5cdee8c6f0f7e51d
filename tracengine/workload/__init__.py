"""Workloads: where the requests of a run come from (prompts, files, synthetic mixes) and when they arrive.

The public, model-free API: `read_workload(path, ...)` -> list of `Request`,
`arrival_times(n, request_rate, burstiness, seed)`, and `workload_requests(WorkloadSpec(...),
vocab_size)` for the sources a command line names (tracengine/cli/flags.py makes the spec)."""
from tracengine.workload.arrivals import arrival_times
from tracengine.engine.request import Request
from tracengine.workload.formats import FORMATS, detect_format, read_workload

__all__ = ["FORMATS", "Request", "arrival_times", "detect_format", "read_workload"]
