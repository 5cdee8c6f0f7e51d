"""SGLang's own scheduler in simulated time, behind the engine interface (engine/interface.py):
requests enter at their arrival times, each step lasts what a step-time model (sim/steptime.py,
sim/roofline.py) says for its batch (the ScheduleDecision the recorder built from the batch
`get_next_batch_to_run` chose), and the scheduler's calls are its loop's (normal or overlap),
in the order the driver and re-execution make them (drive.py, replay.py), so a run in simulated
time re-executes exactly. In the overlap loop the CPU schedules the next batch and processes the
last result while a batch's forward runs on the device: a busy step lasts max(the forward, the
CPU's work), not their sum (SglangClockedEngine._overlap_times says the rule and its StepEnd).

The loop is sim/clock.run_in_time's: a step starts the model's gap after the last one ended,
or, idle, its wake-up time after the next arrival; the requests that arrived by a step's start
enter before it (after SGLang's idle iteration when it had nothing to do), with the clients
that left by then. Two users: `simulate --scheduler sglang` (a workload, tokens made up:
simulate.py) and the what-if of an SGLang trace in simulated time (`SglangTimedReplay`: the
recorded workload at its arrival times, its recorded tokens, under the recorded config and
another, through replay/timed.whatif_in_time)."""
import time
from collections import deque

import msgspec

from tracengine.errors import TraceError, TracengineError
from tracengine.replay.timed import TimedWorkload
from tracengine.sim.engine import as_simulated
from tracengine.sim.clock import Stepped, decision_times, in_arrival_order, run_in_time


