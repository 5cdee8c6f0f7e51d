"""Re-execution of an SGLang trace: SGLang's real Scheduler rebuilt from the header (build.py),
the recorded requests and aborts given to it before the steps they preceded, the recorded
tokens fed back as its model's output, and every event it records compared with the trace's,
stopping at the first difference (the report is tracengine's own: replay/render.py).

The loop is drive.py's: a request that arrives when the scheduler has nothing to do comes
after an idle iteration, as in SGLang's event loop (and in the driver)."""
import time

from tracengine.errors import TraceError, TraceVersionError
from tracengine.replay.reexec import _COMPARED, Divergence, ReplayResult
from tracengine.replay.state import RUNNING, WAITING, FoldState, SeqState
from tracengine.trace.events import RequestAdded, SeqAbort, StepEnd, TokenSample
from tracengine.trace.header import SGLANG, backend_of
from tracengine.trace.tracelog import split_header


def check_sglang_version(header) -> str:
    """The installed SGLang's version, which must be the recorded one."""
    from tracengine.sglang import require_sglang
    version = require_sglang(f"the trace was recorded with SGLang {header.engine_version}", header.engine_version)
    if version != header.engine_version:
        raise TraceVersionError(f"the trace was recorded with SGLang {header.engine_version}; the installed SGLang "
                                f"is {version} (a replay needs the recorded version)")
    return version


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
    start = time.perf_counter()
    try:
        return _Replay(scheduler, recorder, sink, recorded, tokens).run(start)
    finally:
        stop_recording(scheduler)


class _Replay:
    def __init__(self, scheduler, recorder, sink, recorded, tokens):
        self.scheduler, self.recorder, self.sink, self.recorded, self.tokens = scheduler, recorder, sink, recorded, tokens
        self.num_steps = sum(1 for e in recorded if type(e) is StepEnd)
        self.arrivals: dict[int, list] = {}
        for e in recorded:
            if type(e) in (RequestAdded, SeqAbort):
                self.arrivals.setdefault(e.step, []).append(e)
        self.request_ids = {e.seq_id: e.request_id for e in recorded if type(e) is RequestAdded}
        self.num_compared = 0
        self.frame_start = 0      # the index of the current step's first event

    def run(self, start: float) -> ReplayResult:
        from tracengine.sglang.drive import abort_request, generate_request, has_work, iterate
        scheduler = self.scheduler
        step = 0
        while step < self.num_steps:
            self.tokens.step = step
            due = self.arrivals.pop(step, None)
            if due:
                if not has_work(scheduler) or _health_check_waited(scheduler, due):
                    iterate(scheduler)
                scheduler.process_input_requests([
                    generate_request(e.request_id, e.prompt_token_ids, e.max_tokens, ignore_eos=e.ignore_eos,
                                     temperature=e.temperature, top_k=e.top_k, top_p=e.top_p, min_tokens=e.min_tokens,
                                     stop_token_ids=e.stop_token_ids) if type(e) is RequestAdded
                    else abort_request(self._request_id(e.seq_id)) for e in due])
            if not has_work(scheduler):
                return self._diverged(step, start, "the replay's scheduler has nothing to run where the trace has a step")
            if iterate(scheduler):
                step += 1
            divergence = self._compare(step)
            if divergence is not None:
                return divergence_result(divergence, self, start)
        while getattr(scheduler, "result_queue", None):     # the overlap loop: the last batch's result
            iterate(scheduler)
        divergence = self._compare(step, final=True)
        if divergence is not None:
            return divergence_result(divergence, self, start)
        num_unfinished = len(scheduler.waiting_queue) + sum(1 for req in scheduler.running_batch.reqs if not req.finished())
        return ReplayResult(self.num_steps, self.num_compared, time.perf_counter() - start,
                            num_unfinished=num_unfinished)

    def _request_id(self, seq_id: int) -> str:
        # the recorded one: a request aborted in the step it arrived is not in the recorder's map yet
        return self.request_ids[seq_id]

    def _compare(self, step: int, final: bool = False):
        """The events emitted since the last comparison against the trace's; a Divergence or None."""
        emitted, recorded = self.sink.events, self.recorded
        for i in range(self.num_compared, len(emitted)):
            event = emitted[i]
            expected = recorded[i] if i < len(recorded) else None
            if expected is None:
                return self._divergence(i, None, event, "the replay emitted an event the trace does not have")
            if not _same(expected, event):
                return self._divergence(i, expected, event, "the replay emitted a different event")
            self.num_compared = i + 1
            if type(event) is StepEnd:
                self.frame_start = i + 1
        if final and self.num_compared < len(recorded) and type(recorded[self.num_compared]) is not RequestAdded:
            return self._divergence(self.num_compared, recorded[self.num_compared], None,
                                    "the trace has an event the replay did not emit")
        return None

    def _divergence(self, i: int, expected, actual, reason: str) -> Divergence:
        step = (expected or actual).step
        return Divergence(step, i - self.frame_start, expected, actual, reason,
                          live_sglang_state(self.scheduler, step, self.recorder.seq_ids))

    def _diverged(self, step: int, start: float, reason: str) -> ReplayResult:
        i = self.num_compared
        expected = self.recorded[i] if i < len(self.recorded) else None
        d = Divergence(step, i - self.frame_start, expected, None, reason,
                       live_sglang_state(self.scheduler, step, self.recorder.seq_ids))
        return divergence_result(d, self, start)


def _health_check_waited(scheduler, due) -> bool:
    """SGLang's server admits a health check request (rid HEALTH_CHECK_...) only into a fully
    idle scheduler (it drops it otherwise): one recorded came after the idle iteration that
    cleared the last batch, which the replay so runs first."""
    from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX
    return any(type(e) is RequestAdded and e.request_id.startswith(HEALTH_CHECK_RID_PREFIX) for e in due) \
        and not scheduler.is_fully_idle(for_health_check=True)


def divergence_result(divergence: Divergence, replay: _Replay, start: float) -> ReplayResult:
    num_steps = sum(1 for e in replay.recorded[:replay.frame_start] if type(e) is StepEnd)
    return ReplayResult(num_steps, replay.num_compared, time.perf_counter() - start, divergence)


def _same(recorded, event) -> bool:
    return recorded == event or (type(recorded) is type(event)
                                 and _COMPARED[type(event)](recorded) == _COMPARED[type(event)](event))


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
    return FoldState(step, waiting, running, seqs, [], [], [], {}, None, 1)
