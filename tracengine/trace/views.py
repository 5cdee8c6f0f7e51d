"""What is read off events: their JSON view (`events --json`: "type" is the class name), what a
replay compares of one (every field but the wall-clock ones), and a stream of them in steps."""
import msgspec

from tracengine.trace.events import WALL_CLOCK_FIELDS, Event, StepEnd


def to_builtins(event: Event) -> dict:
    """The JSON view: "type" is the class name, then the struct's fields by name."""
    out = {"type": type(event).__name__}
    for name in event.__struct_fields__:
        out[name] = _plain(getattr(event, name))
    return out


def _plain(value):
    if isinstance(value, msgspec.Struct):
        return {name: _plain(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def without_wall_clock(event: Event) -> tuple:
    """What a replay compares: the type and every field but wall-clock ones."""
    return (type(event).__name__,) + tuple(
        getattr(event, name) for name in event.__struct_fields__ if name not in WALL_CLOCK_FIELDS)


def iter_steps(events):
    """Events grouped by step: each group ends with its StepEnd, except an
    unfinished last step (requests that arrived after the last step)."""
    current = []
    for event in events:
        current.append(event)
        if type(event) is StepEnd:
            yield current
            current = []
    if current:
        yield current
