"""The JSON files the simulator reads (a step-time model, a model's config.json),
each one object, refused in one line otherwise."""
import json

from tracengine.errors import TracengineError


def load_json_object(path: str, what: str) -> dict:
    """The JSON object in the file at `path` (a step-time model, a model's config.json);
    anything else (no such file, not text, not JSON, not an object) is one line:
    "{path}: not {what} (why)"."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except OSError as exc:
        raise TracengineError(f"{path}: not {what} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise TracengineError(f"{path}: not {what} (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise TracengineError(f"{path}: not {what} (not valid JSON: {exc.msg})") from None
    if not isinstance(value, dict):
        raise TracengineError(f"{path}: not {what} (expected a JSON object)")
    return value
