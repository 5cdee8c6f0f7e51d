"""The events of one SGLang scheduler, as the hooks (recorder.py) see its calls: each request as
it is queued, each step's batch as `get_next_batch_to_run` chose it (with the token-pool slots
it was given: a radix-cache prefix match and the new slots), the retractions it made, the
slots the token pool got back (frees, radix evictions), and the output `process_batch_result`
processed. Slots are token-pool indices: a "block" of one token (page_size 1)."""
import time

from tracengine.sglang.prefill_recorder import STOP_REASONS, prefill_events
from tracengine.trace.events import (BlockAllocate, BlockAppend, BlockFree, Preempt, RequestAdded, ScheduledSeq,
                                     ScheduleDecision, SeqAbort, SeqFinish, StepEnd, TokenSample)
from tracengine.trace.sglang_events import SGLANG_EVENTS_SINCE


class StepRecorder:
    """The events of one SGLang scheduler. The normal loop runs a step's calls in order, and its
    events are written to `sink` as they come; the overlap loop chooses a step's batch before
    the last one's result is processed, so its events are kept per step and a step's frame is
    written whole when its StepEnd is (as vLLM's async scheduling's are, vllm/step_recorder.py)."""

    def __init__(self, scheduler, sink, created_at: float):
        self.scheduler = scheduler
        self.sink = sink
        self.created_at = created_at
        self.seq_ids: dict[str, int] = {}
        self.num_decided = 0               # batches chosen so far (a step: a batch chosen, run and processed)
        self.num_processed = 0             # batches whose result was processed (StepEnds written)
        self.in_call = "between"           # "decide" (get_next_batch_to_run), "process" or "between"
        self.overlap = bool(scheduler.enable_overlap)
        self.pending: dict[int, list] = {}     # the overlap loop's events by step, until its frame is written
        self.retracted: set[str] = set()   # requests retracted and not yet admitted again
        self.frees: list | None = None     # the frees of the call under way, held for after its decision
        self.timing: dict[int, list] = {}  # step -> [schedule_ns, model_ns, gap_ns] until its StepEnd
        self.last_end_ns = time.perf_counter_ns()
        self.step_times = None             # step -> (schedule_ns, model_ns, postprocess_ns, gap_ns), instead of the clock's
        self.arrival_ns: dict[str, int] = {}   # a request's arrival (ns from created_at) where its driver knows it
        self.last_decision = None          # the ScheduleDecision of the step under way (a step-time model reads it)
        self.prefill = None                # the prefill attempt of the call under way (prefill_recorder.py)
        self.full_reason = "no_token"      # the PrefillStop reason that last left the running batch full
        self.format_version = None         # a replay of an older trace records as that format did (None: the newest)

    @property
    def step(self) -> int:
        """Inside get_next_batch_to_run: the step chosen; inside process_batch_result: the step
        processed; between calls: the next step to be chosen (requests and aborts precede it)."""
        return self.num_processed if self.in_call == "process" else self.num_decided

    def emit(self, event) -> None:
        if self.overlap:
            self.pending.setdefault(event.step, []).append(event)
        else:
            self.sink.emit(event)

    def write_frame(self, step: int) -> None:
        for event in self.pending.pop(step, ()):
            self.sink.emit(event)

    def free_slots(self) -> int:
        return self.scheduler.token_to_kv_pool_allocator.available_size()

    def free_slots_after(self, step: int) -> int:
        """The free slots as the events up to `step`'s leave them: in the overlap loop the next
        step's batch took its slots (and its choice freed some) before this step's result came."""
        num_free = self.free_slots()
        for later in range(step + 1, self.num_decided + 1):
            for event in self.pending.get(later, ()):
                t = type(event)
                if t is BlockAllocate:
                    num_free += len(event.block_ids) - event.num_cached_blocks
                elif t is BlockAppend:
                    num_free += 1
                elif t is BlockFree:
                    num_free -= len(event.block_ids)
        return num_free

    def slots(self, req, end: int) -> list[int]:
        return self.scheduler.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :end].tolist()

    # -- requests in and out -------------------------------------------------------------------

    def request_added(self, req) -> None:
        if req.rid in self.seq_ids:
            return
        seq_id = self.seq_ids[req.rid] = len(self.seq_ids)
        params = req.sampling_params
        stop_ids = sorted(params.stop_token_ids or ())
        self.emit(RequestAdded(
            self.step, seq_id, list(req.origin_input_ids), params.max_new_tokens, params.temperature,
            params.ignore_eos, arrival_ns=self.arrival_ns.get(req.rid, -1),
            top_k=params.top_k if 0 < params.top_k < (1 << 30) else -1, top_p=params.top_p,
            request_id=req.rid, priority=req.priority or 0, min_tokens=params.min_new_tokens,
            stop_token_ids=stop_ids))

    def request_aborted(self, req, status: str) -> None:
        seq_id = self.seq_ids.get(req.rid)
        if seq_id is not None:
            self.emit(SeqAbort(self.step, seq_id, "client", status, len(req.origin_input_ids), len(req.output_ids)))

    # -- the token pool, observed ----------------------------------------------------------------

    def freed(self, indices) -> None:
        event = BlockFree(self.step, -1, indices.tolist())
        if self.frees is not None:
            self.frees.append(event)
        else:
            self.emit(event)

    def retracted_reqs(self, before: dict, reqs) -> None:
        """Retractions (SGLang's preemption): each request's slots before it gave them back."""
        for req in reqs:
            self.retracted.add(req.rid)
            slots = before.get(req.rid, [])
            self.emit(Preempt(self.step, self.seq_ids[req.rid], self.seq_ids[req.rid], slots[::-1], len(slots)))

    # -- a step ---------------------------------------------------------------------------------

    def decision(self, batch) -> None:
        """The ScheduleDecision of the batch `get_next_batch_to_run` chose, and its slots."""
        scheduler, step, seq_ids = self.scheduler, self.step, self.seq_ids
        mode = batch.forward_mode
        decodes, prefills, allocations = [], [], []
        out_cache_loc = batch.out_cache_loc.tolist()
        if mode.is_decode():
            for req, loc, seq_len in zip(batch.reqs, out_cache_loc, batch.seq_lens_cpu.tolist()):
                decodes.append(ScheduledSeq(seq_ids[req.rid], 1, seq_len - 1))
                allocations.append(BlockAppend(step, seq_ids[req.rid], loc))
        else:
            decoding = {id(req) for req in (batch.decoding_reqs or ())}
            start = 0
            for req, num_new, num_cached in zip(batch.reqs, batch.extend_lens, batch.prefix_lens):
                seq_id = seq_ids[req.rid]
                new = out_cache_loc[start:start + num_new]
                start += num_new
                if id(req) in decoding:
                    decodes.append(ScheduledSeq(seq_id, num_new, num_cached))
                    allocations.extend(BlockAppend(step, seq_id, loc) for loc in new)
                else:
                    prefills.append(ScheduledSeq(seq_id, num_new, num_cached))
                    allocations.append(BlockAllocate(step, seq_id, self.slots(req, num_cached) + new, num_cached))
        resumed = [seq_ids[req.rid] for req in batch.reqs if req.rid in self.retracted and not mode.is_decode()]
        self.retracted.difference_update(r.rid for r in batch.reqs if seq_ids[r.rid] in resumed)
        phase = "decode" if not prefills else "prefill" if not decodes else "mixed"
        num_waiting = len(scheduler.waiting_queue)
        num_tokens = sum(s.num_tokens for s in decodes + prefills)
        order = stop = None
        if self.format_version is None or self.format_version >= SGLANG_EVENTS_SINCE:
            order, stop = prefill_events(self, step)
            stop_reason = STOP_REASONS[self.full_reason if stop.reason == "batch_full" else stop.reason]
            if stop.reason in ("no_token", "max_running_requests"):
                self.full_reason = stop.reason
        else:
            stop_reason = self._stop_reason(batch, num_waiting)
        self.last_decision = ScheduleDecision(step, phase, decodes + prefills, num_tokens, stop_reason, -1, 0,
                                              self.free_slots(), num_waiting, len(batch.reqs),
                                              len(decodes) if phase == "mixed" else 0, resumed)
        self.emit(self.last_decision)
        for event in (order, stop):
            if event is not None:
                self.emit(event)
        for event in allocations:
            self.emit(event)

    def _stop_reason(self, batch, num_waiting: int) -> str:
        """Format 12's stop reason, inferred from the state after the step (format 13 reads the
        prefill adder's: prefill_recorder.py)."""
        scheduler = self.scheduler
        if num_waiting == 0:
            return "waiting_empty"
        if len(batch.reqs) >= scheduler.max_running_requests:
            return "max_num_seqs"
        if scheduler.chunked_req is not None:
            return "budget_exhausted"
        return "no_free_blocks"

    def outputs(self, batch, tokens: list[int], before: list[tuple], postprocess_start_ns: int) -> None:
        """TokenSample and SeqFinish of the output `process_batch_result` processed, then StepEnd.
        `before`: per request of the batch, (its output length, whether it had finished)."""
        step, seq_ids = self.step, self.seq_ids
        finished = []
        for req, token_id, (num_before, was_finished) in zip(batch.reqs, tokens, before):
            if was_finished:
                continue
            seq_id = seq_ids[req.rid]
            self.emit(TokenSample(step, seq_id, token_id, len(req.output_ids) > num_before))
            if req.finished():
                finished.append(req)
        for req in finished:
            reason = type(req.finished_reason).__name__
            self.emit(SeqFinish(step, seq_ids[req.rid], _FINISH_REASONS.get(reason, "error"),
                                len(req.origin_input_ids), len(req.output_ids)))
        end_ns = time.perf_counter_ns()
        schedule_ns, model_ns, gap_ns = self.timing.pop(step, (0, 0, 0))
        times = self.step_times(step) if self.step_times is not None else \
            (schedule_ns, model_ns, end_ns - postprocess_start_ns, gap_ns)
        self.emit(StepEnd(step, self.free_slots_after(step), *times))
        if self.overlap:
            self.write_frame(step)
        self.last_end_ns = end_ns
        self.num_processed += 1

    def close(self) -> None:
        for step in sorted(self.pending):       # requests that came after the last step
            self.write_frame(step)
        close = getattr(self.sink, "close", None)
        if close is not None:
            close()


# SGLang's finish reasons (schedule_batch.FINISH_*), in tracengine's words
_FINISH_REASONS = {"FINISH_LENGTH": "length", "FINISH_MATCHED_TOKEN": "eos", "FINISH_MATCHED_STR": "stop",
                   "FINISHED_MATCHED_REGEX": "stop"}
