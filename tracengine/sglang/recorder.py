"""The recorder: hooks on SGLang's Scheduler (its plugin framework's HookRegistry, AROUND hooks),
writing what the scheduler decides each step as tracengine events (step_recorder.py).

The hooks are installed once per process on SGLang's classes, and record only a scheduler that
has a recorder (`record_to`): every other scheduler runs them as a pass-through. They read what
SGLang decided and change no decision. Where each event comes from: `_add_request_to_queue`
(RequestAdded), `abort_request` (SeqAbort), `get_next_batch_to_run` (ScheduleDecision, and
BlockAllocate/BlockAppend from the batch it prepared: the radix-cache prefix match and the
new token-pool slots), ScheduleBatch.retract_decode (Preempt), the token pool's `free`
(BlockFree: finishes, radix evictions; seq_id -1, a slot freed is the pool's), and
`process_batch_result` (TokenSample, SeqFinish, StepEnd). Both of SGLang's loops call them: the
normal one a step's calls in order, the overlap one `process_batch_result` of step k after
`get_next_batch_to_run` and `run_batch` of step k+1 (the step recorder says which step an event
belongs to by the call it comes in)."""
import functools
import time

from tracengine.trace.sinks import NULL_SINK

RECORD_ENV = "TRACENGINE_RECORD"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_active = []     # the recorder of the scheduler inside get_next_batch_to_run (retractions find it)
_recorders_by_allocator: dict[int, object] = {}    # a token pool's scheduler's recorder (frees find it)


def record_to(scheduler, sink, created_at: float | None = None):
    """Starts recording `scheduler` into `sink` (a trace writer, or a replay's comparing sink)."""
    from tracengine.sglang.step_recorder import StepRecorder
    install_hooks()
    if sink is NULL_SINK or not sink.enabled:
        return None
    if getattr(scheduler, "tracengine", None) is not None:
        raise RuntimeError("this scheduler is recording already")
    scheduler.tracengine = StepRecorder(scheduler, sink, time.time() if created_at is None else created_at)
    _recorders_by_allocator[id(scheduler.token_to_kv_pool_allocator)] = scheduler.tracengine
    return scheduler.tracengine


def stop_recording(scheduler) -> None:
    recorder = getattr(scheduler, "tracengine", None)
    if recorder is not None:
        scheduler.tracengine = None
        _recorders_by_allocator.pop(id(scheduler.token_to_kv_pool_allocator), None)
        recorder.close()


def _recorder(scheduler):
    return getattr(scheduler, "tracengine", None)


def add_request_to_queue(original, self, req, *args, **kwargs):
    recorder = _recorder(self)
    is_retracted = kwargs.get("is_retracted", args[0] if args else False)
    if recorder is not None and not is_retracted:
        recorder.request_added(req)
    return original(self, req, *args, **kwargs)


def abort_request(original, self, recv_req, *args, **kwargs):
    recorder = _recorder(self)
    if recorder is not None:
        def matches(req):
            return recv_req.abort_all or req.rid.startswith(recv_req.rid)
        for req in self.waiting_queue:
            if matches(req):
                recorder.request_aborted(req, "waiting")
        running = {id(req): req for req in self.running_batch.reqs}
        if self.last_batch is not None:     # a prefill batch joins the running batch in the next step
            running.update((id(req), req) for req in self.last_batch.reqs)
        if self.chunked_req is not None:
            running[id(self.chunked_req)] = self.chunked_req
        for req in running.values():
            if matches(req) and not req.finished():
                recorder.request_aborted(req, "running")
    return original(self, recv_req, *args, **kwargs)


def get_next_batch_to_run(original, self, *args, **kwargs):
    recorder = _recorder(self)
    if recorder is None:
        return original(self, *args, **kwargs)
    start_ns = time.perf_counter_ns()
    recorder.frees = []
    recorder.prefill = None
    recorder.in_call = "decide"
    _active.append(recorder)
    try:
        plan = original(self, *args, **kwargs)
    finally:
        _active.pop()
        frees, recorder.frees = recorder.frees, None
    batch = plan.batch_to_run
    if batch is not None:
        recorder.decision(batch)
        recorder.timing[recorder.num_decided] = [time.perf_counter_ns() - start_ns, 0,
                                                 max(start_ns - recorder.last_end_ns, 0)]
    for event in frees:
        recorder.emit(event)
    recorder.in_call = "between"
    if batch is not None:
        recorder.num_decided += 1
    return plan


def retract_decode(original, self, *args, **kwargs):
    recorder = _active[-1] if _active else None
    if recorder is None:
        return original(self, *args, **kwargs)
    before = {req.rid: recorder.slots(req, len(req.origin_input_ids) + len(req.output_ids) - 1) for req in self.reqs}
    result = original(self, *args, **kwargs)
    recorder.retracted_reqs(before, result[0])
    return result


def run_batch(original, self, batch, *args, **kwargs):
    recorder = _recorder(self)
    if recorder is None:
        return original(self, batch, *args, **kwargs)
    start_ns = time.perf_counter_ns()
    result = original(self, batch, *args, **kwargs)
    recorder.timing[recorder.num_decided - 1][1] = time.perf_counter_ns() - start_ns     # the batch just chosen
    return result


def process_batch_result(original, self, batch, result, *args, **kwargs):
    recorder = _recorder(self)
    if recorder is None:
        return original(self, batch, result, *args, **kwargs)
    start_ns = time.perf_counter_ns()
    tokens = result.next_token_ids.tolist()
    before = [(len(req.output_ids), req.finished()) for req in batch.reqs]
    recorder.in_call = "process"
    try:
        out = original(self, batch, result, *args, **kwargs)
        recorder.outputs(batch, tokens, before, start_ns)
    finally:
        recorder.in_call = "between"
    return out


def free(original, self, free_index, *args, **kwargs):
    recorder = _recorders_by_allocator.get(id(self))
    if recorder is not None and self.free_group is None and free_index.numel():
        recorder.freed(free_index)
    return original(self, free_index, *args, **kwargs)


HOOKS = {f"{_SCHEDULER}._add_request_to_queue": add_request_to_queue,
         f"{_SCHEDULER}.abort_request": abort_request,
         f"{_SCHEDULER}.get_next_batch_to_run": get_next_batch_to_run,
         f"{_SCHEDULER}.run_batch": run_batch,
         f"{_SCHEDULER}.process_batch_result": process_batch_result,
         "sglang.srt.managers.schedule_batch.ScheduleBatch.retract_decode": retract_decode,
         "sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator.free": free}


@functools.cache
def install_hooks() -> None:
    """Registers the hooks with SGLang's HookRegistry and applies them (once per process)."""
    from tracengine.sglang.imports import scheduler_module
    scheduler_module()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from tracengine.sglang.prefill_recorder import AFTER_HOOKS, AROUND_HOOKS
    for target, hook in {**HOOKS, **AROUND_HOOKS}.items():
        HookRegistry.register(target, hook, HookType.AROUND)
    for target, hook in AFTER_HOOKS.items():
        HookRegistry.register(target, hook, HookType.AFTER)
    HookRegistry.apply_hooks()
