"""What a trace of another engine's own scheduler (vLLM's, SGLang's) needs of that engine to run
again: the installed engine at the recorded version."""
from tracengine.errors import TraceVersionError


def check_engine_version(engine: str, require, recorded: str) -> str:
    """The installed `engine`'s version (`require(needed_by, version)`: the package's require_vllm
    or require_sglang, which raises where it is not installed), which must be the `recorded` one:
    its scheduler's decisions are that version's."""
    version = require(f"the trace was recorded with {engine} {recorded}", recorded)
    if version != recorded:
        raise TraceVersionError(f"the trace was recorded with {engine} {recorded}; the installed {engine} is "
                                f"{version} (a replay needs the recorded version)")
    return version
