"""vLLM's own V1 scheduler, recorded and replayed.

`RecordingScheduler` and `RecordingAsyncScheduler` (recorder.py) are vLLM's
Scheduler and AsyncScheduler writing a tracengine trace; `build.py` rebuilds
vLLM's scheduler from a trace header; `replay.py` re-executes a recorded
trace through it; `drive.py` drives it as vLLM's engine core does, with
fabricated model outputs. vLLM is imported only when one of them is used
(`scripts/install-vllm-cpu.sh` installs it on a machine without CUDA)."""

__all__ = ["RecordingScheduler", "RecordingAsyncScheduler"]

SUPPORTED_VERSION = "0.33.0"    # the vLLM tracengine.vllm is tested with, which scripts/install-vllm-cpu.sh installs


def require_vllm(needed_by: str, version: str = SUPPORTED_VERSION) -> str:
    """The installed vLLM's version; where there is none, a NotInstalledError (one line, its own exit
    code) saying what needs vLLM `version` and how to install it."""
    try:
        import vllm
    except ImportError:
        from tracengine.errors import NotInstalledError
        how = f"pip install vllm=={version}"
        if version == SUPPORTED_VERSION:     # the script installs this version only
            how = f"scripts/install-vllm-cpu.sh installs it on a CPU machine, {how} on a GPU one"
        raise NotInstalledError(f"{needed_by}; vLLM is not installed here ({how})") from None
    return vllm.__version__


def __getattr__(name):
    # Lazy: importing tracengine.vllm does not import vLLM (vLLM resolves --scheduler-cls by getattr).
    if name in __all__:
        from tracengine.vllm.recorder import recording_classes
        return recording_classes()[name]
    raise AttributeError(f"module 'tracengine.vllm' has no attribute {name!r}")
