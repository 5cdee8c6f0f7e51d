"""Re-execution of an SGLang trace: SGLang's real Scheduler rebuilt from the header (build.py),
the recorded requests and aborts given to it before the steps they preceded, the recorded
tokens fed back as its model's output, and every event it records compared with the trace's,
stopping at the first difference (the report is tracengine's own: replay/render.py).

The loop is drive.py's: a request that arrives when the scheduler has nothing to do comes
after an idle iteration, as in SGLang's event loop (and in the driver)."""
from tracengine.errors import TraceError
from tracengine.replay.reexecution import ABORT, ADD, STEP, ComparingSink, Diverged, ReplayResult, replay
from tracengine.replay.state import RUNNING, WAITING, FoldState, SeqState
from tracengine.trace.events import RequestAdded, SeqAbort, StepEnd, TokenSample
from tracengine.trace.header import SGLANG, backend_of
from tracengine.trace.tracelog import split_header


def check_sglang_version(header) -> str:
    """The installed SGLang's version, which must be the recorded one."""
    from tracengine.replay.scheduler_backends import check_engine_version
    from tracengine.sglang import require_sglang
    return check_engine_version("SGLang", require_sglang, header.engine_version)


class RecordedTokens:
    """The stand-in worker's tokens in a replay: each request's token at each step, as recorded."""

    def __init__(self, events):
        self.tokens = {(e.step, e.seq_id): e.token_id for e in events if type(e) is TokenSample}
        self.seq_ids: dict[str, int] = {}
        self.step = 0

    def __call__(self, req, position: int) -> int:
        from tracengine.sglang.drive import FILLER_TOKEN_ID
        return self.tokens.get((self.step, self.seq_ids.get(req.rid, -1)), FILLER_TOKEN_ID)


def reexecute(events, config: dict | None = None) -> ReplayResult:
    """Re-executes an SGLang trace (TraceHeader first); `config`: the header's, unless given."""
    from tracengine.sglang.build import build_scheduler
    from tracengine.sglang.recorder import record_to, stop_recording
    from tracengine.trace.sinks import ListSink
    header, it = split_header(events)
    if backend_of(header) != SGLANG:
        raise TraceError(f"the trace's decisions are {header.engine}'s, not SGLang's")
    check_sglang_version(header)
    recorded = list(it)
    tokens = RecordedTokens(recorded)
    scheduler = build_scheduler(header.config if config is None else config, tokens)
    sink = ListSink()
    recorder = record_to(scheduler, sink, header.created_at)
    recorder.format_version = header.format_version     # an older trace's events, as its format recorded them
    tokens.seq_ids = recorder.seq_ids
    try:
        return replay(SglangReplay(scheduler, recorder, sink, recorded, tokens))
    finally:
        stop_recording(scheduler)


