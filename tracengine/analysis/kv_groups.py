"""A hybrid model's KV cache groups in a vLLM trace (tracengine/vllm/group_blocks.py): per group, the
blocks its requests were given (hits among them), gave back while running (out of a sliding window,
older Mamba states) and freed, and the most it held at once. The request timeline folds the block
events here; a trace whose header names no groups (`kv_cache_groups`) keeps no record, and its
prefix-cache figures are as before: the first group's, as a hybrid trace's are."""
import json

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


def _groups(timeline) -> GroupCounts | None:
    """The timeline's record, made at its first block event from its header (None: one group)."""
    header = timeline.header
    found = getattr(timeline, "kv_groups", None)
    if found is None or found[0] is not header:
        groups = GroupCounts(header) if header is not None and header.config.get("kv_cache_groups") else None
        found = timeline.kv_groups = (header, groups)
    return found[1]


def block_allocated(timeline, e: BlockAllocate) -> None:
    if not e.group:              # the prefix-cache figures: the first group's (timeline.py)
        type(timeline)._allocated(timeline, e)
    record = _groups(timeline)
    if record is not None:
        record.gained(e.group, len(e.block_ids))
        record.hits[e.group] += e.num_cached_blocks


def block_appended(timeline, e: BlockAppend) -> None:
    record = _groups(timeline)
    if record is not None:
        record.gained(e.group, 1)


def block_freed(timeline, e: BlockFree) -> None:
    record = _groups(timeline)
    if record is not None:
        record.freed[e.group] += len(e.block_ids)
        record.held[e.group] -= len(e.block_ids)


def block_skipped(timeline, e: BlockSkip) -> None:
    record = _groups(timeline)
    if record is not None:
        record.skipped[e.group] += len(e.block_ids)
        record.held[e.group] -= len(e.block_ids)


FOLD = {BlockAllocate: block_allocated, BlockAppend: block_appended, BlockFree: block_freed,
        BlockSkip: block_skipped}


def kv_group_figures(timeline) -> list[KVGroupFigures] | None:
    found = getattr(timeline, "kv_groups", None)
    record = found[1] if found is not None else None
    if record is None:
        return None
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
