"""The first step where two traces schedule differently. Scheduling is the
ScheduleDecision, Preempt, Block* and SpecDecode events and the CPU tier's (CpuStore with its
evictions, CpuHit, CpuLoad), compared without wall-clock fields (a load's link times among
them); token ids, arrivals and timings do not count."""
from dataclasses import dataclass, field

from tracengine.analysis.stats import stats
from tracengine.analysis.timeline import RequestTimeline
from tracengine.engine.config import Config, recorded_block_rules

from tracengine.trace.events import (BlockAllocate, BlockAppend, BlockFree, BlockHash, CpuHit, CpuLoad, CpuStore,
                                     DraftProposed, DraftVerified, Preempt, PromptBlocksHashed, RequestAdded,
                                     ScheduleDecision, SpecDecode)
from tracengine.trace.views import without_wall_clock
from tracengine.engine.hash_id_prompt import hashed_blocks
from tracengine.trace.tracelog import split_header
from tracengine.trace.views import iter_steps

# speculative decoding's: how many drafts a sequence got and kept (a draft's token id, as any, does not
# count); a vLLM step's SpecDecode: the drafts it verified, which its ScheduledSeqs count; the CPU tier's
SCHEDULING_TYPES = (ScheduleDecision, Preempt, BlockAllocate, BlockAppend, BlockHash, PromptBlocksHashed, BlockFree,
                    DraftProposed, DraftVerified, SpecDecode, CpuStore, CpuHit, CpuLoad)


@dataclass
class TraceDiff:
    step: int | None                        # the first differing step; None when none differs
    a_events: list = field(default_factory=list)   # that step's events on each side ([] past its end)
    b_events: list = field(default_factory=list)
    index: int = -1                         # of the first differing scheduling event within the step
    a_stats: dict = field(default_factory=dict)    # stats() of each side: `tracengine stats` of each trace
    b_stats: dict = field(default_factory=dict)
    config_changes: list = field(default_factory=list)   # (field, a, b)
    workload_difference: str | None = None  # how the two workloads differ (workload_difference); None: the same

    @property
    def identical(self) -> bool:
        return self.step is None


def scheduling_events(events) -> list:
    """The scheduling events of `events`, a PromptBlocksHashed as the BlockHash events it stands for:
    a trace older than format 7 recorded those, and the same run is the same either way."""
    out = []
    for e in events:
        if type(e) is PromptBlocksHashed:
            out += hashed_blocks(e)
        elif isinstance(e, SCHEDULING_TYPES):
            out.append(e)
    return out


def scheduling_key(events) -> list[tuple]:
    return [without_wall_clock(e) if type(e) is not DraftProposed else ("DraftProposed", e.step, e.seq_id,
                                                                          e.num_draft_tokens)
            for e in scheduling_events(events)]


def header_config(header) -> dict:
    """A trace header's config, a field an older trace lacks read as its Config default (what
    `replay` and what-if run it with: a format-1 trace's policy is prefill_first, and every trace
    before `block_rules` ran nano-vllm's)."""
    return {**Config().to_dict(), **header.config, "block_rules": recorded_block_rules(header.config)}


def diff_traces(a, b) -> TraceDiff:
    """Compare two event streams (TraceHeader first), step by step."""
    (header_a, a), (header_b, b) = split_header(a), split_header(b)
    result = TraceDiff(None)
    config_a, config_b = header_config(header_a), header_config(header_b)
    result.config_changes = [(name, config_a.get(name), config_b.get(name)) for name in {**config_a, **config_b}
                             if config_a.get(name) != config_b.get(name)]
    timeline_a, timeline_b = RequestTimeline(header_a), RequestTimeline(header_b)
    steps_a, steps_b = iter_steps(a), iter_steps(b)
    requests_a, requests_b = {}, {}
    step = 0
    while True:
        group_a, group_b = next(steps_a, None), next(steps_b, None)
        if group_a is None and group_b is None:
            break
        for e in group_a or ():
            timeline_a.add(e)
            if type(e) is RequestAdded:
                requests_a[e.seq_id] = request_key(e)
        for e in group_b or ():
            timeline_b.add(e)
            if type(e) is RequestAdded:
                requests_b[e.seq_id] = request_key(e)
        if result.step is None:
            key_a, key_b = scheduling_key(group_a or ()), scheduling_key(group_b or ())
            if key_a != key_b:
                result.step = step
                result.a_events, result.b_events = group_a or [], group_b or []
                result.index = next((i for i, (x, y) in enumerate(zip(key_a, key_b)) if x != y),
                                    min(len(key_a), len(key_b)))
        step += 1
    result.a_stats, result.b_stats = stats(timeline_a), stats(timeline_b)
    result.workload_difference = workload_difference(requests_a, requests_b)
    return result


def request_key(e: RequestAdded) -> tuple:
    """What a request asks for: its prompt (its length, whether it is known by hash ids, and a hash
    of them: a long trace's prompts are not kept) and its max_tokens."""
    if e.prompt_hash_ids:
        prompt = (e.num_hash_id_prompt_tokens, True, hash((*e.prompt_hash_ids, e.hash_id_block_tokens)))
    else:
        prompt = (len(e.prompt_token_ids), False, hash(tuple(e.prompt_token_ids)))
    return prompt, e.max_tokens


def workload_difference(a: dict, b: dict) -> str | None:
    """How two traces' requests (request_key by seq_id) differ, by the first request that does; None
    when they are the same. A prompt known by hash ids on one side and by tokens on the other (a
    simulation and a run of one workload file) is compared by its length only."""
    if a.keys() != b.keys():
        first = min(a.keys() ^ b.keys())
        return f"a has {len(a)} requests, b {len(b)}; request s{first} is only in {'a' if first in a else 'b'}"
    for seq_id in sorted(a):
        (prompt_a, max_tokens_a), (prompt_b, max_tokens_b) = a[seq_id], b[seq_id]
        if prompt_a[0] != prompt_b[0]:
            return f"request s{seq_id}'s prompt differs (a: {prompt_a[0]} tokens, b: {prompt_b[0]})"
        if prompt_a[1] == prompt_b[1] and prompt_a[2] != prompt_b[2]:
            return f"request s{seq_id}'s prompt differs (both {prompt_a[0]} tokens, not the same ones)"
        if max_tokens_a != max_tokens_b:
            return f"request s{seq_id}'s max_tokens differs (a: {max_tokens_a}, b: {max_tokens_b})"
    return None
