"""SGLang's schedule policy order and prefill adder stop (trace/sglang_events.py) in words: a step
table's items (render.py), an event's line in the TUI's list (render.describe_event) and the
clause the TUI's step explanation adds (tui/explain.py)."""
from tracengine.trace.sglang_events import PolicyOrder, PrefillStop

_STOPS = {"waiting_empty": "every waiting request was read",
          "no_token": "no room in the token pool",
          "chunked_prefill_size": "the chunk budget (chunked_prefill_size) is spent",
          "max_prefill_tokens": "the prefill budget (max_prefill_tokens) is spent",
          "max_running_requests": "no request slot left (max_running_requests)",
          "batch_full": "the running batch is full since an earlier step",
          "prefill_max_requests": "the batch's new-request cap is reached",
          "not_tried": "no prefill was tried", "other": "SGLang's adder said OTHER"}


def policy_name(e: PolicyOrder) -> str:
    return e.policy if e.applied == e.policy else f"{e.policy}->{e.applied}"


def order_text(e: PolicyOrder) -> str:
    """`s3@64 s1 s5`: the order read, each with its radix-cache match where the policy matched."""
    items = [f"s{s}" + (f"@{e.num_matched_tokens[i]}" if i < len(e.num_matched_tokens)
                        and e.num_matched_tokens[i] else "") for i, s in enumerate(e.seq_ids)]
    more = e.num_waiting - len(e.seq_ids)
    return " ".join(items) + (f" +{more}" if more > 0 else "")


def stop_text(e: PrefillStop) -> str:
    at = f" at s{e.seq_id}" + (" (admitted)" if e.admitted else "") if e.seq_id >= 0 else ""
    return f"{e.reason}{at}"


def step_item(e) -> tuple[str, str] | None:
    """A step table's item for an SGLang event: (its label, the item)."""
    if type(e) is PolicyOrder:
        return "order", f"{policy_name(e)}: {order_text(e)}"
    if type(e) is PrefillStop and e.reason != "waiting_empty":
        return "adder", stop_text(e)
    return None


def describe(e) -> str:
    """The TUI's event line."""
    if type(e) is PolicyOrder:
        last = f"; put last to share a prefix: {' '.join(f's{s}' for s in e.deprioritized)}" if e.deprioritized else ""
        return f"{policy_name(e)} ordered the {e.num_waiting} waiting: {order_text(e)}{last}"
    budgets = [f"{name} {value}" for name, value in (("chunk", e.rem_chunk_tokens), ("input", e.rem_input_tokens),
                                                     ("pool", e.rem_total_tokens)) if value >= 0]
    result = f" ({e.result.upper()} after {e.num_tried} tried)" if e.result else ""
    return f"prefill stopped{result}: {_STOPS[e.reason]}" + (f" at seq {e.seq_id}" if e.seq_id >= 0 else "") + (
        f"; left: {', '.join(budgets)}" if e.result else "")


def explain(events) -> list[str]:
    """The step explanation's clause: the order the policy gave and why the adder stopped."""
    parts = []
    for e in events:
        if type(e) is PolicyOrder and len(e.seq_ids) > 1:
            parts.append(f"{policy_name(e)} order {order_text(e)}")
        elif type(e) is PrefillStop and e.reason not in ("waiting_empty", "not_tried"):
            parts.append(f"SGLang's adder stopped: {_STOPS[e.reason]}" + (
                f" at seq {e.seq_id}" if e.seq_id >= 0 and not e.admitted else ""))
    return parts