class SglangClockedEngine:
    """SGLang's scheduler on the simulated clock: the requests given it (drive.RequestSpec, with
    `arrival_ns` and `abort_ns`) enter before its next step, the clients that left by that
    step's start leave, and a step is the loop's iterations until one runs a batch. The
    recorder's StepEnds get the simulated times: the normal loop's a step's parts one after
    another (`_times`), the overlap loop's the CPU's and the device's clocks (`_overlap_times`)."""

    def __init__(self, scheduler, recorder, step_time, first_step_ns: int = 0):
        self.scheduler, self.recorder = scheduler, recorder
        self.overlap = bool(scheduler.enable_overlap)
        recorder.step_times = self._overlap_times if self.overlap else self._times
        self.step_time = step_time
        self.first_step_ns = first_step_ns
        self.queued: list = []           # specs given it, entering before the next step
        self.leaving: deque = deque()    # specs whose clients leave, by abort_ns
        self.end_ns = 0                  # the last step's end on the simulated clock
        self.num_steps = 0
        self.start_ns: int | None = None
        self.stuck = False               # the last step could run nothing, and nothing will change that
        # the overlap loop's clocks (_overlap_times): the CPU's and the device's
        self.cpu_ns = 0                  # when the CPU is done with the last iteration's work
        self.at_ns = 0                   # when the next iteration of the step under way starts
        self.device_ns = 0               # when the device is done with the batches launched
        self.predicted: dict[int, tuple] = {}     # step -> (schedule_ns, model_ns, postprocess_ns) of its batch
        self.forward_end_ns: dict[int, int] = {}  # step -> when its forward ends, until its result is processed
        self.num_launched = 0
        self.iteration = None            # (start, batches chosen before it) of the iteration under way
        self.interval = None             # [gap_ns, cpu_ns] since the last StepEnd: its leading gap, the CPU's work

    def _base_ns(self) -> int:
        if self.overlap:
            return self.cpu_ns + self.step_time.gap_ns if self.num_launched else \
                max(self.step_time.gap_ns, self.first_step_ns)
        return self.end_ns + self.step_time.gap_ns if self.num_steps else \
            max(self.step_time.gap_ns, self.first_step_ns)

    # -- the engine interface --------------------------------------------------------------

    def next_step_ns(self) -> int | None:
        return self.start_ns

    def add(self, index: int, spec) -> None:
        self.queued.append(spec)
        self.recorder.arrival_ns[spec.request_id] = spec.arrival_ns
        if spec.abort_ns is not None:
            self.leaving = deque(sorted([*self.leaving, spec], key=lambda s: s.abort_ns))
        if self.start_ns is None:        # idle: it sleeps until this arrival, and wakes late
            self.start_ns = max(self._base_ns(), spec.arrival_ns + self.step_time.wake_ns)
        self.stuck = False

    def abort(self, request_id: str, reason: str = "abort") -> bool:
        from tracengine.sglang.drive import abort_request
        for i, spec in enumerate(self.queued):
            if spec.request_id == request_id:
                del self.queued[i]
                return True
        if not holds(self.scheduler, request_id):
            return False
        self.scheduler.process_input_requests([abort_request(request_id)])
        return True

    def is_finished(self) -> bool:
        from tracengine.sglang.drive import has_work
        return not self.queued and not has_work(self.scheduler)

    def step(self) -> Stepped:
        """The step at `next_step_ns()`: arrivals and departures, then the loop's iterations until
        one runs a batch (none runs when every request left)."""
        from tracengine.sglang.drive import abort_request, generate_request, has_work, iterate
        scheduler, start = self.scheduler, self.start_ns
        if self.overlap:        # its iterations on the overlap loop's clocks, from the step's start
            iterate = self._overlap_iterate
            self.at_ns = start
        inputs = [generate_request(s.request_id, s.prompt_token_ids, s.max_tokens, ignore_eos=not s.eos_after)
                  for s in self.queued]
        self.queued.clear()
        while self.leaving and self.leaving[0].abort_ns <= start:    # the clients that left by now
            request_id = self.leaving.popleft().request_id
            if holds(scheduler, request_id) or any(r.rid == request_id for r in inputs):
                inputs.append(abort_request(request_id))
        if inputs:
            if not has_work(scheduler):      # SGLang's idle iteration before the requests come
                iterate(scheduler)
            scheduler.process_input_requests(inputs)
        ran = False
        for _ in range(2):       # a prefill batch's requests join the running batch an iteration later
            if not has_work(scheduler):
                break
            if iterate(scheduler):
                ran = True
                break
        self.stuck = not ran and has_work(scheduler)
        self.start_ns = self._base_ns() if has_work(scheduler) and not self.stuck else None
        return Stepped([], [], ran, self.end_ns)

    def _times(self, step: int) -> tuple:
        """The step under way lasts what the step-time model says for its batch (the recorder
        asks, writing its StepEnd)."""
        schedule_ns, model_ns, postprocess_ns = decision_times(self.step_time, self.recorder.last_decision)
        times = (schedule_ns, model_ns, postprocess_ns, self.start_ns - self.end_ns)
        self.end_ns = self.start_ns + schedule_ns + model_ns + postprocess_ns
        self.num_steps += 1
        return times

    # -- the overlap loop's clock --------------------------------------------------------------

    def _overlap_iterate(self, scheduler) -> bool:
        """One iteration of SGLang's overlap loop (drive.iterate) on its clocks: it starts at `at_ns`,
        and a batch it chose and launched with no result processed after (the first, or one after an
        iteration with none) costs the CPU its scheduling."""
        from tracengine.sglang.drive import iterate
        at = self.at_ns
        if self.interval is None:
            self.interval = [at - self.end_ns, 0]
        else:                           # the loop's time between two iterations since the last StepEnd
            self.interval[1] += at - self.cpu_ns
        self.iteration = (at, self.recorder.num_decided)
        self.cpu_ns = at
        ran = iterate(scheduler)
        chosen = self._chosen()
        if chosen is not None and chosen not in self.forward_end_ns:     # launched, no result processed after
            schedule_ns = self.predicted[chosen][0]
            self.interval[1] += schedule_ns
            self.cpu_ns = at + schedule_ns
            self._launch(chosen, self.cpu_ns)
        self.iteration = None
        self.at_ns = self.cpu_ns
        return ran

    def _chosen(self) -> int | None:
        """The step whose batch the iteration under way chose (its prediction made), or None."""
        if self.recorder.num_decided == self.iteration[1]:
            return None
        step = self.recorder.num_decided - 1
        if step not in self.predicted:
            self.predicted[step] = decision_times(self.step_time, self.recorder.last_decision)
        return step

    def _launch(self, step: int, at_ns: int) -> None:
        """The batch of `step` goes to the device at `at_ns`: its forward runs once the one before is done."""
        self.device_ns = self.forward_end_ns[step] = max(at_ns, self.device_ns) + self.predicted[step][1]
        self.num_launched += 1

    def _overlap_times(self, step: int) -> tuple:
        """The overlap loop's StepEnd of `step`, whose result is processed now: the CPU schedules
        and launches the next batch while this step's forward runs on the device, then waits for
        the forward and processes its result. So a step lasts, from the last result processed to
        this one, the loop's gap, the next batch's scheduling (`schedule_ns`), what is left of this
        step's forward when that is done (`model_ns`: the CPU waits for it; the rest of the
        forward overlapped the CPU's work) and this step's processing (`postprocess_ns`): busy,
        a step takes max(its forward, the CPU's scheduling of the next step + processing of the
        last one + the gap), not their sum. The step-time model prices each batch's three parts
        as the normal loop's (`_times`). A step's latencies come from its result's processing,
        the end of its StepEnd, as the normal loop's. (Where SGLang does not overlap two
        batches, `is_disable_overlap_for_batch`, it processes the result before it launches the
        next batch, which then starts at the StepEnd's end.)"""
        at = self.iteration[0]
        chosen = self._chosen()
        schedule_ns = self.predicted[chosen][0] if chosen is not None else 0
        scheduled = at + schedule_ns
        launched_first = chosen is not None and bool(self.scheduler.result_queue)
        if launched_first:
            self._launch(chosen, scheduled)
        begin = max(scheduled, self.forward_end_ns.pop(step))
        end = begin + self.predicted.pop(step)[2]
        gap_ns, cpu_ns = self.interval
        times = (cpu_ns + schedule_ns, begin - scheduled, end - begin, gap_ns)
        if chosen is not None and not launched_first:
            self._launch(chosen, end)
        self.interval = None
        self.end_ns = self.cpu_ns = end
        self.num_steps += 1
        return times

    def stuck_reason(self) -> str:
        scheduler = self.scheduler
        if scheduler.waiting_queue:
            request = scheduler.waiting_queue[0]
            return (f"SGLang's scheduler can never run request {request.rid} ({len(request.origin_input_ids)} "
                    f"tokens) with {scheduler.max_total_num_tokens} token slots: give more max_total_tokens")
        return f"SGLang's scheduler is stuck after step {self.num_steps}"


