"""The base of every trace event: a frozen, array-like msgspec struct tagged by a small int."""
import msgspec


class Event(msgspec.Struct, frozen=True, gc=False, array_like=True, omit_defaults=True, tag_field="t"):
    pass
