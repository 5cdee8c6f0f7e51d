"""A class the user names by import path (a scheduling policy, a router): `module:Class`,
imported only because the user gave its name (a flag, an argument), never because a trace
recorded it."""
import functools
import importlib

from tracengine.errors import ConfigError


def load_class(spec: str, builtins: dict, base: type, kind: str, base_name: str):
    """`builtins[spec]`, or the class `spec` names as module:Class, which must subclass `base`."""
    if spec in builtins:
        return builtins[spec]
    module_name, sep, qualname = spec.partition(":")
    if not (sep and module_name and qualname):
        raise ConfigError(f"{kind} {spec!r}: expected {', '.join(builtins)} or module:Class")
    try:
        obj = resolve(spec)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {kind} {spec!r}: {exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ConfigError(f"{kind} {spec!r} is not a {base_name} subclass")
    return obj


def resolve(path: str):
    """The object a `module:name` path names; `name` may be dotted (`module:Class.attribute`, an
    entry point's form). An ImportError or AttributeError where there is none."""
    module_name, _, qualname = path.partition(":")
    return functools.reduce(getattr, qualname.split("."), importlib.import_module(module_name))


def class_name(cls: type, builtins: dict) -> str:
    """What a config or a trace records for `cls`: a built-in's name, else module:Class
    (the name `load_class` takes back)."""
    for name, builtin in builtins.items():
        if builtin is cls:
            return name
    return f"{cls.__module__}:{cls.__qualname__}"