def holds(scheduler, request_id: str) -> bool:
    """Whether SGLang's scheduler holds `request_id` unfinished (waiting, running, mid-prefill)."""
    reqs = list(scheduler.waiting_queue) + list(scheduler.running_batch.reqs)
    if scheduler.last_batch is not None:
        reqs += scheduler.last_batch.reqs
    if scheduler.chunked_req is not None:
        reqs.append(scheduler.chunked_req)
    return any(req.rid == request_id and not req.finished() for req in reqs)


def run_config(config: dict, specs, step_time, model=None, first_step_ns: int = 0,
               max_steps: int = 10_000_000) -> tuple[list, int]:
    """The events (header first) of `specs` through SGLang's scheduler for `config` in simulated
    time, and how many requests ran past their recorded output."""
    from tracengine.sglang.build import build_scheduler
    from tracengine.sglang.drive import Tokens
    from tracengine.sglang.recorder import record_to, stop_recording
    from tracengine.trace.sinks import ListSink
    tokens = Tokens(specs)
    scheduler = build_scheduler(config, tokens)
    from tracengine.sglang.header import trace_header
    header = as_simulated(trace_header(scheduler), step_time, model)
    sink = ListSink()
    engine = SglangClockedEngine(scheduler, record_to(scheduler, sink, created_at=0.0), step_time, first_step_ns)
    try:
        run_in_time(engine, in_arrival_order(specs), max_steps=max_steps)
    except TracengineError as exc:
        if engine.num_steps >= max_steps:
            raise TraceError(f"SGLang's scheduler did not finish the simulation in {max_steps} steps") from None
        raise exc
    finally:
        stop_recording(scheduler)
    return [header] + sink.events, len(tokens.past_output)


class SglangTimedReplay(TimedWorkload):
    """An SGLang trace's workload ready to run in simulated time under any config (as
    replay/timed.TimedReplay and vllm/timed.VllmTimedReplay): requests at their recorded arrival
    times (a trace whose requests came with none, the driver's, whose arrivals are steps: the
    recorded start of the step they came before), clients leaving when they left, each request's
    recorded tokens. Calibrates on the trace unless given a model."""

    def __init__(self, events, step_time=None, trace_name: str = ""):
        from tracengine.analysis.timeline import RequestTimeline
        from tracengine.sglang.whatif import extract_workload
        from tracengine.trace.events import StepEnd
        self.events = events = list(events)
        self.header, self.specs, aborts, _ = extract_workload(events)
        if not self.specs:
            raise TraceError("the trace has no requests")
        timeline = RequestTimeline(self.header)
        for e in events[1:]:
            timeline.add(e)
        for spec in self.specs:
            if spec.arrival_ns < 0:
                spec.arrival_ns = timeline.start_ns(spec.arrival_step)
        by_id = {spec.request_id: spec for spec in self.specs}
        for step, request_ids in aborts.items():
            for request_id in request_ids:
                by_id[request_id].abort_ns = timeline.start_ns(step)
        self.recorded = self.header.config
        self.step_time = step_time
        self.trace_name = trace_name
        # as TimedReplay's: no simulated run starts before the recorded step 0 did
        self.first_step_ns = next((e.gap_ns for e in events if type(e) is StepEnd), 0)

    def config(self, overrides: dict) -> dict:
        """The config of a variant; one SGLang refuses is refused here (ConfigError)."""
        from tracengine.sglang.build import apply_overrides, check_config
        config = apply_overrides(self.recorded, overrides)
        check_config(config)
        return config


    def changes(self, config: dict) -> list[tuple[str, object, object]]:
        return [(name, value, config.get(name)) for name, value in self.recorded.items() if config.get(name) != value]

    def run(self, config: dict, policy=None) -> tuple[list, int]:
        """As TimedReplay.run: the events under `config`, and how many requests ran past their
        recorded output."""
        events, num_past_output = run_config(config, self.specs, self.ensure_step_time(), self.header.model,
                                             self.first_step_ns)
        events[0] = msgspec.structs.replace(events[0], created_at=time.time())
        return events, num_past_output


def timed_whatif(events, overrides: dict, step_time=None, trace_name: str = "", policy=None):
    """replay/timed.whatif_in_time for an SGLang trace. `policy` is tracengine's (--policy), never given here."""
    from tracengine.replay.timed import whatif_in_time
    from tracengine.sglang.replay import check_sglang_version
    timed = SglangTimedReplay(events, step_time, trace_name)
    check_sglang_version(timed.header)
    return whatif_in_time(timed, overrides)
