"""Block id lists as runs on the wire (format 9). A sequence's block table is mostly runs of
consecutive ids (the free list hands them out in order; BlockFree releases them tail first),
which deflate does not capture: each id is a msgpack int of 3 to 5 bytes. The writer so writes
a BlockAllocate, BlockFree, Preempt or PromptBlocksHashed whose ids are fewer as runs as its
wire form (a tag of its own, the same fields, its id list holding runs), and the reader turns
each wire form back into the event it came from: the events in memory are the same, and no
consumer sees a wire form.

A run list is flat: `start, count, start, count, ...`; a positive count is the ids start,
start + 1, ..., a negative one start, start - 1, ... (a run released tail first); no count is 0
and none holds more than MAX_RUN_LENGTH ids (the writer splits a longer run), so a run (two
msgpack ints, two bytes at least) stands for at most MAX_RUN_LENGTH / 2 ids a payload byte: a
frame's memory stays proportional to its size (frames.py: bounds on hostile files)."""
from typing import Union

import msgspec

from tracengine.trace.vllm_events import BACKEND_EVENTS
from tracengine.trace.events import (
    AnyEvent,
    BlockAllocate,
    BlockFree,
    Preempt,
    PromptBlocksHashed,
)

MAX_RUN_LENGTH = 1024


class BlockAllocateRuns(BlockAllocate, tag=17):
    """BlockAllocate on the wire, its block_ids as runs."""


class BlockFreeRuns(BlockFree, tag=18):
    """BlockFree on the wire, its block_ids as runs."""


class PreemptRuns(Preempt, tag=19):
    """Preempt on the wire, its freed_block_ids as runs."""


class PromptBlocksHashedRuns(PromptBlocksHashed, tag=20):
    """PromptBlocksHashed on the wire, its block_ids as runs."""


# event type -> (its wire form, the field of block ids); and the way back
WIRE_FORMS = {BlockAllocate: (BlockAllocateRuns, "block_ids"), BlockFree: (BlockFreeRuns, "block_ids"),
              Preempt: (PreemptRuns, "freed_block_ids"), PromptBlocksHashed: (PromptBlocksHashedRuns, "block_ids")}
EVENT_OF_WIRE_FORM = {wire: (event_type, field) for event_type, (wire, field) in WIRE_FORMS.items()}
# what a frame's payload decodes to: the events and their wire forms
WireEvent = Union[(AnyEvent, BlockAllocateRuns, BlockFreeRuns, PreemptRuns, PromptBlocksHashedRuns, *BACKEND_EVENTS)]


def id_runs(ids: list[int]) -> list[int]:
    """`ids` as a flat run list (the module's rule)."""
    runs = []
    i = 0
    while i < len(ids):
        start = ids[i]
        j = i + 1
        direction = ids[j] - start if j < len(ids) and abs(ids[j] - start) == 1 else 0
        if direction:
            while j < len(ids) and j - i < MAX_RUN_LENGTH and ids[j] - ids[j - 1] == direction:
                j += 1
        runs += (start, -(j - i) if direction < 0 else j - i)
        i = j
    return runs


def ids_of_runs(runs: list[int]) -> list[int]:
    """The ids a run list holds; ValueError for one that breaks the module's rule."""
    if len(runs) % 2:
        raise ValueError("a block id run list of odd length")
    ids = []
    for start, count in zip(runs[::2], runs[1::2]):
        if count == 0 or abs(count) > MAX_RUN_LENGTH:
            raise ValueError(f"a block id run of {count} ids")
        ids += range(start, start + count) if count > 0 else range(start, start + count, -1)
    return ids


def to_wire(event):
    """The event as written: its wire form where its ids are fewer as runs, else itself."""
    wire_type, field = WIRE_FORMS[type(event)]
    ids = getattr(event, field)
    runs = id_runs(ids)
    if len(runs) >= len(ids):
        return event
    values = msgspec.structs.asdict(event)
    values[field] = runs
    return wire_type(**values)


def from_wire(event):
    """The event a wire form was written for (ValueError for damaged runs)."""
    event_type, field = EVENT_OF_WIRE_FORM[type(event)]
    values = msgspec.structs.asdict(event)
    values[field] = ids_of_runs(values[field])
    return event_type(**values)


def events_to_wire(events: list) -> list:
    """A frame's events as the writer encodes them."""
    return [to_wire(e) if type(e) in WIRE_FORMS else e for e in events]


def events_from_wire(events: list) -> list:
    """A decoded frame's events as readers see them: no wire form left."""
    return [from_wire(e) if type(e) in EVENT_OF_WIRE_FORM else e for e in events]
