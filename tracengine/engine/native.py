"""What the compiled core's classes say to mypyc (tracengine/compiled.py): `mypyc_attr` from
mypy_extensions where it is installed, a decorator that does nothing where it is not (the
pure-Python core needs none)."""
try:
    from mypy_extensions import mypyc_attr
except ImportError:
    def mypyc_attr(*attrs: str, **kwattrs: object):  # type: ignore[no-redef,misc]
        return lambda cls: cls
