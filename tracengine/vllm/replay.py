"""Re-execution of a vLLM trace: vLLM's real scheduler rebuilt from the
header, the recorded requests and aborts given to it at the points between
calls where they came, the recorded sampled tokens fed back as its model
output, and every event it records compared with the trace's, stopping at
the first difference (the report is tracengine's own: replay/render.py).

The calls are made in the recorded order: step k is scheduled when the
previous steps are; its output is processed once `num_scheduled_ahead`
more steps have been scheduled (async scheduling); a request or an abort
comes when `step` steps have been scheduled and `step -
num_steps_in_flight` updated, and so do the drafts the engine core gave
(SpecDraft, speculative decoding). A step's events are compared right after its
`schedule()` (so a different batch is reported before its output is fed)
and again, whole, when its frame is written."""
from tracengine.errors import TraceError
from tracengine.trace.views import iter_steps
from tracengine.replay.reexecution import (ABORT, ADD, OWN, STEP, ComparingSink, Diverged, ReplayResult, check_emitted,
                                           replay)
from tracengine.trace.events import RequestAdded, SeqAbort, SpecDraft, StepEnd, TokenSample
from tracengine.trace.tracelog import split_header
from tracengine.vllm.answers import answer_from
from tracengine.vllm.state import live_vllm_state
from tracengine.trace.header import VLLM, backend_of


def check_vllm_version(header) -> str:
    """The installed vLLM's version, which must be the recorded one."""
    from tracengine.replay.scheduler_backends import check_engine_version
    from tracengine.vllm import require_vllm
    return check_engine_version("vLLM", require_vllm, header.engine_version)


def reexecute(events, config: dict | None = None) -> ReplayResult:
    """Re-executes a vLLM trace (TraceHeader first); `config`: the header's, unless given."""
    from tracengine.vllm.build import build_scheduler
    header, it = split_header(events)
    if backend_of(header) != VLLM:
        raise TraceError(f"the trace's decisions are {header.engine}'s, not vLLM's")
    check_vllm_version(header)
    scheduler = build_scheduler(header.config if config is None else config)
    sink = ComparingSink()
    recorder = scheduler.record_to(sink, header.created_at, header.not_recorded or None)   # recorded anyway: said
    frames = list(iter_steps(it))
    answer_from(scheduler, frames)     # a recorded connector's and grammars' answers (stand-ins)
    return replay(VllmReplay(scheduler, recorder, sink, frames))