class SglangReplay:
    """SGLang's scheduler as a replaying engine (replay/reexecution.py), run as its loop runs it
    (drive.py): a step's requests and aborts reach it together before the step (after an idle
    iteration when it has nothing to do, as in SGLang's event loop), then it iterates until a
    step ran. Its events are compared, in the trace's order, after each iteration; the overlap
    loop's last result comes after the last step."""
    no_abort = ""
    nothing_left = "the replay's scheduler has nothing to run where the trace has a step"

    def __init__(self, scheduler, recorder, emitted, recorded, tokens):
        self.scheduler, self.recorder, self.emitted, self.tokens = scheduler, recorder, emitted, tokens
        self.sink = ComparingSink(recorded)
        self.num_steps = sum(1 for e in recorded if type(e) is StepEnd)
        self.arrivals: dict[int, list] = {}
        for e in recorded:
            if type(e) in (RequestAdded, SeqAbort):
                self.arrivals.setdefault(e.step, []).append(e)
        # the recorded ids: a request aborted in the step it arrived is not in the recorder's map yet
        self.request_ids = {e.seq_id: e.request_id for e in recorded if type(e) is RequestAdded}
        self.pending = []          # the requests and aborts for the next step: SGLang's and as recorded
        self.pending_events = []
        self.step_no = 0

    def calls(self):
        from tracengine.sglang.drive import iterate
        while self.step_no < self.num_steps:
            for e in self.arrivals.pop(self.step_no, ()):
                yield (ADD if type(e) is RequestAdded else ABORT), e
            yield STEP, self.step_no
        while getattr(self.scheduler, "result_queue", None):     # the overlap loop: the last batch's result
            iterate(self.scheduler)
        self._compare()
        sink = self.sink
        if sink.index < len(sink.expected) and type(sink.expected[sink.index]) is not RequestAdded:
            raise sink.missing()

    def add(self, index: int, e: RequestAdded) -> None:
        from tracengine.sglang.drive import generate_request
        self.pending_events.append(e)
        self.pending.append(generate_request(
            e.request_id, e.prompt_token_ids, e.max_tokens, ignore_eos=e.ignore_eos, temperature=e.temperature,
            top_k=e.top_k, top_p=e.top_p, min_tokens=e.min_tokens, stop_token_ids=e.stop_token_ids))

    def abort(self, seq_id: int, reason: str) -> bool:
        from tracengine.sglang.drive import abort_request
        self.pending.append(abort_request(self.request_ids[seq_id]))
        return True

    def feed(self, step: int) -> None:
        from tracengine.sglang.drive import has_work, iterate
        self.tokens.step = step
        if self.pending:
            if not has_work(self.scheduler) or _health_check_waited(self.scheduler, self.pending_events):
                iterate(self.scheduler)
            self.scheduler.process_input_requests(self.pending)
            self.pending, self.pending_events = [], []

    def is_finished(self) -> bool:
        from tracengine.sglang.drive import has_work
        return not has_work(self.scheduler)

    def step(self) -> None:
        from tracengine.sglang.drive import iterate
        if iterate(self.scheduler):
            self.step_no += 1
        self._compare()

    def _compare(self) -> None:
        """The events emitted since the last comparison, in the trace's order."""
        emitted, sink = self.emitted.events, self.sink
        for i in range(sink.index, len(emitted)):
            sink.compare(emitted[i])

    def diverged(self, d: Diverged):
        """Its step: the loop's where it had nothing to run, else the step of the events compared
        (the overlap loop emits a step's result during the next step's iteration); its index: in
        the step the events matched so far end in."""
        recorded, index = self.sink.expected, self.sink.index
        frame_start = next((i + 1 for i in range(index - 1, -1, -1) if type(recorded[i]) is StepEnd), 0)
        step = self.step_no if d.reason == self.nothing_left else (d.expected or d.actual).step
        state = live_sglang_state(self.scheduler, step, self.recorder.seq_ids)
        num_steps = sum(1 for e in recorded[:frame_start] if type(e) is StepEnd)
        return {"step": step, "index": index - frame_start, "state": state}, num_steps, index

    def replayed(self):
        scheduler = self.scheduler
        num_unfinished = len(scheduler.waiting_queue) + sum(1 for req in scheduler.running_batch.reqs
                                                            if not req.finished())
        return self.num_steps, self.sink.index, num_unfinished


def live_sglang_state(scheduler, step: int, seq_ids: dict[str, int]) -> FoldState:
    """A live SGLang scheduler in tracengine's terms: its queues and each request's token slots."""
    seqs: dict[int, SeqState] = {}

    def seq_state(req, status: str) -> int:
        seq_id = seq_ids.get(req.rid, -1)
        num_tokens = len(req.origin_input_ids) + len(req.output_ids)
        slots = []
        if req.kv.req_pool_idx is not None and req.kv.kv_allocated_len:
            slots = scheduler.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :req.kv.kv_allocated_len].tolist()
        seqs[seq_id] = SeqState(seq_id, status, len(req.origin_input_ids), num_tokens, len(slots),
                                block_table=slots, num_preemptions=req.retraction_count)
        return seq_id

    waiting = [seq_state(req, WAITING) for req in scheduler.waiting_queue]
    running = [seq_state(req, RUNNING) for req in scheduler.running_batch.reqs if not req.finished()]
    # the pool's slots as the fold has them (replay/sglang_fold.py): N slots are N+1 cells, slot 0
    # SGLang's padding slot; a slot's count is the requests' tables that hold it
    allocator = scheduler.token_to_kv_pool_allocator
    ref_counts = [0] * (allocator.size + 1)
    for seq in seqs.values():
        for slot in seq.block_table:
            ref_counts[slot] += 1
    free_slots = allocator.free_pages.tolist() + allocator.release_pages.tolist()
    return FoldState(step, waiting, running, seqs, ref_counts, [-1] * len(ref_counts), free_slots, {}, None, 1)


def _health_check_waited(scheduler, due) -> bool:
    """SGLang's server admits a health check request (rid HEALTH_CHECK_...) only into a fully
    idle scheduler (it drops it otherwise): one recorded came after the idle iteration that
    cleared the last batch, which the replay so runs first."""
    from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX
    return any(e.request_id.startswith(HEALTH_CHECK_RID_PREFIX) for e in due) \
        and not scheduler.is_fully_idle(for_health_check=True)
