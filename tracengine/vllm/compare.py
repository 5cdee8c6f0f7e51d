"""tracengine's `mixed` policy and vLLM's own scheduler on the same workload,
step by step (docs/policies.md, benchmarks/bench_mixed_vs_vllm.py): the same
prompts, output lengths and arrival steps through tracengine's engine with
the `mixed` policy (no model) and through vLLM's Scheduler (drive.py), fcfs,
`long_prefill_token_threshold=0`, the same budget, `max_num_seqs`, block
size and prefix caching; tracengine gets N-1 blocks where vLLM gets N (vLLM's
block 0 is its null block, so its block b is tracengine's b - 1). A workload
is a list of (prompt token ids, max_tokens, arrival step).

With speculative decoding (`run_mixed_spec`, `run_vllm_spec`) both sides get the same drafts
(tracengine's ngram proposer's, fed to vLLM's scheduler after each step as its engine core feeds
its drafter's) and the same model tokens (`pattern_token`), against which each keeps the drafts
that agree: what is compared is how each schedules them."""
from tracengine.trace.events import BlockAllocate, BlockAppend, BlockFree, Preempt, ScheduleDecision
from tracengine.trace.sinks import ListSink


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


SPEC_PROPOSER = dict(method="ngram", prompt_lookup_min=1, prompt_lookup_max=3)


def pattern_token(seq_id: int, index: int) -> int:
    """The model's token at a request's completion index `index`: a repeating phrase of 3 to 6
    tokens, every 11th token off it (a draft from the phrase is then rejected)."""
    if index % 11 == 10:
        return 150 + (seq_id + index) % 7
    return 100 + index % (3 + seq_id % 4)


class PatternRunner:
    """tracengine's runner of `pattern_token`: a sequence's token after its step (a middle chunk's is
    dropped), or at each position of a step that verifies drafts."""

    def run(self, seqs, is_prefill):
        out = []
        for seq in seqs:
            n = seq.num_completion_tokens
            if seq.spec_token_ids:
                out.append([pattern_token(seq.seq_id, n + j) for j in range(len(seq.spec_token_ids) + 1)])
            else:
                out.append(pattern_token(seq.seq_id, n))
        return out

    def exit(self):
        pass


def run_mixed_spec(work, num_blocks: int, budget: int, max_num_seqs: int, num_speculative_tokens: int) -> list:
    from tracengine.engine.config import Config
    from tracengine.engine.request import Request
    from tracengine.sim.runners import run_workload
    config = Config(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, kvcache_block_size=16,
                    num_kvcache_blocks=num_blocks - 1, max_model_len=4096, scheduling_policy="mixed",
                    num_speculative_tokens=num_speculative_tokens, speculative_method="ngram",
                    prompt_lookup_min=SPEC_PROPOSER["prompt_lookup_min"],
                    prompt_lookup_max=SPEC_PROPOSER["prompt_lookup_max"])
    return run_workload(config, [Request(p, m, arrival_step=a, ignore_eos=True) for p, m, a in work], PatternRunner())


def run_vllm_spec(work, num_blocks: int, budget: int, max_num_seqs: int, num_speculative_tokens: int,
                  mixed_events: list) -> list:
    """vLLM's scheduler with ngram speculative decoding, driven as its engine core drives it
    (schedule, the model's output, update_from_output, then update_draft_token_ids with the
    drafts of that step), the drafts those `mixed_events` proposed at the same step, the tokens
    `pattern_token`'s; a verify step keeps the drafts that agree with them and the next token."""
    from vllm.v1.outputs import DraftTokenIds
    from tracengine.trace.events import DraftProposed
    from tracengine.vllm.build import build_scheduler, default_config
    from tracengine.vllm.drive import Driver, RequestSpec, model_output, sampling_req_ids
    drafts: dict[int, dict[int, list[int]]] = {}
    for e in mixed_events:
        if type(e) is DraftProposed:
            drafts.setdefault(e.step, {})[e.seq_id] = list(e.draft_token_ids)
    scheduler = build_scheduler(default_config(num_gpu_blocks=num_blocks, max_num_batched_tokens=budget,
                                               max_num_seqs=max_num_seqs),
                                speculative=dict(SPEC_PROPOSER, num_speculative_tokens=num_speculative_tokens))
    sink = ListSink()
    scheduler.record_to(sink)
    specs = [RequestSpec(f"r{i}", p, m, arrival_step=a) for i, (p, m, a) in enumerate(work)]
    driver = Driver(scheduler, specs)
    pending = sorted(specs, key=lambda s: s.arrival_step)
    step = tick = 0
    while pending or scheduler.has_requests():
        if not scheduler.has_requests():
            tick = max(tick, pending[0].arrival_step)
        while pending and pending[0].arrival_step <= tick:
            driver.add(pending.pop(0))
        out = scheduler.schedule()
        tokens = {}
        for req_id in sampling_req_ids(scheduler, out):
            request, seq_id = scheduler.requests[req_id], driver.index[req_id]
            scheduled = out.scheduled_spec_decode_tokens.get(req_id, [])
            targets = [pattern_token(seq_id, request.num_output_tokens + j) for j in range(len(scheduled) + 1)]
            num_accepted = next((j for j, d in enumerate(scheduled) if d != targets[j]), len(scheduled))
            tokens[req_id] = targets[:num_accepted + 1]
        scheduler.update_from_output(out, model_output(out.num_scheduled_tokens, tokens))
        proposed = [(f"r{seq_id}", ids) for seq_id, ids in drafts.get(step, {}).items()]
        if proposed:
            scheduler.update_draft_token_ids(DraftTokenIds([r for r, _ in proposed], [ids for _, ids in proposed]))
        step += 1
        tick += 1
    return sink.events
