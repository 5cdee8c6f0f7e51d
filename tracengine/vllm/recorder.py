"""The recorder: vLLM's own V1 scheduler, subclassed, writing every decision
as tracengine events, a frame per step.

    vllm serve MODEL --scheduler-cls tracengine.vllm.RecordingAsyncScheduler \
        --additional-config '{"tracengine": {"record": "run.trace"}}'

(or TRACENGINE_RECORD=run.trace; `RecordingScheduler` for the synchronous
Scheduler). A step is one `schedule()` call and the `update_from_output()`
of its model output. The subclass reads what vLLM decided; it changes no
decision (the one thing it fixes is an order vLLM leaves to a set's hash:
several requests aborted at once are freed in the order they arrived).

Where each event comes from: `add_request` (RequestAdded), `finish_requests`
(SeqAbort), the KV cache manager's `allocate_slots` (BlockAllocate for an
admission, with its prefix-cache hits first; BlockAppend for each block a
running request is given; the waiting head it refused) and `free`
(BlockFree), `_preempt_request` (Preempt: the victim before it is reset, and
the request that needed the blocks), `schedule`'s result (ScheduleDecision)
and `update_from_output` (TokenSample, SeqFinish, StepEnd).

Request ids are strings in vLLM; a trace numbers requests in the order they
arrive (seq_id 0, 1, ...) and keeps the string in RequestAdded.request_id.
vLLM's engine core calls `update_from_output` for step k after scheduling
step k+1 when scheduling is async: events are kept per step and a step's
frame is written when its output has been processed, so the trace holds whole
steps in order. Requests and aborts carry `num_steps_in_flight` and StepEnd
`num_scheduled_ahead`, the points between calls where they happened, so a
replay makes the same calls in the same order."""
import functools
import os
import time

from tracengine.errors import ConfigError
from tracengine.trace.sinks import NULL_SINK
from tracengine.vllm.connector import connector_finished, observe_connector, transfers_done
from tracengine.vllm.features import refuse_unrecorded, request_features
from tracengine.vllm.structured import grammar_checked, grammar_requested
from tracengine.vllm.spec import spec_accepted, spec_decode, spec_drafts
from tracengine.vllm.step_recorder import StepRecorder

RECORD_ENV = "TRACENGINE_RECORD"


def record_path(vllm_config) -> str | None:
    """Where to record: additional_config {"tracengine": {"record": PATH}} ("" for nowhere: a
    scheduler built by a replay), else $TRACENGINE_RECORD; None: not recording."""
    extra = vllm_config.additional_config
    options = extra.get("tracengine", {}) if isinstance(extra, dict) else {}
    if not isinstance(options, dict):
        raise ConfigError(f"additional_config's \"tracengine\" must be an object, got {options!r}")
    path = options["record"] if "record" in options else os.environ.get(RECORD_ENV)
    return path or None


