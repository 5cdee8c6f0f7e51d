"""tracengine's `mixed` policy and vLLM's own scheduler on the same workload,
step by step (docs/policies.md, benchmarks/bench_mixed_vs_vllm.py): the same
prompts, output lengths and arrival steps through tracengine's engine with
the `mixed` policy (no model) and through vLLM's Scheduler (drive.py), fcfs,
`long_prefill_token_threshold=0`, the same budget, `max_num_seqs`, block
size and prefix caching; tracengine gets N-1 blocks where vLLM gets N (vLLM's
block 0 is its null block, so its block b is tracengine's b - 1). A workload
is a list of (prompt token ids, max_tokens, arrival step)."""
from tracengine.trace.events import BlockAllocate, BlockAppend, BlockFree, ListSink, Preempt, ScheduleDecision


def decisions(events) -> list[dict[int, int]]:
    """Each step's batch: seq_id -> tokens."""
    return [{s.seq_id: s.num_tokens for s in e.seqs} for e in events if type(e) is ScheduleDecision]


def block_steps(events, first_block_id: int = 0) -> list[list[tuple]]:
    """Each step's block events (allocations with their hits, appends, frees, preemptions) as
    tuples, block ids counted from `first_block_id` (1 for vLLM's: its block 0 is the null block)."""
    steps: dict[int, list[tuple]] = {e.step: [] for e in events if type(e) is ScheduleDecision}
    for e in events:
        t = type(e)
        if t is BlockAllocate:
            steps[e.step].append(("alloc", e.seq_id, [b - first_block_id for b in e.block_ids], e.num_cached_blocks))
        elif t is BlockAppend:
            steps[e.step].append(("append", e.seq_id, e.block_id - first_block_id))
        elif t is BlockFree and e.step in steps:
            steps[e.step].append(("free", e.seq_id, [b - first_block_id for b in e.block_ids]))
        elif t is Preempt:
            steps[e.step].append(("preempt", e.seq_id, e.by_seq_id))
    return [steps[step] for step in sorted(steps)]


def run_mixed(work, num_blocks: int, budget: int, max_num_seqs: int, prefix_caching: bool = True,
              block_rules: str = "auto") -> list:
    from tracengine.engine.config import Config
    from tracengine.engine.request import Request
    from tracengine.sim.runners import run_workload
    config = Config(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, kvcache_block_size=16,
                    num_kvcache_blocks=num_blocks - 1, max_model_len=4096, scheduling_policy="mixed",
                    enable_prefix_caching=prefix_caching, block_rules=block_rules)
    return run_workload(config, [Request(p, m, arrival_step=a, ignore_eos=True) for p, m, a in work])


def run_vllm(work, num_blocks: int, budget: int, max_num_seqs: int, prefix_caching: bool = True) -> list:
    from tracengine.vllm.build import build_scheduler, default_config
    from tracengine.vllm.drive import RequestSpec, run
    scheduler = build_scheduler(default_config(num_gpu_blocks=num_blocks, max_num_batched_tokens=budget,
                                               max_num_seqs=max_num_seqs, enable_prefix_caching=prefix_caching))
    sink = ListSink()
    scheduler.record_to(sink)
    run(scheduler, [RequestSpec(f"r{i}", p, m, arrival_step=a) for i, (p, m, a) in enumerate(work)])
    return sink.events


def agreement(mixed_events, vllm_events) -> dict:
    """Steps of each, preemptions of each, the share of steps with the same batch (over the
    shorter run), the first step whose batches differ (None: none), and the same two for the
    steps' block events, vLLM's block ids less one."""
    a, b = decisions(mixed_events), decisions(vllm_events)
    same = [x == y for x, y in zip(a, b)]
    same_blocks = [x == y for x, y in zip(block_steps(mixed_events), block_steps(vllm_events, 1))]
    return {"num_steps": (len(a), len(b)),
            "num_preemptions": tuple(sum(1 for e in evs if type(e) is Preempt) for evs in (mixed_events, vllm_events)),
            "agree": sum(same) / len(same), "first_difference": next((i for i, ok in enumerate(same) if not ok), None),
            "agree_blocks": sum(same_blocks) / len(same_blocks),
            "first_block_difference": next((i for i, ok in enumerate(same_blocks) if not ok), None)}
