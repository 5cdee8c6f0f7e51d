"""One sentence that says what the scheduler decided at a step and why, in
the seeds' terms (head-of-line blocking, chunk gate, running tail). It reads
the step's recorded events; it decides nothing."""
from collections.abc import Mapping

from tracengine.analysis.sglang_decisions import explain as sglang_clauses
from tracengine.trace.events import (BlockAllocate, DraftVerified, KVTransfer, Preempt, ScheduleDecision, SeqAbort,
                                     SeqFinish, SpecAccepted, SpecDecode, TokenSample)


def explain_step(events: list, seqs: Mapping, num_free_before: int,
                 max_num_batched_tokens: int, max_num_seqs: int) -> str:
    """`seqs` maps a seq id to its state after the step (a middle chunk keeps
    its token count); `num_free_before` is the free block count when the step
    began."""
    decision = next((e for e in events if isinstance(e, ScheduleDecision)), None)
    if decision is None:
        return "no scheduling decision recorded at this step"
    if decision.phase == "prefill":
        text = _prefill(decision, events, seqs, max_num_batched_tokens, max_num_seqs)
    elif decision.phase == "mixed":
        text = _mixed(decision, events, seqs, max_num_batched_tokens, max_num_seqs)
    else:
        text = _decode(decision, events, num_free_before, max_num_seqs)
    # a disaggregated fleet's decode replica: the prompts' KV that landed before the step
    landed = [f"seq {e.seq_id}'s prompt KV landed from replica {e.src_replica} ({e.num_blocks} blocks cached)"
              for e in events if isinstance(e, KVTransfer)]
    finished = [f"seq {e.seq_id} aborted ({e.reason})" for e in events if isinstance(e, SeqAbort)]
    finished += [f"seq {e.seq_id} finished ({e.reason})" for e in events if isinstance(e, SeqFinish)]
    return "; ".join(landed + [text] + sglang_clauses(events) + _drafts_kept(events) + finished)


def _drafts_kept(events) -> list[str]:
    """Speculative decoding: of each sequence's drafts verified, how many were kept (tracengine's
    engine: DraftVerified; vLLM's scheduler: SpecAccepted, of the drafts SpecDecode scheduled)."""
    kept = [f"seq {e.seq_id} {e.num_accepted_tokens} of {e.num_draft_tokens}" for e in events
            if isinstance(e, DraftVerified) and not e.padded]
    scheduled = {s: n for e in events if isinstance(e, SpecDecode) for s, n in zip(e.seq_ids, e.num_spec_tokens)}
    kept += [f"seq {s} {a}" + (f" of {scheduled[s]}" if s in scheduled else "")
             for e in events if isinstance(e, SpecAccepted) for s, a in zip(e.seq_ids, e.num_accepted)]
    return ["drafts kept: " + ", ".join(kept)] if kept else []


def _decode_tokens(n: int, num_tokens: int) -> str:
    """What each of n decoding sequences computes: one token, or (verifying drafts) more."""
    if num_tokens <= n:
        return "1 token" if n == 1 else "1 token each"
    return f"{_tokens(num_tokens)} with their drafts"


def _mixed(decision, events, seqs, budget, max_num_seqs) -> str:
    """The mixed policy's batch: decode tokens of running sequences first, then prefill chunks."""
    decoding = [s.seq_id for s in decision.seqs[:decision.num_decode_seqs]]
    prefill = decision.seqs[decision.num_decode_seqs:]
    who = f"seq {decoding[0]}" if len(decoding) == 1 else f"{len(decoding)} seqs"
    num_decode_tokens = sum(s.num_tokens for s in decision.seqs[:decision.num_decode_seqs])
    tokens = "1 token each" if num_decode_tokens <= len(decoding) else f"{_tokens(num_decode_tokens)} with their drafts"
    parts = [f"mixed batch: decode {who}, {tokens}, beside prefill "
             + ", ".join(_prefill_items(prefill, events, seqs))
             + f", {_tokens(decision.num_batched_tokens)} in all"]
    parts += _preemptions(events)
    return "; ".join(parts + [_prefill_stop(decision, budget, max_num_seqs)])