class VllmReplay:
    """vLLM's scheduler as a replaying engine (replay/reexecution.py), called as its engine core
    calls it: a STEP is the next of its calls in the recorded order, a schedule() (its events
    compared at once, so a different batch is reported before its output is fed) or an
    update_from_output() of a step scheduled earlier, fed the step's recorded tokens (its frame
    compared whole); the requests, aborts and drafts come between them where they came."""
    no_abort = "the replay has no request s{seq_id} to abort"
    nothing_left = ""

    def __init__(self, scheduler, recorder, sink, frames):
        self.scheduler, self.recorder, self.sink = scheduler, recorder, sink
        self.frames = frames
        self.num_steps = sum(1 for f in frames if type(f[-1]) is StepEnd)
        self.arrivals = [e for f in frames for e in f if type(e) in (RequestAdded, SeqAbort, SpecDraft)]
        self.request_ids: dict[int, str] = {}
        self.outputs: dict[int, object] = {}     # step -> its SchedulerOutput, until its update
        self.num_events = 0
        self.step_no = 0
        self.next_call = None                    # (update or not, step) of the STEP about to run

    def calls(self):
        num_scheduled = num_updated = next_arrival = 0
        frames, arrivals = self.frames, self.arrivals
        while True:
            if next_arrival < len(arrivals):
                e = arrivals[next_arrival]
                if (e.step, e.step - e.num_steps_in_flight) == (num_scheduled, num_updated):
                    self.step_no = e.step
                    next_arrival += 1
                    yield (ADD if type(e) is RequestAdded else ABORT if type(e) is SeqAbort else OWN), e
                    continue
            if num_updated < num_scheduled and \
                    num_scheduled == num_updated + 1 + frames[num_updated][-1].num_scheduled_ahead:
                self.step_no = num_updated
                yield STEP, (True, num_updated)
                num_updated += 1
            elif num_scheduled < self.num_steps:
                self.step_no = num_scheduled
                yield STEP, (False, num_scheduled)
                num_scheduled += 1
            else:
                break
        if next_arrival < len(arrivals):
            e = arrivals[next_arrival]
            raise Diverged(e, None, "the replay never came to the point where the trace has this event", 0)

    def add(self, index: int, e: RequestAdded) -> None:
        from tracengine.vllm.drive import make_request
        scheduler = self.scheduler
        self.request_ids[e.seq_id] = e.request_id
        cache = scheduler.vllm_config.cache_config
        scheduler.add_request(make_request(
            e.request_id, e.prompt_token_ids, max_tokens=e.max_tokens, arrival_time=e.arrival_time,
            block_size=scheduler.block_size, hash_algo=cache.prefix_caching_hash_algo, priority=e.priority,
            ignore_eos=e.ignore_eos, eos_token_id=None if e.eos_token_id == -1 else e.eos_token_id,
            temperature=e.temperature, top_k=max(e.top_k, 0), top_p=e.top_p,
            seed=None if e.seed == -1 else e.seed, min_tokens=e.min_tokens, stop_token_ids=e.stop_token_ids,
            **lora_request(e)))

    def abort(self, seq_id: int, reason: str) -> bool:
        from vllm.v1.request import RequestStatus
        status = RequestStatus.FINISHED_ERROR if reason == "error" else RequestStatus.FINISHED_ABORTED
        return bool(self.scheduler.finish_requests(self.request_ids.get(seq_id, ""), status))

    def own(self, e: SpecDraft) -> None:
        """The engine core's drafts, after a step's output."""
        from vllm.v1.outputs import DraftTokenIds
        self.scheduler.update_draft_token_ids(DraftTokenIds([self.request_ids[e.seq_id]], [list(e.token_ids)]))

    def feed(self, call) -> None:
        self.next_call = call

    def is_finished(self) -> bool:
        return False      # a call in the recorded order always has a scheduler to make it to

    def step(self) -> None:
        update, step = self.next_call
        if not update:
            self.outputs[step] = self.scheduler.schedule()
            check_emitted(self.frames[step], self.recorder.steps.get(step, ()))
            return
        from tracengine.vllm.drive import model_output
        out = self.outputs.pop(step)
        frame = self.frames[step]
        tokens: dict[str, list[int]] = {}
        for e in frame:
            if type(e) is TokenSample:
                tokens.setdefault(self.request_ids[e.seq_id], []).append(e.token_id)
        self.sink.expected, self.sink.index = frame, 0
        self.scheduler.update_from_output(out, model_output(out.num_scheduled_tokens, tokens))
        if self.sink.index < len(frame):
            raise self.sink.missing()
        self.num_events += len(frame)

    def diverged(self, d: Diverged):
        index = self.sink.index if d.index is None else d.index
        state = live_vllm_state(self.scheduler, self.step_no, self.recorder.seq_ids)
        return {"step": self.step_no, "index": index, "state": state}, self.step_no, self.num_events + index

    def replayed(self):
        num_running, num_waiting = self.scheduler.get_request_counts()
        return self.num_steps, self.num_events, num_running + num_waiting


def lora_request(e: RequestAdded) -> dict:
    """make_request's lora_request of a recorded request's adapter ({}: none); the scheduler reads
    its id only, never the adapter's path."""
    if not e.lora_id:
        return {}
    from vllm.lora.request import LoRARequest
    return {"lora_request": LoRARequest(e.lora_name, e.lora_id, f"tracengine-not-recorded/{e.lora_name}")}

