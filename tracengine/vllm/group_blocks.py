"""The block events of a hybrid model's KV cache groups (a full-attention group beside sliding-window
or Mamba groups, vLLM's hybrid coordinator over one block pool): each group's blocks, named by
their group (the `group` field of BlockAllocate, BlockAppend and BlockFree; 0 is the first group,
whose events are as a one-group model's).

vLLM's managers change a request's blocks per group inside the KV cache manager's calls:
`allocate_slots` first gives back what a group no longer needs (a sliding window's blocks that fell
out of the window, a Mamba group's older state blocks: `remove_skipped_blocks`, even where the
allocation then fails), then adds prefix-cache hits and new blocks to each group; `free` frees
every group's blocks, group by group. So each call is recorded by what it changed in each group's
table of the request (its held blocks before and after; vLLM's null block, a skipped place, is no
block): blocks it left are a BlockSkip (BlockFree at `free`), blocks it gained a BlockAllocate
(admission: the hits first) or a BlockAppend each. A Mamba block moved within the table (vLLM
relocates a speculative state block) is held before and after: no event.

The one-group recorder (step_recorder.py) reads the calls' results; this is for several groups
only, so a one-group model's recording does no more work than before."""
from tracengine.trace.events import BlockAllocate, BlockAppend, BlockFree
from tracengine.trace.vllm_events import BlockSkip


def num_groups(scheduler) -> int:
    return len(scheduler.kv_cache_config.kv_cache_groups)


def observe_groups(recorder) -> None:
    """Records every group's blocks in place of the first group's (a scheduler of several groups)."""
    manager = recorder.scheduler.kv_cache_manager
    managers = manager.coordinator.single_type_managers

    def tables(req_id: str) -> list[list[int]]:
        """Each group's blocks held by the request, in table order (skipped places left out)."""
        found = []
        for group in managers:
            blocks = group.req_to_blocks.get(req_id)
            found.append([b.block_id for b in blocks if not b.is_null] if blocks else [])
        return found

    def allocate_slots(request, num_new_tokens, *args, **kwargs):
        admitting = request.status in recorder.admitted_from
        before = tables(request.request_id)
        new_blocks = recorder._allocate_slots(request, num_new_tokens, *args, **kwargs)
        recorder.by_request = request
        after = tables(request.request_id)
        seq_id, step = recorder.seq_id(request), recorder.current_step()
        for group, (held, now) in enumerate(zip(before, after)):
            kept = set(now)
            skipped = [b for b in reversed(held) if b not in kept]     # vLLM frees them last place first
            if skipped:
                recorder.emit(BlockSkip(step, seq_id, skipped, group))
        if new_blocks is None:
            if admitting:      # as the one-group recorder says it: the first group's need
                hits = kwargs.get("new_computed_blocks")
                num_hits = len(hits.blocks[0]) if hits is not None else 0
                recorder.blocked_seq_id = seq_id
                recorder.num_blocks_needed = -(-request.num_tokens // recorder.scheduler.block_size) - num_hits
            return None
        hits = kwargs.get("new_computed_blocks") if admitting else None
        for group, (held, now) in enumerate(zip(before, after)):
            had = set(held)
            gained = [b for b in now if b not in had]
            if admitting:
                hit_ids = {b.block_id for b in hits.blocks[group]} if hits is not None else set()
                num_hits = sum(1 for b in gained if b in hit_ids)
                if gained or group == 0:
                    recorder.emit(BlockAllocate(step, seq_id, gained, num_hits, group))
            else:
                for block_id in gained:
                    recorder.emit(BlockAppend(step, seq_id, block_id, group))
        return new_blocks

    def free(request):
        before = tables(request.request_id)
        recorder._free(request)
        step, seq_id = recorder.current_step(), recorder.seq_id(request)
        for group, held in enumerate(before):
            if held:
                recorder.emit(BlockFree(step, seq_id, held[::-1], group))

    manager.allocate_slots, manager.free = allocate_slots, free
