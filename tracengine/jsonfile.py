"""The JSON files tracengine reads whole (a step-time model, a model's config.json), each
one object, refused in one line otherwise. Its own module, not errors.py: the scheduler
imports errors.py and, by the import rules, no I/O."""
import json

from tracengine.errors import TracengineError


def load_json_object(path: str, what: str, error: type = TracengineError) -> dict:
    """The JSON object in the file at `path`; anything else (no such file, not text, not JSON,
    not an object) is `error("{path}: not {what} (why)")`, one line."""
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
