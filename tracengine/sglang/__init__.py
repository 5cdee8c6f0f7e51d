"""SGLang's own scheduler, recorded and replayed.

`plugin.py` is an SGLang plugin (the entry point `tracengine` in the group
`sglang.srt.plugins`): with TRACENGINE_RECORD=PATH set, every Scheduler
SGLang builds records its decisions into a tracengine trace (recorder.py).
`build.py` rebuilds SGLang's real Scheduler from a trace header on a CPU with
no model (a stand-in worker gives the tokens); `drive.py` drives it as
SGLang's normal event loop does; `replay.py` re-executes a recorded trace
through it. SGLang is imported only when one of them is used
(`scripts/install-sglang-cpu.sh` installs it on a machine without CUDA)."""

SUPPORTED_VERSION = "0.5.23"    # the SGLang tracengine.sglang is tested with (scripts/install-sglang-cpu.sh)


def require_sglang(needed_by: str, version: str = SUPPORTED_VERSION) -> str:
    """The installed SGLang's version; where there is none, a NotInstalledError (one line, its own
    exit code) saying what needs SGLang `version` and how to install it."""
    try:
        from importlib.metadata import PackageNotFoundError, version as installed
        return installed("sglang")
    except PackageNotFoundError:
        from tracengine.errors import NotInstalledError
        how = f"pip install sglang=={version}"
        if version == SUPPORTED_VERSION:
            how = f"scripts/install-sglang-cpu.sh installs it on a CPU machine, {how} on a GPU one"
        raise NotInstalledError(f"{needed_by}; SGLang is not installed here ({how})") from None
