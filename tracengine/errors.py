"""Errors a user can cause. Anything else is a bug and keeps its traceback."""
import json


class TracengineError(Exception):
    """Bad input: a config value, a prompt, a model directory or a trace."""


class ConfigError(TracengineError):
    pass


class RequestError(TracengineError):
    """A request the engine can never serve (too long, can never fit)."""


class ModelError(TracengineError):
    """A model directory that is missing or malformed."""


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


def load_json_object(path: str, what: str, error: type = TracengineError) -> dict:
    """The JSON object in the file at `path`; anything else (no such file, not text, not
    JSON, not an object) is `error("{path}: not {what} (why)")`, one line."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except OSError as exc:
        raise error(f"{path}: not {what} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not {what} (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not {what} (not valid JSON: {exc.msg})") from None
    if not isinstance(value, dict):
        raise error(f"{path}: not {what} (expected a JSON object)")
    return value
