"""tracengine's SGLang plugin (the entry point `tracengine` in the group `sglang.srt.plugins`,
pyproject.toml): SGLang calls `register` in every process it starts. With TRACENGINE_RECORD=PATH
set, the scheduler of the first rank (tensor and data parallel rank 0) records its decisions to
PATH from the end of its construction (recorder.py's hooks) until its event loop returns (a
ShutdownReq: SGLang's server sends one to its schedulers on SIGTERM, before it kills them), when
the trace gets its end frame; with it unset, the plugin does nothing (no hook is installed).
SGLANG_PLUGINS=tracengine loads it alone."""
import os

from tracengine.sglang.recorder import RECORD_ENV


def register() -> None:
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from tracengine.sglang.recorder import install_hooks
    install_hooks()
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.__init__", start_recording, HookType.AFTER)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.run_event_loop", end_recording, HookType.AFTER)


def start_recording(result, scheduler, *args, **kwargs) -> None:
    """After a Scheduler is built: record it to $TRACENGINE_RECORD (rank 0's only)."""
    path = os.environ.get(RECORD_ENV)
    if not path or getattr(scheduler, "tp_rank", 0) or getattr(scheduler, "dp_rank", 0):
        return
    from tracengine.sglang.header import trace_header
    from tracengine.sglang.recorder import record_to
    from tracengine.trace.tracelog import TraceWriter
    header = trace_header(scheduler)
    record_to(scheduler, TraceWriter(path, header), header.created_at)


def end_recording(result, scheduler, *args, **kwargs) -> None:
    """After a Scheduler's event loop returns (a graceful shutdown; an exception skips this, and
    its trace stays without end frame): the trace's end frame. Its process is killed next."""
    from tracengine.sglang.recorder import stop_recording
    stop_recording(scheduler)
