"""Driving vLLM's scheduler as vLLM's engine core does, with no model:
requests arrive at their steps, each step is `schedule()`, a fabricated
ModelRunnerOutput, `update_from_output()`. With async scheduling (vLLM's
`step_with_batch_queue`, two batches in flight) step k's output comes back
after step k+1 is scheduled. The fabricated output follows vLLM's own tests:
one sampled token for a request that reached the end of what it had to
compute, an empty list for one still mid-prefill."""
import functools
from collections import deque
from dataclasses import dataclass, field

from tracengine.errors import TracengineError
from tracengine.sim.clock import Stepped, decision_times, in_arrival_order, run_in_time
from tracengine.trace.events import ScheduleDecision
from tracengine.vllm.synthetic import synthetic_acceptance

EOS_TOKEN_ID = 2
FILLER_TOKEN_IDS = (0, 1)     # past a recorded output: the first that stops nothing
# made-up tokens (here and executor.py's) are FIRST_TOKEN_ID .. FIRST_TOKEN_ID + NUM_TOKEN_IDS - 1
FIRST_TOKEN_ID = 100
NUM_TOKEN_IDS = 900


@dataclass
class RequestSpec:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_step: int = 0
    priority: int = 0
    eos_after: int = 0        # > 0: the model samples EOS as this output token (1 = the first)
    stop_token_ids: list[int] = field(default_factory=list)
    # A recorded request (what-if): the tokens the model gave it, in order (past them, FILLER);
    # its own sampling parameters and arrival time (None: from eos_after, and its index).
    output_token_ids: list[int] | None = None
    sampling: dict | None = None
    arrival_time: float | None = None
    # In simulated time (timed.py): when it arrives and, a client that left, when it leaves (ns)
    arrival_ns: int = 0
    abort_ns: int | None = None
    # More of vLLM's Request fields (a LoRA adapter: lora_request; a test's cache_salt)
    request_options: dict | None = None
    # Speculative decoding: the request's drafts (spec.Drafts: a recording's); None: made up
    drafts: object = None


