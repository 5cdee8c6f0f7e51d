"""The events of one vLLM scheduler as the recorder (recorder.py) sees its calls, kept per step
until the step's output is processed, then written as the step's frame."""
import time

from tracengine.vllm.connector import unobserve_connector
from tracengine.vllm.group_blocks import num_groups, observe_groups
from tracengine.vllm.structured import unobserve_grammars

from tracengine.trace.events import (BlockAllocate, BlockAppend, BlockFree, Preempt, RequestAdded, ScheduledSeq,
                                     ScheduleDecision, SeqAbort, SeqFinish, StepEnd, TokenSample)


def lora_fields(lora_request) -> dict:
    """RequestAdded's fields of a request's LoRA adapter (none: the defaults)."""
    if lora_request is None or lora_request.lora_int_id <= 0:
        return {}
    return {"lora_name": lora_request.lora_name, "lora_id": lora_request.lora_int_id}


class StepRecorder:
    """The events of one vLLM scheduler, kept per step until the step's output is processed."""

    def __init__(self, scheduler, sink, created_at: float):
        from vllm.v1.request import RequestStatus
        self.status = RequestStatus
        self.admitted_from = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        self.finish_reasons = {RequestStatus.FINISHED_LENGTH_CAPPED: "length", RequestStatus.FINISHED_ERROR: "error"}
        self.scheduler = scheduler
        self.sink = sink
        self.created_at = created_at  # arrival_ns counts from it (the header's created_at)
        self.seq_ids: dict[str, int] = {}
        self.num_scheduled = 0        # schedule() calls so far
        self.num_updated = 0          # update_from_output() calls so far
        self.steps: dict[int, list] = {}   # step -> its events so far, until its frame is written
        self.in_call = "between"      # "schedule", "update" or "between"
        self.by_request = None        # the request allocate_slots was last asked for
        self.preempted_ids: set[str] = set()   # requests preempted and not yet resumed
        self.blocked_seq_id = -1      # a waiting request allocate_slots refused this step
        self.num_blocks_needed = 0    # the blocks it needed beyond its prefix-cache hits
        self.num_preempted = 0        # preemptions in this step
        self.timing: dict[int, list] = {}   # step -> [schedule start, schedule end] (perf_counter_ns)
        self.last_update_end = time.perf_counter_ns()
        # step -> its (schedule_ns, model_ns, postprocess_ns, gap_ns), in place of the clock's
        # readings: a simulation in simulated time (vllm/timed.py, which times each decision)
        self.step_times = None
        self.num_free_blocks = self.free_blocks()   # as the events written so far leave them
        self.free_delta: dict[int, int] = {}        # step -> the change its events made, until StepEnd
        manager = scheduler.kv_cache_manager
        self._allocate_slots, self._free = manager.allocate_slots, manager.free
        # The scheduler's own manager, observed: its methods are called as before and return the same.
        manager.allocate_slots, manager.free = self.allocate_slots, self.free
        if num_groups(scheduler) > 1:      # a hybrid model: every group's blocks (group_blocks.py)
            observe_groups(self)

    # -- where an event goes -------------------------------------------------------------------

    def current_step(self) -> int:
        """Inside schedule(): the step scheduled; inside update: the step updated; between calls:
        the next step to be scheduled (requests and aborts precede it)."""
        if self.in_call == "schedule":
            return self.num_scheduled
        if self.in_call == "update":
            return self.num_updated
        return self.num_scheduled

    def emit(self, event) -> None:
        self.steps.setdefault(event.step, []).append(event)

    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def count_freed(self, step: int, num_free_before: int) -> None:
        """Adds what a call changed in the free blocks to `step`'s events."""
        self.free_delta[step] = self.free_delta.get(step, 0) + self.free_blocks() - num_free_before

    @property
    def num_in_flight(self) -> int:
        return self.num_scheduled - self.num_updated

    def seq_id(self, request) -> int:
        return self.seq_ids[request.request_id]

    # -- requests in and out -------------------------------------------------------------------

    def request_added(self, request) -> None:
        if request.request_id in self.seq_ids:      # a streaming session's next input: not recorded
            return
        seq_id = self.seq_ids[request.request_id] = len(self.seq_ids)
        params = request.sampling_params
        eos = params.eos_token_id
        self.emit(RequestAdded(
            self.current_step(), seq_id, list(request.prompt_token_ids), request.max_tokens, params.temperature,
            params.ignore_eos, arrival_ns=self._arrival_ns(request.arrival_time),
            top_k=params.top_k if params.top_k > 0 else -1, top_p=params.top_p,
            seed=-1 if params.seed is None else params.seed, request_id=request.request_id,
            priority=request.priority, arrival_time=request.arrival_time, min_tokens=params.min_tokens,
            eos_token_id=-1 if eos is None else eos, stop_token_ids=list(params.stop_token_ids or ()),
            num_steps_in_flight=self.num_in_flight, **lora_fields(request.lora_request)))

    def _arrival_ns(self, arrival_time: float) -> int:
        since = arrival_time - self.created_at
        return round(since * 1e9) if since >= 0 else -1

    def request_aborted(self, request, reason: str) -> None:
        self.preempted_ids.discard(request.request_id)
        status = "running" if request.status == self.status.RUNNING else "waiting"
        self.emit(SeqAbort(self.current_step(), self.seq_id(request), reason, status, request.num_prompt_tokens,
                           request.num_output_tokens, self.num_in_flight))

    def request_failed(self, request) -> None:
        """A request the scheduler itself ends with an error while it processes a step's output
        (its grammar failed to compile, its KV failed to load): a finish, not a client's abort,
        which a replay's scheduler makes again at the same point."""
        self.preempted_ids.discard(request.request_id)
        self.emit(SeqFinish(self.current_step(), self.seq_id(request), "error", request.num_prompt_tokens,
                            request.num_output_tokens))

    # -- the KV cache manager, observed --------------------------------------------------------

    def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
        admitting = request.status in self.admitted_from
        # a KV connector's external tokens get blocks allocate_slots does not return, and a request
        # admitted after its load holds those already: its table tells the blocks it was given
        held = len(self.block_ids(request)) if admitting and self.scheduler.connector is not None else None
        new_blocks = self._allocate_slots(request, num_new_tokens, *args, **kwargs)
        self.by_request = request
        if new_blocks is not None and not admitting and not new_blocks.blocks[0]:
            return new_blocks            # a running request that needed no block: nothing to record
        seq_id = self.seq_id(request)
        step = self.current_step()
        if new_blocks is None:
            if admitting:     # vLLM checks that the whole request fits (scheduler_reserve_full_isl)
                hits = kwargs.get("new_computed_blocks")
                num_hits = len(hits.blocks[0]) if hits is not None else 0
                self.blocked_seq_id = seq_id
                self.num_blocks_needed = -(-request.num_tokens // self.scheduler.block_size) - num_hits
            return None
        new_ids = new_blocks.get_block_ids()[0] if new_blocks.blocks[0] else []
        if admitting:
            hits = kwargs.get("new_computed_blocks")
            hit_ids = hits.get_block_ids()[0] if hits is not None and hits.blocks[0] else []
            if held is not None:
                new_ids = self.block_ids(request)[held + len(hit_ids):]
            self.emit(BlockAllocate(step, seq_id, list(hit_ids) + list(new_ids), len(hit_ids)))
        else:
            for block_id in new_ids:
                self.emit(BlockAppend(step, seq_id, block_id))
        return new_blocks

    def block_ids(self, request) -> list[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(request.request_id)[0])

    def free(self, request):
        released = self.block_ids(request)[::-1]     # vLLM frees the tail first
        self._free(request)
        if released:
            self.emit(BlockFree(self.current_step(), self.seq_id(request), released))

    def preempted(self, request) -> None:
        """Before vLLM resets the victim: what it loses."""
        self.num_preempted += 1
        self.preempted_ids.add(request.request_id)
        self.emit(Preempt(self.current_step(), self.seq_id(request), self.seq_id(self.by_request),
                          self.block_ids(request)[::-1], request.num_computed_tokens))

    # -- a step -----------------------------------------------------------------------------------

    def decision(self, out, prefill_before: dict[str, bool], resumed: list[int], start_ns: int) -> None:
        """The ScheduleDecision of the step `schedule()` just made (`out`, its SchedulerOutput)."""
        scheduler, step = self.scheduler, self.num_scheduled
        requests = scheduler.requests
        decodes, prefills = [], []
        for req_id, num_tokens in out.num_scheduled_tokens.items():
            request = requests[req_id]
            scheduled = ScheduledSeq(self.seq_ids[req_id], num_tokens, request.num_computed_tokens - num_tokens)
            (prefills if prefill_before.get(req_id, True) else decodes).append(scheduled)
        num_running, num_waiting = scheduler.get_request_counts()
        num_free_blocks = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        phase = "decode" if not prefills else "prefill" if not decodes else "mixed"
        self.emit(ScheduleDecision(
            step, phase, decodes + prefills, out.total_num_scheduled_tokens,
            self._stop_reason(out, num_waiting), self.blocked_seq_id, self.num_blocks_needed, num_free_blocks, num_waiting, num_running,
            len(decodes) if phase == "mixed" else 0, resumed))
        self.timing[step] = [start_ns, time.perf_counter_ns()]
        self.blocked_seq_id, self.num_blocks_needed, self.num_preempted = -1, 0, 0

    def _stop_reason(self, out, num_waiting: int) -> str:
        """vLLM's loops have no named exits: the one the state after the step shows."""
        scheduler = self.scheduler
        if self.num_preempted:      # vLLM admits nobody in a step that preempted
            return "preempted"
        if self.blocked_seq_id != -1:
            return "no_free_blocks"
        if out.total_num_scheduled_tokens >= scheduler.max_num_scheduled_tokens:
            return "budget_exhausted"
        if num_waiting == 0:
            return "waiting_empty"
        if len(scheduler.running) >= scheduler.max_num_active_reqs:
            return "max_num_seqs"
        return "not_admitted"

    def outputs(self, model_output, before: dict, frees: list, start_ns: int, accepted=None,
                sampled=None) -> None:
        """SpecAccepted, TokenSample, SeqFinish and the frees of finished requests, then StepEnd: the
        step's frame. `before`: req_id -> (the request, its output tokens before the update) of each
        request whose output was processed; `sampled`: the sampled tokens as the model gave them,
        where vLLM may have cut them since (drafts accepted past a stop)."""
        step = self.num_updated
        if accepted is not None:
            self.emit(accepted)
        if sampled is None:
            sampled = model_output.sampled_token_ids
        finished = []
        for req_id, (request, num_before) in before.items():
            seq_id = self.seq_ids[req_id]
            tokens = sampled[model_output.req_id_to_index[req_id]] if sampled else ()
            num_kept = request.num_output_tokens - num_before
            for i, token_id in enumerate(tokens):
                self.emit(TokenSample(step, seq_id, token_id, i < num_kept))
            if request.is_finished():
                finished.append(request)
        for request in finished:
            reason = self.finish_reasons.get(request.status) or ("eos" if request.stop_reason is None else "stop")
            self.emit(SeqFinish(step, self.seq_id(request), reason, request.num_prompt_tokens,
                                request.num_output_tokens))
        for event in frees:
            self.emit(event)
            if self.num_scheduled > step + 1 and type(event) is BlockFree:
                self.count_ahead(step, event)
        end_ns = time.perf_counter_ns()
        # The free blocks as the events up to this step's leave them: with async scheduling the
        # next step's allocations come before this update's frees, but in the next frame.
        self.num_free_blocks += self.free_delta.pop(step, 0)
        schedule_start, schedule_end = self.timing.pop(step)
        if self.step_times is not None:
            times = self.step_times(step)
        else:
            times = (schedule_end - schedule_start, max(start_ns - schedule_end, 0), end_ns - start_ns,
                     max(schedule_start - self.last_update_end, 0))
        self.emit(StepEnd(step, self.num_free_blocks, *times, self.num_scheduled - step - 1))
        self.last_update_end = end_ns
        self.write(step)

    def count_ahead(self, step: int, free: BlockFree) -> None:
        """A request that finished in this update freeing blocks a later step, scheduled already,
        gave it (async scheduling, with drafts; or admitted it, a KV connector's load that ended
        in a failure): in the events that block is given in the later frame, after this one frees
        it, so neither changes the free blocks before that frame."""
        ahead = set()
        for later in range(step + 1, self.num_scheduled):
            for e in self.steps.get(later, ()):
                if type(e) is BlockAppend and e.seq_id == free.seq_id:
                    ahead.add(e.block_id)
                elif type(e) is BlockAllocate and e.seq_id == free.seq_id:   # admitted ahead (a connector's load)
                    ahead.update(e.block_ids[e.num_cached_blocks:])
        num_ahead = sum(1 for block_id in free.block_ids if block_id in ahead)
        if num_ahead:
            self.free_delta[step] = self.free_delta.get(step, 0) - num_ahead
            self.free_delta[step + 1] = self.free_delta.get(step + 1, 0) + num_ahead

    def write(self, step: int) -> None:
        for event in self.steps.pop(step, ()):
            self.sink.emit(event)

    def close(self) -> None:
        """Writes the requests of steps not yet scheduled (none after a step still in flight), then closes."""
        if self.num_in_flight == 0:
            for step in sorted(self.steps):
                self.write(step)
        self.steps.clear()
        manager = self.scheduler.kv_cache_manager     # the manager's own methods back: nothing observes them now
        del manager.allocate_slots, manager.free
        unobserve_connector(self.scheduler)
        unobserve_grammars(self.scheduler)
        close = getattr(self.sink, "close", None)
        if close is not None:
            close()