class _Recording:
    """What RecordingScheduler and RecordingAsyncScheduler add to vLLM's scheduler."""

    def __init__(self, *args, **kwargs):
        vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        path = record_path(vllm_config)
        not_recorded = None
        if path:     # refused before vLLM builds anything (a KV connector, the encoder cache)
            not_recorded = refuse_unrecorded(vllm_config, kwargs["kv_cache_config"] if "kv_cache_config" in kwargs
                                             else args[1])
        super().__init__(*args, **kwargs)
        self.tracengine = None
        if path:
            from tracengine.trace.tracelog import TraceWriter
            from tracengine.vllm.header import trace_header
            header = trace_header(self, not_recorded)
            self.record_to(TraceWriter(path, header), header.created_at, not_recorded)

    def record_to(self, sink, created_at: float | None = None, not_recorded: list | None = None) -> StepRecorder:
        """Starts recording into `sink` (a trace writer, or a replay's comparing sink); a ConfigError
        for a config whose recording would not replay (features.py), unless recording anyway."""
        if sink is NULL_SINK or not sink.enabled:
            return None
        if self.tracengine is not None:
            raise RuntimeError("this scheduler is recording already")
        if not_recorded is None:
            not_recorded = refuse_unrecorded(self.vllm_config, self.kv_cache_config)
        self.tracengine = StepRecorder(self, sink, time.time() if created_at is None else created_at)
        self.tracengine.not_recorded = not_recorded
        observe_connector(self.tracengine)
        return self.tracengine

    def add_request(self, request) -> None:
        grammars = getattr(self.tracengine, "grammars", None)
        if grammars is not None:      # a replay: a recorded request's structured output, and its grammar
            grammars.prepare(request)
        super().add_request(request)
        recorder = self.tracengine
        if recorder is None:
            return
        found = request_features(request, self) if request.request_id not in recorder.seq_ids \
            else ()
        if found:
            self.stop_recording(f"request {request.request_id} uses {found[0]}, which tracengine does not "
                                f"record: the trace ends before it")
        else:
            recorder.request_added(request)
            grammar_requested(recorder, request)

    def stop_recording(self, reason: str) -> None:
        """Ends the trace where it is (its complete steps, and a RunEnd giving `reason`); the
        scheduler goes on, unrecorded."""
        from vllm.logger import init_logger
        init_logger(__name__).warning("tracengine: %s", reason)
        end_with = getattr(self.tracengine.sink, "end_with", None)
        if end_with is not None:
            end_with(ConfigError(reason))
        self.tracengine.close()
        self.tracengine = None

    def finish_requests(self, request_ids, finished_status):
        recorder = self.tracengine
        if recorder is None or request_ids is None:
            return super().finish_requests(request_ids, finished_status)
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        ids.sort(key=lambda req_id: recorder.seq_ids.get(req_id, -1))   # arrival order, not a set's
        reason = "error" if finished_status == recorder.status.FINISHED_ERROR else "client"
        finished = []
        step, num_free_before = recorder.current_step(), recorder.free_blocks()
        for req_id in ids:
            request = self.requests.get(req_id)
            if request is not None and not request.is_finished():
                if recorder.in_call == "update":    # the scheduler's own: a grammar that failed to compile
                    recorder.request_failed(request)
                else:
                    recorder.request_aborted(request, reason)
            finished += super().finish_requests(req_id, finished_status)
        recorder.count_freed(step, num_free_before)
        return finished

    def _preempt_request(self, request, timestamp, *args, **kwargs):
        if self.tracengine is not None:
            self.tracengine.preempted(request)
        return super()._preempt_request(request, timestamp, *args, **kwargs)

    def _handle_blocked_waiting_request(self, request) -> bool:
        recorder = self.tracengine
        was_waiting = recorder is not None and request.status == recorder.status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        ready = super()._handle_blocked_waiting_request(request)
        grammar_checked(recorder, request, was_waiting)
        return ready

    def _connector_finished(self, request):
        answer = super()._connector_finished(request)
        connector_finished(self.tracengine, request, answer)
        return answer

    def schedule(self, *args, **kwargs):
        recorder = self.tracengine
        if recorder is None:
            return super().schedule(*args, **kwargs)
        start_ns = time.perf_counter_ns()
        prefill_before = {r.request_id: r.is_prefill_chunk for r in self.running}
        recorder.in_call = "schedule"
        num_free_before = recorder.free_blocks()
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            recorder.in_call = "between"
        recorder.count_freed(recorder.num_scheduled, num_free_before)
        resumed = []
        if recorder.preempted_ids:
            resumed = [req_id for req_id in out.num_scheduled_tokens if req_id in recorder.preempted_ids
                       and self.requests[req_id].status == recorder.status.RUNNING]
            recorder.preempted_ids.difference_update(resumed)
            resumed = [recorder.seq_ids[req_id] for req_id in resumed]
        # before the decision, which counts the drafts in its seqs; a dynamic draft length's every step
        if out.scheduled_spec_decode_tokens or self.dynamic_sd_lookup is not None:
            event = spec_decode(recorder.num_scheduled, out, recorder.seq_ids, self.dynamic_sd_lookup is not None)
            if event is not None:
                recorder.emit(event)
        recorder.decision(out, prefill_before, resumed, start_ns)
        recorder.num_scheduled += 1
        return out

    def update_draft_token_ids(self, draft_token_ids) -> None:
        recorder = self.tracengine
        if recorder is not None:
            for event in spec_drafts(recorder.current_step(), draft_token_ids, recorder.seq_ids,
                                     recorder.num_in_flight):
                recorder.emit(event)
        super().update_draft_token_ids(draft_token_ids)

    def update_from_output(self, scheduler_output, model_runner_output):
        recorder = self.tracengine
        if recorder is None:
            return super().update_from_output(scheduler_output, model_runner_output)
        start_ns = time.perf_counter_ns()
        num_free_before = recorder.free_blocks()
        before = {}      # requests whose output is processed: their output tokens before
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is not None and not request.is_finished():
                before[req_id] = (request, request.num_output_tokens)
        # with drafts, vLLM cuts a request's sampled tokens at its stop, in place: their count first
        accepted = sampled = None
        if scheduler_output.scheduled_spec_decode_tokens:
            accepted = spec_accepted(recorder.num_updated, scheduler_output, model_runner_output, before,
                                     recorder.seq_ids)
            sampled = [list(tokens) for tokens in model_runner_output.sampled_token_ids]
        transfers_done(recorder, model_runner_output)
        frees = []
        steps = recorder.steps
        recorder.in_call = "update"
        recorder.steps = {recorder.num_updated: frees}     # the frees of finishing requests, kept aside
        try:
            result = super().update_from_output(scheduler_output, model_runner_output)
        finally:
            recorder.steps = steps
            recorder.in_call = "between"
        recorder.count_freed(recorder.num_updated, num_free_before)
        recorder.outputs(model_runner_output, before, frees, start_ns, accepted, sampled)
        recorder.num_updated += 1
        return result

    def shutdown(self) -> None:
        super().shutdown()
        if self.tracengine is not None:
            self.tracengine.close()
            self.tracengine = None


@functools.cache
def recording_classes() -> dict[str, type]:
    """RecordingScheduler and RecordingAsyncScheduler: vLLM's Scheduler and AsyncScheduler with
    `_Recording` in front, made once, when first asked for (tracengine.vllm's attributes ask), so
    that vLLM is imported then and not when this module is."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    class RecordingScheduler(_Recording, Scheduler):
        """vLLM's Scheduler, recording (`--scheduler-cls tracengine.vllm.RecordingScheduler`)."""

    class RecordingAsyncScheduler(_Recording, AsyncScheduler):
        """vLLM's AsyncScheduler (production's default), recording
        (`--scheduler-cls tracengine.vllm.RecordingAsyncScheduler`)."""

    classes = {cls.__name__: cls for cls in (RecordingScheduler, RecordingAsyncScheduler)}
    for cls in classes.values():    # named where vLLM (and pickle) find them: tracengine.vllm.NAME
        cls.__module__, cls.__qualname__ = "tracengine.vllm", cls.__name__
    return classes
