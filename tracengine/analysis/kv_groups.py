"""A hybrid model's KV cache groups in a vLLM trace (tracengine/vllm/group_blocks.py): per group, the
blocks its requests were given (hits among them), gave back while running (out of a sliding window,
older Mamba states) and freed, and the most it held at once, counted in a pass of their own over a
hybrid trace's events (a trace whose header names no groups, `kv_cache_groups`, has none). The
prefix-cache figures are the first group's, as a one-group trace's are."""
import json
import os

from tracengine.analysis.figures import KVGroupFigures
from tracengine.trace.events import BlockAllocate, BlockAppend, BlockFree
from tracengine.trace.vllm_events import BlockSkip


class GroupCounts:
    def __init__(self, header):
        described = json.loads(header.config["kv_cache_groups"])
        self.specs = [group["spec"] for group in described]
        self.windows = [group["fields"].get("sliding_window") for group in described]
        n = len(described)
        self.allocated, self.hits, self.skipped, self.freed = [0] * n, [0] * n, [0] * n, [0] * n
        self.held, self.peak = [0] * n, [0] * n

    def gained(self, group: int, num_blocks: int) -> None:
        self.allocated[group] += num_blocks
        self.held[group] += num_blocks
        self.peak[group] = max(self.peak[group], self.held[group])


def block_allocated(timeline, e: BlockAllocate) -> None:
    """The request timeline's fold of a BlockAllocate: its prefix-cache figures are the first group's."""
    if not e.group:
        type(timeline)._allocated(timeline, e)


# what the request timeline folds of the groups (timeline.py); the per-group figures are a pass of their own
FOLD = {BlockAllocate: block_allocated}


def kv_group_figures(timeline, source) -> list[KVGroupFigures] | None:
    """Each group's figures of a hybrid model's trace (None for one group): its block events counted
    in a pass of their own over `source` (a path, read again, or a list of events), so a one-group
    trace's fold does no more than before; None where the events cannot be read again (an iterator)."""
    header = timeline.header
    if header is None or not header.config.get("kv_cache_groups"):
        return None
    return pass_over(source, lambda events: _count(header, events))


def pass_over(source, count):
    """`count(events)` of a trace's events read again (`source`: a path, or a list of events);
    None where they cannot be (an iterator): the figures a pass of their own gives."""
    if isinstance(source, (str, os.PathLike)):
        from tracengine.trace.tracelog import TraceReader
        with TraceReader(source) as reader:
            return count(reader.events())
    return count(source) if isinstance(source, (list, tuple)) else None


def _count(header, events) -> list[KVGroupFigures]:
    record = GroupCounts(header)
    for e in events:
        t = type(e)
        if t is BlockAllocate:
            record.gained(e.group, len(e.block_ids))
            record.hits[e.group] += e.num_cached_blocks
        elif t is BlockAppend:
            record.gained(e.group, 1)
        elif t is BlockFree or t is BlockSkip:
            (record.freed if t is BlockFree else record.skipped)[e.group] += len(e.block_ids)
            record.held[e.group] -= len(e.block_ids)
    return [KVGroupFigures(group=g, spec=spec, sliding_window=record.windows[g],
                           num_allocated_blocks=record.allocated[g], num_hit_blocks=record.hits[g],
                           num_skipped_blocks=record.skipped[g], num_freed_blocks=record.freed[g],
                           peak_blocks=record.peak[g])
            for g, spec in enumerate(record.specs)]


def kv_group_lines(stats) -> list[tuple[str, str]]:
    """`stats`' table rows, a group each (none for one group)."""
    rows = []
    for g in stats.kv_groups or ():
        window = f", window {g.sliding_window}" if g.sliding_window else ""
        rows.append((f"KV group {g.group}", f"{g.spec}{window}: {g.num_allocated_blocks:,} blocks given "
                                            f"({g.num_hit_blocks:,} hits), {g.num_skipped_blocks:,} given back "
                                            f"running, {g.num_freed_blocks:,} freed; peak {g.peak_blocks:,} held"))
    return rows
