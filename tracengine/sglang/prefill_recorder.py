"""How SGLang chose a step's prefill, as it computed it: the schedule policy's order of the waiting
queue (SchedulePolicy.calc_priority) and the prefill adder's verdicts (PrefillAdder.add_one_req's
AddReqResult, the running-request limit it checked) until it stopped. Hooks (recorder.HOOKS) on
`Scheduler._get_new_batch_prefill_raw` open a PrefillAttempt for the step being chosen; the
policy's and the adder's calls inside it fill it; the step recorder writes it as a PolicyOrder and
a PrefillStop after the step's ScheduleDecision (format 13), whose stop_reason it names too.
The hooks read what SGLang decided and change nothing."""
from tracengine.trace.sglang_events import PolicyOrder, PrefillStop

# PrefillStop's reason in the vocabulary of ScheduleDecision.stop_reason (events.StopReason)
STOP_REASONS = {"waiting_empty": "waiting_empty", "no_token": "no_free_blocks", "batch_full": "no_free_blocks",
                "chunked_prefill_size": "budget_exhausted", "max_prefill_tokens": "budget_exhausted",
                "max_running_requests": "max_num_seqs", "prefill_max_requests": "max_num_seqs",
                "not_tried": "not_admitted", "other": "not_admitted"}


class PrefillAttempt:
    """One call of `_get_new_batch_prefill_raw`: what it was given and what SGLang's parts answered."""

    def __init__(self, scheduler, running_batch):
        self.num_waiting = len(scheduler.waiting_queue)
        self.full_on_entry = bool(running_batch.batch_is_full)
        self.adder = None
        self.tried: list[tuple] = []          # (req, AddReqResult name, admitted)
        self.num_allocatable: int | None = None    # get_num_allocatable_reqs's last answer
        self.policy: str | None = None        # set by calc_priority: the configured and the applied policy
        self.applied = ""
        self.order: list = []                 # the waiting queue as the policy left it
        self.matched: list[int] = []
        self.deprioritized: set[str] = set()


_attempts: list[PrefillAttempt] = []     # the attempt under way (the policy's and the adder's calls find it)


def _attempt():
    return _attempts[-1] if _attempts else None


def get_new_batch_prefill_raw(original, self, *args, **kwargs):
    recorder = getattr(self, "tracengine", None)
    if recorder is None:
        return original(self, *args, **kwargs)
    running_batch = kwargs.get("running_batch", args[1] if len(args) > 1 else None)
    recorder.prefill = PrefillAttempt(self, running_batch)
    _attempts.append(recorder.prefill)
    try:
        return original(self, *args, **kwargs)
    finally:
        _attempts.pop()


def calc_priority(original, self, waiting_queue, *args, **kwargs):
    attempt = _attempt()
    if attempt is None:
        return original(self, waiting_queue, *args, **kwargs)
    applied = self._determine_active_policy(waiting_queue)      # of the queue's length: the same after
    out = original(self, waiting_queue, *args, **kwargs)
    from sglang.srt.managers.schedule_policy import CacheAwarePolicy
    attempt.policy, attempt.applied = self.policy.value, applied.value
    attempt.order = list(waiting_queue)
    if isinstance(applied, CacheAwarePolicy):
        attempt.matched = [req.num_matched_prefix_tokens for req in waiting_queue]
    return out


def compute_prefix_matches(original, self, *args, **kwargs):
    deprioritized = original(self, *args, **kwargs)
    attempt = _attempt()
    if attempt is not None:
        attempt.deprioritized = set(deprioritized)
    return deprioritized


def adder_init(result, self, *args, **kwargs):
    attempt = _attempt()
    if attempt is not None:
        attempt.adder = self


def add_one_req(original, self, req, *args, **kwargs):
    attempt = _attempt()
    if attempt is None or attempt.adder is not self:
        return original(self, req, *args, **kwargs)
    result = original(self, req, *args, **kwargs)
    attempt.tried.append((req, result.name.lower(), any(r is req for r in self.can_run_list)))
    return result


