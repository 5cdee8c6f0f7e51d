"""Every event, step and folded state as text: one module, one notation.
`tracengine events` lists events with `format_event`, the step tables that
snapshot tests pin and `tracengine render` prints are `render_steps`, the
divergence report of `replay` and `diff` uses both, `replay --state` is
`render_state`, and the TUI's event list is `describe_event`.

One notation for a sequence in a step: `s3:4@16` is seq 3 computing 4 tokens
with 16 already in the KV cache (`@16` left out when none is); a decode step
computes one token per sequence, `s3:1@20`. Lists longer than 12 items show
the first 12 and how many more."""
import msgspec

from tracengine.analysis import sglang_decisions
from tracengine.analysis.vllm_inputs import step_items
from tracengine.trace.sglang_events import SGLANG_EVENTS
from tracengine.trace.vllm_events import VLLM_INPUT_EVENTS, BlockSkip
from tracengine.trace.events import (WALL_CLOCK_FIELDS, BlockAllocate, BlockAppend, BlockFree, BlockHash,
                                     DraftProposed, DraftVerified, Preempt, PromptBlocksHashed, RequestAdded,
                                     ScheduleDecision, ScheduledSeq, SeqAbort, SeqFinish, SpecAccepted, SpecDecode,
                                     SpecDraft, StepEnd, TokenSample, TraceHeader)
from tracengine.trace.views import iter_steps
from tracengine.trace.header import VLLM, backend_of

SCHEDULING_CONFIG = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "kvcache_block_size",
                     "num_kvcache_blocks", "eos")
VLLM_SCHEDULING_CONFIG = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "block_size", "num_gpu_blocks",
                          "enable_prefix_caching", "policy", "long_prefill_token_threshold")

LEGEND = "# step phase seq:tokens[@cached] | stop_reason | arrivals, blocks, preemptions, finishes | free blocks"
MAX_LIST_ITEMS = 12   # longer lists are shortened (`events --json` prints all)


def id_ranges(ids) -> str:
    """[0, 1, 2, 3, 7, 8] -> '0-3 7 8': runs of three or more ascending ids collapse."""
    parts, i, ids = [], 0, list(ids)
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ids[i]}-{ids[j]}")
        else:
            parts.extend(str(x) for x in ids[i:j + 1])
        i = j + 1
    return " ".join(parts)


def format_scheduled(s: ScheduledSeq) -> str:
    """The notation of a scheduled sequence: `s3:4@16`, or `s3:4` with nothing cached."""
    return f"s{s.seq_id}:{s.num_tokens}" + (f"@{s.num_cached_tokens}" if s.num_cached_tokens else "")