def _prefill_items(scheduled, events, seqs) -> list[str]:
    allocated = {e.seq_id: e for e in events if isinstance(e, BlockAllocate)}
    middle = {e.seq_id for e in events if isinstance(e, TokenSample) and not e.kept}
    items = []
    for s in scheduled:
        if s.seq_id in middle:
            total = seqs[s.seq_id].num_tokens
            done = s.num_cached_tokens + s.num_tokens
            if s.seq_id in allocated:
                items.append(f"seq {s.seq_id} got {s.num_tokens} of {_tokens(total - s.num_cached_tokens)}")
            else:
                items.append(f"seq {s.seq_id} got {_tokens(s.num_tokens)} more, {done} of {total} done")
        elif s.seq_id not in allocated:
            # the rest of a chunked prefill: its blocks were allocated at its first chunk
            items.append(f"seq {s.seq_id} got its last {s.num_tokens} of {_tokens(s.num_cached_tokens + s.num_tokens)}")
        else:
            cached = f", {s.num_cached_tokens} prefix-cached" if s.num_cached_tokens else ""
            again = "recomputed after preemption: " if seqs[s.seq_id].num_preemptions else ""
            items.append(f"seq {s.seq_id} ({again}{_tokens(s.num_tokens)}{cached})")
    return items


def _prefill(decision, events, seqs, budget, max_num_seqs) -> str:
    middle = {e.seq_id for e in events if isinstance(e, TokenSample) and not e.kept}
    items = _prefill_items(decision.seqs, events, seqs)
    if len(decision.seqs) == 1 and decision.seqs[0].seq_id in middle:
        text = "chunked prefill: " + items[0]
    else:
        text = "prefill " + ", ".join(items)
        if len(items) > 1:
            text += f", {_tokens(decision.num_batched_tokens)} in all"
    return f"{text}; {_prefill_stop(decision, budget, max_num_seqs)}"


def _prefill_stop(decision, budget, max_num_seqs) -> str:
    match decision.stop_reason:
        case "budget_exhausted":
            return f"the token budget of {_tokens(budget)} is used up"
        case "no_free_blocks":
            return (f"then head seq {decision.blocked_seq_id} needs {_blocks(decision.num_blocks_needed)}, "
                    f"{decision.num_free_blocks} free (head-of-line blocking)")
        case "chunk_gate":
            left = budget - decision.num_batched_tokens
            return (f"stopped at seq {decision.blocked_seq_id}: {_tokens(left)} of budget left and only "
                    f"the first seq of a step may be chunked (chunk gate)")
        case "max_num_seqs":
            return f"max_num_seqs={max_num_seqs} reached"
        case "waiting_empty":
            return "waiting queue empty"
        case "preempted":
            return "a sequence was preempted, so none is admitted this step (as vLLM V1)"
        case "not_admitted":
            return "the policy admits no more this step"
    return f"stopped: {decision.stop_reason}"


def _blocked(seq_id, num_blocks_needed, num_free_blocks) -> str:
    return (f"prefill stopped: head seq {seq_id} needs {_blocks(num_blocks_needed)}, "
            f"{num_free_blocks} free (head-of-line blocking)")


def _decode(decision, events, num_free_before, max_num_seqs) -> str:
    parts = []
    if decision.blocked_seq_id >= 0:
        # nothing was allocated before the head blocked, so the step's starting count applies
        parts.append(_blocked(decision.blocked_seq_id, decision.num_blocks_needed, num_free_before))
    n = len(decision.seqs)
    tokens = _decode_tokens(n, decision.num_batched_tokens)
    text = "decode: " + (f"seq {decision.seqs[0].seq_id}, {tokens}" if n == 1 else f"{n} seqs, {tokens}")
    if n == 0:
        text = "decode: no sequence could run"
    parts.append(text)
    parts += _preemptions(events)
    if decision.stop_reason == "max_num_seqs":
        parts.append(f"max_num_seqs={max_num_seqs} reached")
    elif decision.stop_reason in ("preempted", "not_admitted"):      # the mixed policy, a user's policy
        parts.append(_prefill_stop(decision, 0, max_num_seqs))
    return "; ".join(parts)


def _preemptions(events) -> list[str]:
    parts = []
    by_needer: dict[int, list[int]] = {}
    for e in events:
        if isinstance(e, Preempt):
            by_needer.setdefault(e.by_seq_id, []).append(e.seq_id)
    for needer, victims in by_needer.items():
        others = [v for v in victims if v != needer]
        if others:
            names = "seq " + str(others[0]) if len(others) == 1 else "seqs " + ", ".join(map(str, others))
            parts.append(f"seq {needer} needed a block; preempted {names} (running tail)")
        if needer in victims:
            parts.append(f"seq {needer} needed a block and no other seq was left to preempt: "
                         f"it preempted itself (recompute)")
    return parts


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def _blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"