def get_num_allocatable_reqs(original, self, *args, **kwargs):
    n = original(self, *args, **kwargs)
    recorder = getattr(self, "tracengine", None)
    if recorder is not None and recorder.prefill is not None:
        recorder.prefill.num_allocatable = n
    return n


def prefill_events(recorder, step: int) -> tuple:
    """The step's PolicyOrder (None where no policy ordered the queue) and PrefillStop."""
    attempt, seq_ids = recorder.prefill, recorder.seq_ids
    recorder.prefill = None
    if attempt is None:
        return None, PrefillStop(step, "not_tried")
    stop = _stop(attempt, seq_ids, step)
    order = None
    if attempt.policy is not None:
        end = min(stop.num_tried + 1, len(attempt.order))
        order = PolicyOrder(step, attempt.policy, attempt.applied, [seq_ids[r.rid] for r in attempt.order[:end]],
                            len(attempt.order), attempt.matched[:end],
                            sorted(seq_ids[r.rid] for r in attempt.order if r.rid in attempt.deprioritized))
    return order, stop


def _stop(attempt: PrefillAttempt, seq_ids: dict, step: int) -> PrefillStop:
    adder = attempt.adder
    if adder is None:       # it returned before building an adder
        if attempt.num_waiting == 0:
            reason = "waiting_empty"
        elif attempt.full_on_entry:
            reason = "batch_full"
        elif attempt.num_allocatable is not None and attempt.num_allocatable <= 0:
            reason = "max_running_requests"
        else:
            reason = "other"
        return PrefillStop(step, reason)
    num_tried = len(attempt.tried)
    budget = dict(rem_chunk_tokens=-1 if adder.rem_chunk_tokens is None else int(adder.rem_chunk_tokens),
                  rem_input_tokens=int(adder.rem_input_tokens), rem_total_tokens=int(adder.rem_total_tokens))
    if attempt.tried and attempt.tried[-1][1] != "continue":
        req, result, admitted = attempt.tried[-1]
        reason = "no_token" if result == "no_token" else _other_reason(adder)
        return PrefillStop(step, reason, result, seq_ids[req.rid], admitted, num_tried, **budget)
    result = attempt.tried[-1][1] if attempt.tried else ""
    if num_tried == attempt.num_waiting:
        return PrefillStop(step, "waiting_empty", result, -1, False, num_tried, **budget)
    # it stopped at the head of its loop, before trying the next request
    head = seq_ids[attempt.order[num_tried].rid] if num_tried < len(attempt.order) else -1
    state = adder.budget_state().name.lower()
    if state == "no_token":
        reason = "no_token"
    elif state == "other":
        reason = _other_reason(adder)
    elif attempt.num_allocatable is not None and len(adder.can_run_list) >= attempt.num_allocatable:
        reason = "max_running_requests"
    else:
        reason = "other"
    return PrefillStop(step, reason, result, head, False, num_tried, **budget)


def _other_reason(adder) -> str:
    """Which budget an OTHER verdict found spent."""
    if adder.rem_chunk_tokens is not None and (adder.rem_chunk_tokens <= 0 or adder.new_chunked_req is not None):
        return "chunked_prefill_size"
    if adder.rem_input_tokens <= 0:
        return "max_prefill_tokens"
    limit = adder.prefill_max_requests
    if limit is not None and len(adder.can_run_list) >= limit:
        return "prefill_max_requests"
    return "other"


_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_POLICY = "sglang.srt.managers.schedule_policy"
AROUND_HOOKS = {f"{_SCHEDULER}._get_new_batch_prefill_raw": get_new_batch_prefill_raw,
                f"{_SCHEDULER}.get_num_allocatable_reqs": get_num_allocatable_reqs,
                f"{_POLICY}.SchedulePolicy.calc_priority": calc_priority,
                f"{_POLICY}.SchedulePolicy._compute_prefix_matches": compute_prefix_matches,
                f"{_POLICY}.PrefillAdder.add_one_req": add_one_req}
AFTER_HOOKS = {f"{_POLICY}.PrefillAdder.__init__": adder_init}