def format_value(value) -> str:
    if isinstance(value, ScheduledSeq):
        return format_scheduled(value)
    if isinstance(value, msgspec.Struct):
        return "(" + " ".join(f"{k}={format_value(getattr(value, k))}" for k in value.__struct_fields__) + ")"
    if isinstance(value, list):
        shown = [format_value(v) for v in value[:MAX_LIST_ITEMS]]
        more = f" ...{len(value) - MAX_LIST_ITEMS} more" if len(value) > MAX_LIST_ITEMS else ""
        return "[" + " ".join(shown) + more + "]"
    if isinstance(value, dict):
        return "{" + " ".join(f"{k}={format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def format_event(event, wall_clock: bool = True) -> str:
    """One line: the step, the type and the fields (without the wall-clock
    ones, which a replay does not compare, when `wall_clock` is false)."""
    if event is None:
        return "(none)"
    step = getattr(event, "step", "-")
    fields = " ".join(f"{name}={format_value(getattr(event, name))}" for name in event.__struct_fields__
                      if name != "step" and (wall_clock or name not in WALL_CLOCK_FIELDS)
                      and not (name == "group" and event.group == 0))     # a block's KV cache group, named past the first
    return f"{step:>6}  {type(event).__name__:<16}  {fields}"


def render_step(events) -> str:
    """One line for one step's events: a row of the step table."""
    step, decision, end = None, None, None
    arrived, allocs, appended, hashed, preempts, finishes, kept, drafted = [], [], {}, {}, [], [], [], []
    skipped = []
    inputs: dict[str, list[str]] = {}
    verified = []
    for e in events:
        t = type(e)
        if t is TraceHeader:
            continue
        step = e.step
        if t is ScheduleDecision:
            decision = e
        elif t is RequestAdded:
            arrived.append(f"s{e.seq_id}:{e.num_prompt_tokens}")
        elif t is BlockAllocate:
            hits, new = e.block_ids[:e.num_cached_blocks], e.block_ids[e.num_cached_blocks:]
            blocks = ", ".join(part for part in (f"hit {id_ranges(hits)}" if hits else "", id_ranges(new)) if part)
            allocs.append(f"s{e.seq_id}{group_label(e)}[{blocks}]")
        elif t is BlockAppend:       # a chunk's slots (vLLM's block rules) may take several blocks
            appended.setdefault(f"{e.seq_id}{group_label(e)}" if e.group else e.seq_id, []).append(e.block_id)
        elif t is BlockSkip:         # a hybrid model's sliding window or Mamba group gives blocks back
            skipped.append(f"s{e.seq_id}{group_label(e)}-[{id_ranges(e.block_ids)}]")
        elif t is BlockHash:
            hashed.setdefault(e.seq_id, []).append(e.block_id)
        elif t is PromptBlocksHashed:
            hashed.setdefault(e.seq_id, []).extend(e.block_ids)
        elif t is Preempt:
            by = "self" if e.by_seq_id == e.seq_id else f"by s{e.by_seq_id}"
            preempts.append(f"s{e.seq_id}({by}, recompute {e.num_computed_tokens})")
        elif t is SeqFinish:
            finishes.append(f"s{e.seq_id}:{e.reason}")
        elif t is DraftVerified:     # drafts kept of those verified
            kept.append(f"s{e.seq_id}:{e.num_accepted_tokens}/{e.num_draft_tokens}")
        elif t is DraftProposed:
            drafted.append(f"s{e.seq_id}:{e.num_draft_tokens}")
        elif t is SpecDraft:         # vLLM's scheduler: drafts given, verified, accepted
            drafted.append(f"s{e.seq_id}:{len(e.token_ids)}")
        elif t is SpecDecode:
            verified += [f"s{s}:{n}" for s, n in zip(e.seq_ids, e.num_spec_tokens)]
        elif t is SpecAccepted:
            kept += [f"s{s}:{n}" for s, n in zip(e.seq_ids, e.num_accepted)]
        elif t is SeqAbort:
            finishes.append(f"s{e.seq_id}:abort({e.reason})")
        elif t is StepEnd:
            end = e
        elif t in VLLM_INPUT_EVENTS and (item := step_items(e)) is not None:    # a connector's, a grammar's
            inputs.setdefault(item[0], []).append(item[1])
        elif t in SGLANG_EVENTS and (item := sglang_decisions.step_item(e)) is not None:   # SGLang's order, stop
            inputs.setdefault(item[0], []).append(item[1])
    if decision is None:
        head = f"{step if step is not None else '?':>4} (no step yet)"
    else:
        seqs = " ".join(format_scheduled(s) for s in decision.seqs)
        if decision.phase == "mixed":       # its decodes first, then " + " its prefill sequences
            n = decision.num_decode_seqs
            seqs = " ".join(format_scheduled(s) for s in decision.seqs[:n]) + " + " + " ".join(
                format_scheduled(s) for s in decision.seqs[n:])
        stop, blocked = decision.stop_reason, decision.blocked_seq_id
        if blocked != -1 and decision.phase == "decode":       # prefill found nothing: its head did not fit
            stop += f" (waiting s{blocked} needs {decision.num_blocks_needed} free)"
        elif blocked != -1 and stop == "no_free_blocks":
            stop += f"(s{blocked} needs {decision.num_blocks_needed} free)"
        elif blocked != -1:
            stop += f"(s{blocked})"
        head = f"{decision.step:>4} {decision.phase:<7} {seqs} | {stop}"
    segments = [f"{label} {' '.join(items)}" for label, items in (
        ("arrive", arrived), ("alloc", allocs),
        ("append", [f"s{sid}+{ids[0]}" if len(ids) == 1 else f"s{sid}+[{id_ranges(ids)}]"
                    for sid, ids in appended.items()]),
        ("hashed", [f"s{sid}[{id_ranges(ids)}]" for sid, ids in hashed.items()]), ("skip", skipped),
        ("preempt", preempts), ("finish", finishes), ("verify", verified), ("kept", kept), ("draft", drafted),
        *inputs.items()) if items]
    line = head + (" | " + "; ".join(segments) if segments else "")
    return line + (f" | free {end.num_free_blocks}" if end is not None else "")


def render_header(header: TraceHeader) -> str:
    config = header.config
    if backend_of(header) == VLLM:
        return f"# vLLM {header.engine_version} ({config.get('scheduler_kind')}): " + " ".join(
            f"{name}={config.get(name)}" for name in VLLM_SCHEDULING_CONFIG)
    policy = config.get("scheduling_policy", "prefill_first")     # named when it is not the default
    spec = config.get("num_speculative_tokens", 0)      # named when drafting
    return "# config: " + " ".join(f"{name}={config.get(name)}" for name in SCHEDULING_CONFIG) + (
        f" scheduling_policy={policy}" if policy != "prefill_first" else "") + (
        f" num_speculative_tokens={spec} speculative_method={config.get('speculative_method')}" if spec else "")


def render_steps(events, steps: tuple[int, int | None] | None = None, seq_id: int | None = None) -> str:
    """The step table: a config line, a legend, then one line per step. `steps`
    (start, stop) keeps steps start..stop-1 (stop None: to the end); `seq_id`
    keeps the steps with an event of that sequence."""
    lines = []
    events = iter(events)
    first = next(events, None)
    if isinstance(first, TraceHeader):
        lines.append(render_header(first))
        groups = iter_steps(events)
    else:
        groups = iter_steps([first, *events] if first is not None else [])
    lines.append(LEGEND)
    for group in groups:
        step = group[-1].step
        if steps is not None and (step < steps[0] or (steps[1] is not None and step >= steps[1])):
            continue
        if seq_id is not None and not any(involves_seq(e, seq_id) for e in group):
            continue
        lines.append(render_step(group))
    return "\n".join(lines) + "\n"


def involves_seq(event, seq_id: int) -> bool:
    """The event names the sequence: its own, the one it gave way to, scheduled or blocked."""
    if getattr(event, "seq_id", None) == seq_id or getattr(event, "by_seq_id", None) == seq_id:
        return True
    seqs = getattr(event, "seqs", ())
    return getattr(event, "blocked_seq_id", None) == seq_id or any(s.seq_id == seq_id for s in seqs)


def render_state(state, when: str | None = None) -> str:
    """A folded (or live) state: queues with counters, block tables, the block pool.
    `when` replaces "after step N" (a live state caught in the middle of a step)."""
    if when is None:
        when = "before the first step" if state.step < 0 else f"after step {state.step}"
    lines = [f"state {when}: {len(state.waiting)} waiting, {len(state.running)} running, "
             f"{state.num_free_blocks} of {state.num_blocks} blocks free (block size {state.block_size})"]
    if state.decision is not None:
        d = state.decision
        lines.append(f"decision: {d.phase}, {d.num_batched_tokens} tokens, stop {d.stop_reason}")
    queues = [("waiting", state.waiting), ("running", state.running)]
    if state.in_flight:
        queues.append(("in flight (out of the queues in the middle of the step)", state.in_flight))
    for name, ids in queues:
        lines.append(f"{name}:" + ("" if ids else " (empty)"))
        for seq_id in ids:
            s = state.seqs[seq_id]
            lines.append(f"  s{s.seq_id:<4} tokens {s.num_tokens} (prompt {s.num_prompt_tokens}), cached "
                         f"{s.num_cached_tokens}, scheduled {s.num_scheduled_tokens}, preempted {s.num_preemptions}, "
                         f"blocks [{id_ranges(s.block_table)}]"
                         + (f", drafts {format_value(s.draft_token_ids)}" if s.draft_token_ids else ""))
    finished = [s for s in state.seqs.values() if s.status == "finished"]
    if finished:
        lines.append(f"finished ({len(finished)}): " + " ".join(
            f"s{s.seq_id}:{s.finish_reason}@{s.finish_step}" for s in sorted(finished, key=lambda s: s.seq_id)))
    lines.append("blocks in use or holding a hash (id, ref count, hash, owners):")
    for b in state.blocks:
        if b.ref_count or b.hash != -1:
            h = f"{b.hash:016x}" if b.hash != -1 else "-"
            owners = " ".join(f"s{o}" for o in b.owners) or "-"
            cached = "" if state.hash_to_block_id.get(b.hash) == b.block_id or b.hash == -1 else " (hash superseded)"
            lines.append(f"  {b.block_id:>5} ref {b.ref_count} hash {h} {owners}{cached}")
    lines.append(f"free list ({state.num_free_blocks}, next first): {id_ranges(state.free_block_ids)}")
    lines.append(f"prefix-cache entries: {len(state.hash_to_block_id)}")
    return "\n".join(lines) + "\n"


def group_label(e) -> str:
    """A block event's KV cache group in a step table ("" for the first: a one-group trace reads as before)."""
    return f"/g{e.group}" if e.group else ""


def group_words(e) -> str:
    return f" in KV cache group {e.group}" if e.group else ""


def describe_event(e) -> str:
    """One event in words: a line of the TUI's event list (its step and type are shown beside it)."""
    match e:
        case RequestAdded():
            return f"seq {e.seq_id} arrives: {e.num_prompt_tokens} prompt tokens, max_tokens {e.max_tokens}"
        case ScheduleDecision():
            return f"{e.phase} {e.num_batched_tokens} tokens {format_value(e.seqs)} stop={e.stop_reason}"
        case BlockAllocate():
            cached = f" ({e.num_cached_blocks} cached)" if e.num_cached_blocks else ""
            return f"seq {e.seq_id} gets blocks {format_value(e.block_ids)}{cached}{group_words(e)}"
        case BlockAppend():
            return f"seq {e.seq_id} gets block {e.block_id}{group_words(e)}"
        case BlockSkip():
            return f"seq {e.seq_id} gives back blocks {format_value(e.block_ids)}{group_words(e)} (out of its window)"
        case BlockHash():
            return f"seq {e.seq_id} fills block {e.block_id}, hash {e.hash & 0xFFFFFFFF:08x}"
        case PromptBlocksHashed():
            return (f"seq {e.seq_id} fills blocks {format_value(e.block_ids)} of its prompt (from its block "
                    f"{e.first_block}), hashes from hash ids {format_value(e.hash_ids)}")
        case BlockFree():
            return f"seq {e.seq_id} frees blocks {format_value(e.block_ids)}{group_words(e)}"
        case Preempt():
            who = "itself" if e.by_seq_id == e.seq_id else f"seq {e.by_seq_id}"
            return (f"seq {e.seq_id} preempted for {who}: frees {format_value(e.freed_block_ids)}, "
                    f"{e.num_computed_tokens} tokens to recompute")
        case TokenSample():
            return f"seq {e.seq_id} samples {e.token_id}" + ("" if e.kept else " (dropped: middle chunk)")
        case SeqFinish():
            return f"seq {e.seq_id} finishes ({e.reason}): {e.num_prompt_tokens} + {e.num_completion_tokens} tokens"
        case SeqAbort():
            return (f"seq {e.seq_id} aborted ({e.reason}) from {e.status}: "
                    f"{e.num_prompt_tokens} + {e.num_completion_tokens} tokens")
        case StepEnd():
            return f"{e.num_free_blocks} blocks free"
        case DraftProposed():
            tokens = f": {format_value(e.draft_token_ids)}" if e.draft_token_ids else " (synthetic)"
            return f"seq {e.seq_id} gets {e.num_draft_tokens} drafts for its next step{tokens}"
        case DraftVerified():
            return f"seq {e.seq_id} keeps {e.num_accepted_tokens} of its {e.num_draft_tokens} drafts"
        case SpecDraft():
            return f"seq {e.seq_id} is given drafts {format_value(e.token_ids)}"
        case SpecDecode():
            return "verifies " + ", ".join(f"seq {s}'s {n}" for s, n in zip(e.seq_ids, e.num_spec_tokens)) + " drafts"
        case SpecAccepted():
            return "accepted: " + ", ".join(f"seq {s} {n}" for s, n in zip(e.seq_ids, e.num_accepted))
    if type(e) in SGLANG_EVENTS:
        return sglang_decisions.describe(e)
    return " ".join(f"{name}={format_value(getattr(e, name))}" for name in e.__struct_fields__ if name != "step")
