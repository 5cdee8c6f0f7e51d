"""Events of a trace of SGLang's scheduler (format 13) beside its ScheduleDecision: how its schedule
policy ordered the waiting queue and why its prefill adder stopped adding requests, as SGLang
computed them (tracengine/sglang/prefill_recorder.py). Tags 38-39. They are read with events.py's
(block_runs.WireEvent holds them; vllm_events.ALL_EVENT_TYPES names them); this module imports
nothing but events.py."""
from typing import Literal

import msgspec

from tracengine.trace.events import Event

# Why SGLang's prefill adder stopped (Scheduler._get_new_batch_prefill_raw's exits, PrefillAdder's
# AddReqResult): "waiting_empty", every waiting request was read; "no_token", NO_TOKEN (the token
# pool, less what running requests are reserved, has no room for the request); "chunked_prefill_size",
# "max_prefill_tokens": OTHER with that budget spent (a prompt chunked to fit it); "max_running_requests":
# no request slot left (get_num_allocatable_reqs); "batch_full": the running batch was marked full by an
# earlier step and nothing left it since; "prefill_max_requests": the schedule's cap on a batch's new
# requests; "not_tried": no prefill was attempted (a deferred prefill); "other": another OTHER.
PrefillStopReason = Literal["waiting_empty", "no_token", "chunked_prefill_size", "max_prefill_tokens",
                            "max_running_requests", "batch_full", "prefill_max_requests", "not_tried", "other"]


class PolicyOrder(Event, tag=38):
    """SchedulePolicy.calc_priority ordered the waiting queue before the prefill adder read it:
    `policy` the one configured (`lpm`, `fcfs`, `dfs-weight`, `lof`, `random`, ...), `applied` the
    one it applied (lpm falls back to fcfs over a queue longer than 128); `seq_ids` the queue in
    the order it left it, as far as the adder read it (the requests it tried and the next in line;
    `num_waiting` counts all); `num_matched_tokens` each one's prefix matched in the radix cache
    (what lpm sorts by: empty for a policy that matches nothing); `deprioritized` requests a
    cache-aware policy put last to share a prefix with one ahead of them (in-batch prefix caching)."""
    step: int
    policy: str
    applied: str
    seq_ids: list[int] = msgspec.field(default_factory=list)
    num_waiting: int = 0
    num_matched_tokens: list[int] = msgspec.field(default_factory=list)
    deprioritized: list[int] = msgspec.field(default_factory=list)


class PrefillStop(Event, tag=39):
    """Why the prefill adder stopped adding requests at this step (the step's batch may be a decode:
    then why no prefill ran): `reason` as PrefillStopReason names it, `result` the last
    AddReqResult it returned ("continue", "no_token", "other"; "" where add_one_req was never
    called), `seq_id` the request it stopped at (-1: none), `admitted` whether that request was
    added before it stopped (a chunked prompt, or the last one that fit), `num_tried` the
    requests add_one_req was given, and the budgets left: `rem_chunk_tokens` (-1: no chunking),
    `rem_input_tokens`, `rem_total_tokens` (the pool's room the adder counted)."""
    step: int
    reason: PrefillStopReason
    result: str = ""
    seq_id: int = -1
    admitted: bool = False
    num_tried: int = 0
    rem_chunk_tokens: int = -1
    rem_input_tokens: int = 0
    rem_total_tokens: int = 0


SGLANG_EVENTS = (PolicyOrder, PrefillStop)
SGLANG_EVENTS_SINCE = 13     # the first format whose SGLang traces hold them (and read stop_reason from the adder)
