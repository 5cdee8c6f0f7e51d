"""Errors a user can cause. Anything else is a bug and keeps its traceback."""


class TracengineError(Exception):
    """Bad input: a config value, a prompt, a model directory or a trace."""


class ConfigError(TracengineError):
    pass


class RequestError(TracengineError):
    """A request the engine can never serve (too long, can never fit)."""


class ModelError(TracengineError):
    """A model directory that is missing or malformed."""


class NotInstalledError(TracengineError):
    """A package the command needs is not installed here (vLLM, for vLLM's scheduler): its own exit code."""


class WorkerError(TracengineError):
    """A tensor-parallel worker process failed or is gone; the engine cannot go on."""


class TraceError(TracengineError):
    """A trace that cannot be read as asked."""


class TraceVersionError(TraceError):
    pass


class TraceCorruptError(TraceError):
    def __init__(self, message: str, offset: int, step: int | None = None):
        where = f" at offset {offset}" + (f" (after step {step})" if step is not None else "")
        super().__init__(message + where)
        self.offset = offset
        self.step = step
