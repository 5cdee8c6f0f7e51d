"""A live vLLM scheduler in tracengine's terms (a FoldState): what a replay
shows of the replaying scheduler where it diverged."""
from tracengine.replay.state import RUNNING, WAITING, FoldState, SeqState


def live_vllm_state(scheduler, step: int, seq_ids: dict[str, int]) -> FoldState:
    """`seq_ids`: the recorder's request id -> seq_id."""
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    seqs: dict[int, SeqState] = {}

    def seq_state(request, status: str) -> int:
        seq_id = seq_ids[request.request_id]
        seqs[seq_id] = SeqState(seq_id, status, request.num_prompt_tokens, request.num_tokens,
                                request.num_computed_tokens, block_table=list(manager.get_block_ids(
                                    request.request_id)[0]), num_preemptions=request.num_preemptions)
        return seq_id

    waiting = [seq_state(r, WAITING) for r in (*scheduler.waiting, *scheduler.kv_holding_waiting)]
    running = [seq_state(r, RUNNING) for r in scheduler.running]
    ref_counts = [block.ref_cnt for block in pool.blocks]
    free_block_ids = [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]
    return FoldState(step, waiting, running, seqs, ref_counts, [-1] * len(ref_counts), free_block_ids, {}, None,
                     scheduler.block_size)
