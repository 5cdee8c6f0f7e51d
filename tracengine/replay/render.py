"""Readable text for events, steps and folded states: the step table that
snapshot tests pin, the divergence report of `replay`, and `replay --state`."""
from tracengine.trace.events import (WALL_CLOCK_FIELDS, BlockAllocate, BlockAppend, BlockHash, Preempt, RequestAdded,
                               ScheduleDecision, ScheduledSeq, SeqAbort, SeqFinish, StepEnd, TraceHeader)
from tracengine.replay.fold import iter_steps

SCHEDULING_CONFIG = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "kvcache_block_size",
                     "num_kvcache_blocks", "eos")

LEGEND = "# step phase seq:tokens[@cached] | stop_reason | arrivals, blocks, preemptions, finishes | free blocks"


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


def _value(value) -> str:
    if isinstance(value, list) and value and isinstance(value[0], ScheduledSeq):
        return "[" + " ".join(f"s{s.seq_id}:{s.num_tokens}@{s.num_cached_tokens}" for s in value) + "]"
    if isinstance(value, list) and len(value) > 16:
        return "[" + ", ".join(map(str, value[:16])) + f", ... {len(value)} in all]"
    return repr(value)


def render_event(event) -> str:
    """One line: the type and every field a replay compares."""
    if event is None:
        return "(none)"
    fields = ", ".join(f"{name}={_value(getattr(event, name))}" for name in event.__struct_fields__
                       if name not in WALL_CLOCK_FIELDS)
    return f"{type(event).__name__}({fields})"


def render_step(events) -> str:
    """One line for one step's events."""
    step, decision, end = None, None, None
    arrived, allocs, appends, hashed, preempts, finishes = [], [], [], {}, [], []
    for e in events:
        t = type(e)
        if t is TraceHeader:
            continue
        step = e.step
        if t is ScheduleDecision:
            decision = e
        elif t is RequestAdded:
            arrived.append(f"s{e.seq_id}:{len(e.prompt_token_ids)}")
        elif t is BlockAllocate:
            hits, new = e.block_ids[:e.num_cached_blocks], e.block_ids[e.num_cached_blocks:]
            blocks = ", ".join(part for part in (f"hit {id_ranges(hits)}" if hits else "", id_ranges(new)) if part)
            allocs.append(f"s{e.seq_id}[{blocks}]")
        elif t is BlockAppend:
            appends.append(f"s{e.seq_id}+{e.block_id}")
        elif t is BlockHash:
            hashed.setdefault(e.seq_id, []).append(e.block_id)
        elif t is Preempt:
            by = "self" if e.by_seq_id == e.seq_id else f"by s{e.by_seq_id}"
            preempts.append(f"s{e.seq_id}({by}, recompute {e.num_computed_tokens})")
        elif t is SeqFinish:
            finishes.append(f"s{e.seq_id}:{e.reason}")
        elif t is SeqAbort:
            finishes.append(f"s{e.seq_id}:abort({e.reason})")
        elif t is StepEnd:
            end = e
    if decision is None:
        head = f"{step if step is not None else '?':>4} (no step yet)"
    else:
        seqs = " ".join(f"s{s.seq_id}:{s.num_tokens}" + (f"@{s.num_cached_tokens}" if decision.phase == "prefill"
                                                         and s.num_cached_tokens else "")
                        for s in decision.seqs)
        stop, blocked = decision.stop_reason, decision.blocked_seq_id
        if blocked != -1 and decision.phase == "decode":       # prefill found nothing: its head did not fit
            stop += f" (waiting s{blocked} needs {decision.num_blocks_needed} free)"
        elif blocked != -1 and stop == "no_free_blocks":
            stop += f"(s{blocked} needs {decision.num_blocks_needed} free)"
        elif blocked != -1:
            stop += f"(s{blocked})"
        head = f"{decision.step:>4} {decision.phase:<7} {seqs} | {stop}"
    segments = [f"{label} {' '.join(items)}" for label, items in (
        ("arrive", arrived), ("alloc", allocs), ("append", appends),
        ("hashed", [f"s{sid}[{id_ranges(ids)}]" for sid, ids in hashed.items()]),
        ("preempt", preempts), ("finish", finishes)) if items]
    line = head + (" | " + "; ".join(segments) if segments else "")
    return line + (f" | free {end.num_free_blocks}" if end is not None else "")


def render_header(header: TraceHeader) -> str:
    config = header.config
    return "# config: " + " ".join(f"{name}={config.get(name)}" for name in SCHEDULING_CONFIG)


def render_steps(events) -> str:
    """The step table: a config line, a legend, then one line per step."""
    lines = []
    events = iter(events)
    first = next(events, None)
    if isinstance(first, TraceHeader):
        lines.append(render_header(first))
        groups = iter_steps(events)
    else:
        groups = iter_steps([first, *events] if first is not None else [])
    lines.append(LEGEND)
    lines.extend(render_step(group) for group in groups)
    return "\n".join(lines) + "\n"


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
                         f"blocks [{id_ranges(s.block_table)}]")
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