def make_request(request_id: str, prompt_token_ids, *, max_tokens: int, arrival_time: float, block_size: int,
                 hash_algo: str = "sha256", priority: int = 0, ignore_eos: bool = True, eos_token_id=None,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed=None, min_tokens: int = 0,
                 stop_token_ids=(), **request_options):
    """A vLLM Request as the engine core hands it to the scheduler (block hashes included);
    `request_options`: more of Request's fields (lora_request, cache_salt)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name(hash_algo)
    init_none_hash(hash_fn)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, min_tokens=min_tokens, stop_token_ids=list(stop_token_ids))
    params.update_from_generation_config({}, eos_token_id)
    return Request(request_id, list(prompt_token_ids), params, None, arrival_time=arrival_time, priority=priority,
                   block_hasher=get_request_block_hasher(block_size, hash_fn), **request_options)


def model_output(req_ids, tokens: dict):
    """A ModelRunnerOutput: `tokens[req_id]` (a list) for each request scheduled, [] if none."""
    from vllm.v1.outputs import ModelRunnerOutput
    req_ids = list(req_ids)
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                             sampled_token_ids=[list(tokens.get(r, ())) for r in req_ids])


def sampling_req_ids(scheduler, out) -> list[str]:
    """The requests of a step just scheduled that sample a token: those whose scheduled tokens
    reach the end of what they had to compute (vLLM's `is_prefill_chunk` is then false)."""
    return [req_id for req_id in out.num_scheduled_tokens if not scheduler.requests[req_id].is_prefill_chunk]


class Driver:
    """A workload's requests for one scheduler, as both loops (steps here, simulated time in
    timed.py) give them: each added as the engine core adds it, and each step's tokens made up
    (a recorded request's own, EOS where a spec says, else a token that stops nothing)."""

    def __init__(self, scheduler, specs: list[RequestSpec], past_output: set | None = None):
        self.scheduler = scheduler
        self.block_size = scheduler.block_size
        self.hash_algo = scheduler.vllm_config.cache_config.prefix_caching_hash_algo
        self.index = {spec.request_id: i for i, spec in enumerate(specs)}
        self.by_id = {spec.request_id: spec for spec in specs}
        self.past_output = past_output
        # speculative decoding: drafts given (synchronous scheduling) or drafted by the worker
        # (async); every request's drafts as given and verified, a what-if's `RequestSpec.drafts`
        self.spec_decoding = scheduler.vllm_config.speculative_config is not None
        self.async_drafts = self.spec_decoding and batch_queue_size(scheduler) > 1
        self.synthetic = synthetic_acceptance(scheduler) if self.spec_decoding else None   # synthetic.py
        self.drafts_log: dict = {}

    def add(self, spec: RequestSpec) -> None:
        sampling = spec.sampling if spec.sampling is not None else dict(
            ignore_eos=not spec.eos_after, eos_token_id=EOS_TOKEN_ID if spec.eos_after else None,
            stop_token_ids=spec.stop_token_ids)
        arrival_time = spec.arrival_time if spec.arrival_time is not None else float(self.index[spec.request_id])
        self.scheduler.add_request(make_request(
            spec.request_id, spec.prompt_token_ids, max_tokens=spec.max_tokens, arrival_time=arrival_time,
            block_size=self.block_size, hash_algo=self.hash_algo, priority=spec.priority, **sampling,
            **(spec.request_options or {})))

    def token_at(self, req_id: str, position: int, peek: bool = False) -> int:
        """The token a request samples at output position `position` (0: its first); `peek`: not
        one it keeps for sure (a draft's, past the step's first), never counted as past its output."""
        spec = self.by_id[req_id]
        if spec.output_token_ids is not None:
            return recorded_token(spec, position, None if peek else self.past_output)
        if spec.eos_after and position + 1 >= spec.eos_after:
            return EOS_TOKEN_ID
        return FIRST_TOKEN_ID + (self.index[req_id] * 31 + position) % NUM_TOKEN_IDS

    def tokens(self, req_ids, out=None) -> dict:
        """The sampled tokens of the requests of a step that sample one; with speculative decoding
        (`out`: the step's SchedulerOutput), also its accepted drafts (spec.py's rule)."""
        tokens = {}
        verified = out.scheduled_spec_decode_tokens if out is not None else None
        for req_id in req_ids:
            request = self.scheduler.requests.get(req_id)
            if request is None:
                continue
            n = request.num_output_tokens
            drafts = verified.get(req_id) if verified else None
            if not drafts:
                tokens[req_id] = [self.token_at(req_id, n)]
                continue
            from tracengine.vllm.spec import num_accepted
            token_at = functools.partial(self.token_at, req_id, peek=True)
            if self.async_drafts:       # the worker drafts: the scheduler holds placeholders
                drafts = self.propose(req_id, n, len(drafts))
            # the drafts given (or vLLM's padding, -1: never a token), kept as they equal the tokens, or synthetically
            a = num_accepted(drafts, n, token_at) if self.synthetic is None else \
                self.synthetic.num_accepted(self.index[req_id], request.num_prompt_tokens + n, drafts)
            if self.async_drafts:
                self.drafts_given(req_id).add(n, drafts[:a + 1])    # what the verification shows of them
            tokens[req_id] = [self.token_at(req_id, n)] + [token_at(n + j) for j in range(1, a + 1)]
        return tokens

    def propose(self, req_id: str, n: int, k: int) -> list[int]:
        """A request's drafts at output length n: its spec's (a recording's), else made up."""
        spec = self.by_id[req_id]
        if self.synthetic is not None:      # its own next tokens
            return [self.token_at(req_id, n + j, peek=True) for j in range(k)]
        if spec.drafts is not None:
            return spec.drafts.propose(n, k)
        from tracengine.vllm.spec import made_up_drafts
        return made_up_drafts(self.index[req_id], n, k, functools.partial(self.token_at, req_id, peek=True))

    def drafts_given(self, req_id: str):
        from tracengine.vllm.spec import Drafts
        return self.drafts_log.setdefault(req_id, Drafts())

    def give_drafts(self, req_ids, k: int | None = None) -> None:
        """After a step's output (synchronous scheduling, vLLM's post_step): the next drafts of the
        requests that sampled, as vLLM's engine core gives them (update_draft_token_ids); `k` of
        them each, the step's draft length (a dynamic one's), else the config's."""
        from vllm.v1.outputs import DraftTokenIds
        ids, drafts = [], []
        for req_id in req_ids:
            request = self.scheduler.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            n = request.num_output_tokens
            ids.append(req_id)
            drafts.append(self.propose(req_id, n, self.scheduler.num_spec_tokens if k is None else k))
            self.drafts_given(req_id).add(n, drafts[-1])
        if ids:
            self.scheduler.update_draft_token_ids(DraftTokenIds(ids, drafts))


def check_progress(scheduler, out) -> None:
    """A step that scheduled and preempted nothing with nobody running and a request waiting: the
    waiting head never fits (all the blocks are free or evictable), so no later step would run it.
    A KV connector may hold a request back (a lookup it cannot answer yet): not checked then."""
    if out.total_num_scheduled_tokens == 0 and not out.preempted_req_ids and not scheduler.running \
            and scheduler.waiting and scheduler.connector is None:
        from tracengine.errors import ConfigError
        request = scheduler.waiting.peek_request()
        manager = scheduler.kv_cache_manager
        raise ConfigError(f"vLLM's scheduler can never run request {request.request_id} ({request.num_tokens} "
                          f"tokens) with {manager.block_pool.num_gpu_blocks - 1} usable KV blocks of "
                          f"{scheduler.block_size} tokens: give more num_gpu_blocks")


def batch_queue_size(scheduler) -> int:
    """The steps vLLM's engine core keeps in flight: two with async scheduling (step_with_batch_queue)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    return 2 if isinstance(scheduler, AsyncScheduler) else 1


class VllmClockedEngine:
    """vLLM's scheduler behind the engine interface (engine/interface.py), driven as its engine
    core drives it: the requests given it (RequestSpec) enter before the next step, the clients
    that left by then leave, and a step is one turn of the engine core: schedule (with async
    scheduling, two batches in flight) or process the oldest batch's output.

    Its clock is simulated time when given a step-time model (`step_time`: each scheduled step
    lasts what the model says for its batch, the recording scheduler's StepEnds get those
    times; a client leaves at its RequestSpec's abort_ns; an idle scheduler sleeps until a
    request comes and wakes `wake_ns` after it), else steps (a step-exact run: a request arrives
    before the step its arrival_step names, an idle scheduler skips ahead to it; `aborts[k]`:
    request ids aborted before step k is scheduled, `in_step_aborts[k]` while step k is in
    flight, before its output is processed, as vLLM's aborts queue has them)."""

    def __init__(self, scheduler, specs, step_time=None, first_step_ns: int = 0, past_output: set | None = None,
                 aborts: dict | None = None, in_step_aborts: dict | None = None, schedule_log: list | None = None,
                 kv_worker=None):
        """`kv_worker`: a KV connector's workers (kv_worker.KVWorker), reporting the transfers each
        step finished in its output."""
        self.scheduler = scheduler
        self.kv_worker = kv_worker
        self.driver = Driver(scheduler, specs, past_output)
        self.queue_size = batch_queue_size(scheduler)
        self.batch_queue: deque = deque()
        self.step_time = step_time
        self.first_step_ns = first_step_ns
        self.aborts, self.in_step_aborts = aborts or {}, in_step_aborts or {}
        self.schedule_log = schedule_log     # what vLLM decided: each request's tokens, the preempted
        self.queued: list = []
        self.num_scheduled = 0
        self.start_ns: int | None = None     # the next step's start (ns, or a step number); None: idle
        if step_time is not None:
            self.recorder = scheduler.tracengine
            self.times: dict[int, tuple] = {}   # step -> (schedule_ns, model_ns, postprocess_ns, gap_ns)
            self.recorder.step_times = self.times.pop
            self.leaving = deque(sorted((s for s in specs if s.abort_ns is not None), key=lambda s: s.abort_ns))
        self.end_ns = 0              # the last step's end on the simulated clock
        self.tick = 0                # the clock of steps: a step, or an idle wait for the next arrival

    def _base(self) -> int:
        if self.step_time is None:
            return self.tick
        base = self.end_ns + self.step_time.gap_ns if self.num_scheduled else \
            max(self.step_time.gap_ns, self.first_step_ns)
        return base if self.kv_worker is None else self.kv_worker.next_start(base)

    def _busy(self) -> bool:
        return bool(self.queued) or self.scheduler.has_requests() or bool(self.batch_queue)

    # -- the engine interface --------------------------------------------------------------

    def next_step_ns(self) -> int | None:
        return self.start_ns

    def add(self, index: int, spec: RequestSpec) -> None:
        self.queued.append(spec)
        if self.start_ns is None:        # idle: it sleeps until this arrival (and wakes late)
            if self.step_time is None:
                self.tick = max(self.tick, spec.arrival_step)
                self.start_ns = self.tick
            else:
                self.start_ns = max(self._base(), spec.arrival_ns + self.step_time.wake_ns)

    def abort(self, request_id: str, reason: str = "abort") -> bool:
        from vllm.v1.request import RequestStatus
        known = request_id in self.scheduler.requests
        self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
        return known

    def is_finished(self) -> bool:
        return not self._busy()

    def step(self) -> Stepped:
        """One turn of vLLM's engine core at `next_step_ns()`: schedule a step if it has requests
        (and, with a batch in flight to spare, go on to the next), else process the oldest output."""
        scheduler, start = self.scheduler, self.start_ns
        for spec in self.queued:
            self.driver.add(spec)
        self.queued.clear()
        self._leave(start)
        ran = False
        if scheduler.has_requests():
            out = scheduler.schedule()
            check_progress(scheduler, out)
            if self.schedule_log is not None:
                self.schedule_log.append((dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids)))
            if self.step_time is not None:
                self._time(self.num_scheduled, start)
            if self.kv_worker is not None:
                self.kv_worker.scheduled(out, start, self.end_ns)
            self.batch_queue.appendleft((self.num_scheduled, out, sampling_req_ids(scheduler, out)))
            self.num_scheduled += 1
            self.tick += 1
            ran = True
            if len(self.batch_queue) < self.queue_size and (out.total_num_scheduled_tokens > 0
                                                            or scheduler.has_requests()):
                self.start_ns = self._base()
                return Stepped([], [], ran, self.end_ns)
        if self.batch_queue:
            step, out, req_ids = self.batch_queue.pop()
            for req_id in self.in_step_aborts.get(step, ()):
                self.abort(req_id)
            driver = self.driver
            output = model_output(out.num_scheduled_tokens, driver.tokens(req_ids, out))
            if self.kv_worker is not None:
                output.kv_connector_output = self.kv_worker.output(scheduler, out)
            scheduler.update_from_output(out, output)
            if driver.spec_decoding and not driver.async_drafts:     # the engine core's drafts (spec.py)
                driver.give_drafts(req_ids, out.num_spec_tokens_to_schedule or None)
        self.start_ns = self._base() if self._busy() else None
        return Stepped([], [], ran, self.end_ns)

    def _leave(self, start: int) -> None:
        """The clients that left by the step's start: by their abort_ns in time, by `aborts` in steps."""
        if self.step_time is None:
            for req_id in self.aborts.get(self.num_scheduled, ()):
                self.abort(req_id)
            return
        while self.leaving and self.leaving[0].abort_ns <= start:
            self.abort(self.leaving.popleft().request_id)

    def _time(self, step: int, start: int) -> None:
        """The step just scheduled lasts what the step-time model says for its batch."""
        decision = next(e for e in self.recorder.steps[step] if type(e) is ScheduleDecision)
        schedule_ns, model_ns, postprocess_ns = decision_times(self.step_time, decision)
        self.times[step] = (schedule_ns, model_ns, postprocess_ns, start - self.end_ns)
        self.end_ns = start + schedule_ns + model_ns + postprocess_ns

    def stuck_reason(self) -> str:
        return f"vLLM's scheduler is stuck after step {self.num_scheduled}"


def run(scheduler, specs: list[RequestSpec], *, aborts: dict | None = None, in_step_aborts: dict | None = None,
        max_steps: int = 100_000, schedule_log: list | None = None, past_output: set | None = None,
        drafts_log: dict | None = None, kv_worker=None) -> int:
    """Runs `specs` through `scheduler` until it has no requests, on a clock of steps
    (VllmClockedEngine's); returns the number of steps. `aborts`, `in_step_aborts`, `kv_worker`:
    as VllmClockedEngine's. `past_output` gets the ids of recorded requests that ran past their
    recorded output; `drafts_log`: request id -> its drafts as given and verified (spec.Drafts)."""
    engine = VllmClockedEngine(scheduler, specs, past_output=past_output, aborts=aborts,
                               in_step_aborts=in_step_aborts, schedule_log=schedule_log, kv_worker=kv_worker)
    if drafts_log is not None:
        engine.driver.drafts_log = drafts_log
    try:
        run_in_time(engine, in_arrival_order(specs, "arrival_step"), max_steps=max_steps, arrival="arrival_step")
    except TracengineError:
        if engine.num_scheduled >= max_steps:
            raise RuntimeError(f"the scheduler did not finish in {max_steps} steps") from None
        raise
    return engine.num_scheduled


def recorded_token(spec: RequestSpec, position: int, past_output: set | None) -> int:
    """The recorded output token at `position`; past the recorded output a filler token."""
    if position < len(spec.output_token_ids):
        return spec.output_token_ids[position]
    if past_output is not None:
        past_output.add(spec.request_id)
    stops = {spec.sampling.get("eos_token_id"), *spec.sampling.get("stop_token_ids", ())}
    return next(t for t in FILLER_TOKEN_IDS if t not in stops)


def record_workload(config: dict, specs: list[RequestSpec], **drive) -> list:
    """The events (header first) of `specs` through vLLM's recording scheduler for `config` (a
    header's, build.default_config's), driven by `run` (`drive`: its aborts and in_step_aborts)."""
    from tracengine.trace.sinks import ListSink
    from tracengine.vllm.build import build_scheduler
    from tracengine.vllm.header import trace_header
    scheduler = build_scheduler(config)
    header = trace_header(scheduler)
    sink = ListSink()
    scheduler.record_to(sink, header.created_at)
    run(scheduler, specs, **drive)
    scheduler.shutdown()
    return [header] + sink.events
