"""vLLM's own scheduler in simulated time: requests enter at their arrival
times, each step lasts what a step-time model (sim/steptime.py, sim/roofline.py)
says for its batch, and the engine core's calls are made in its order (with
async scheduling, step k's output is processed after step k+1 is scheduled).

The loop is sim/engine.py's: a step starts the model's gap after the last
one ended, or, when nothing is queued or in flight, its wake-up time after
the next arrival; every request that has arrived by a step's start is added
before it, and every client that has left by then is aborted. Steps are timed
one after another, the step-time model's durations as the trace's StepEnds
hold them. Two users: `simulate --scheduler vllm` (a workload, tokens made
up: simulate.py) and the what-if of a vLLM trace in simulated time
(`VllmTimedReplay`: the recorded workload at its recorded arrival times, its
recorded tokens, under the recorded config and another)."""
import time
from collections import deque

import msgspec

from tracengine.errors import TraceError
from tracengine.sim.steptime import step_shape
from tracengine.trace.events import ScheduleDecision, prefill_flags
from tracengine.trace.sinks import ListSink
from tracengine.vllm.drive import Driver, batch_queue_size, check_progress, model_output, sampling_req_ids


def run_timed(scheduler, specs, step_time, *, first_step_ns: int = 0, past_output: set | None = None,
              max_steps: int = 10_000_000) -> int:
    """Runs `specs` (drive.RequestSpec, with `arrival_ns` and `abort_ns`) through `scheduler`, which
    records (its StepEnds get the simulated times); returns the number of steps. `first_step_ns`:
    the earliest start of step 0 (a recording's start-up, as replay/timed.TimedReplay's)."""
    from vllm.v1.request import RequestStatus
    recorder = scheduler.tracengine
    times: dict[int, tuple] = {}        # step -> (schedule_ns, model_ns, postprocess_ns, gap_ns)
    recorder.step_times = times.pop
    driver = Driver(scheduler, specs, past_output)
    queue_size = batch_queue_size(scheduler)
    pending = deque(sorted(specs, key=lambda s: s.arrival_ns))
    leaving = deque(sorted((s for s in specs if s.abort_ns is not None), key=lambda s: s.abort_ns))
    batch_queue: deque = deque()
    gap_ns, wake_ns = step_time.gap_ns, step_time.wake_ns
    end_ns = num_scheduled = 0          # the last step's end on the simulated clock
    while num_scheduled < max_steps:
        idle = not scheduler.has_requests() and not batch_queue
        if idle and not pending:
            return num_scheduled
        start = end_ns + gap_ns if num_scheduled else max(gap_ns, first_step_ns)
        if idle:        # it sleeps until the next arrival, and wakes late
            start = max(start, pending[0].arrival_ns + wake_ns)
        while pending and pending[0].arrival_ns <= start:
            driver.add(pending.popleft())
        while leaving and leaving[0].abort_ns <= start:    # the clients that left by now
            scheduler.finish_requests(leaving.popleft().request_id, RequestStatus.FINISHED_ABORTED)
        if scheduler.has_requests():
            out = scheduler.schedule()
            check_progress(scheduler, out)
            decision = next(e for e in recorder.steps[num_scheduled] if type(e) is ScheduleDecision)
            flags = prefill_flags(decision)
            is_prefill = any(flags)
            shape = step_shape((s.num_tokens, s.num_cached_tokens) for s in decision.seqs)
            schedule_ns, model_ns, postprocess_ns = step_time.predict(is_prefill, *shape,
                                                                      mixed=is_prefill and not all(flags))
            times[num_scheduled] = (schedule_ns, model_ns, postprocess_ns, start - end_ns)
            end_ns = start + schedule_ns + model_ns + postprocess_ns
            batch_queue.appendleft((out, sampling_req_ids(scheduler, out)))
            num_scheduled += 1
            if len(batch_queue) < queue_size and (out.total_num_scheduled_tokens > 0 or scheduler.has_requests()):
                continue
        if batch_queue:
            out, req_ids = batch_queue.pop()
            scheduler.update_from_output(out, model_output(out.num_scheduled_tokens, driver.tokens(req_ids, out)))
            if driver.spec_decoding and not driver.async_drafts:     # the engine core's drafts (spec.py)
                driver.give_drafts(req_ids)
    raise TraceError(f"vLLM's scheduler did not finish the simulation in {max_steps} steps")


def simulated_header(scheduler, step_time, model=None):
    """The TraceHeader of a run in simulated time (created_at 0: arrival_ns count from the run's
    start); `model`: the recorded run's ModelInfo, else the step-time model's source."""
    from tracengine.trace.events import ModelInfo
    from tracengine.vllm.header import trace_header
    if model is None:
        source = getattr(step_time, "source", None) or {}
        model = ModelInfo(source.get("model", "") or "synthetic", source.get("dtype", "none"), "simulated")
    return msgspec.structs.replace(trace_header(scheduler), created_at=0.0, device=f"simulated ({step_time.kind})",
                                   model=model)


def run_config(config: dict, specs, step_time, model=None, first_step_ns: int = 0,
               past_output: set | None = None) -> list:
    """The events (header first) of `specs` through vLLM's scheduler for `config` in simulated time."""
    from tracengine.vllm.build import build_scheduler
    scheduler = build_scheduler(config)
    header = simulated_header(scheduler, step_time, model)
    sink = ListSink()
    scheduler.record_to(sink, created_at=0.0)
    run_timed(scheduler, specs, step_time, first_step_ns=first_step_ns, past_output=past_output)
    scheduler.shutdown()
    return [header] + sink.events


class VllmTimedReplay:
    """A vLLM trace's workload ready to run in simulated time under any config (replay/timed.py's
    TimedReplay, for vLLM's scheduler): requests at their recorded arrival times, clients leaving
    when they left, each request's recorded tokens. Calibrates on the trace unless given a model."""

    def __init__(self, events, step_time=None, trace_name: str = ""):
        from tracengine.analysis.timeline import RequestTimeline
        from tracengine.trace.events import StepEnd
        from tracengine.vllm.whatif import extract_workload
        self.events = events = list(events)
        self.workload = workload = extract_workload(events)
        if not workload.specs or any(s.arrival_ns < 0 for s in workload.specs):
            raise TraceError("the trace has no arrival times (its requests came with none after the recording "
                             "started); use --arrivals steps")
        timeline = RequestTimeline(workload.header)
        for e in events[1:]:
            timeline.add(e)
        for spec, record in zip(workload.specs, timeline.requests.values()):
            if record.abort is not None:      # a client that left: it leaves when it left the recording
                spec.abort_ns = timeline.start_ns(record.abort.step)
            spec.arrival_time = spec.arrival_ns / 1e9    # on the simulation's clock, in the recorded order
        self.recorded = workload.header.config
        self.step_time = step_time
        self.trace_name = trace_name
        # as TimedReplay's: no simulated run starts before the recorded step 0 did
        self.first_step_ns = next((e.gap_ns for e in events if type(e) is StepEnd), 0)

    def config(self, overrides: dict) -> dict:
        """The config of a variant; one vLLM refuses is refused here (ConfigError)."""
        from tracengine.vllm.build import apply_overrides, build_scheduler
        from tracengine.vllm.synthetic import whatif_config
        config = whatif_config(self.recorded, overrides, apply_overrides(self.recorded, overrides), self.events)
        build_scheduler(config, record="").shutdown()
        return config

    def ensure_step_time(self):
        if self.step_time is None:
            from tracengine.replay.timed import calibrated_step_time
            self.step_time = calibrated_step_time(self.events, self.trace_name)
        return self.step_time

    def run(self, config: dict, past_output: set | None = None) -> list:
        events = run_config(config, self.workload.specs, self.ensure_step_time(), self.workload.header.model,
                            self.first_step_ns, past_output)
        events[0] = msgspec.structs.replace(events[0], created_at=time.time())
        return events


def timed_whatif(events, overrides: dict, step_time=None, trace_name: str = "", policy=None):
    """replay/timed.timed_whatif for a vLLM trace: the recorded config in simulated time (the
    self-check) and the one with `overrides`. `policy` is tracengine's (--policy), never given here."""
    from tracengine.replay.timed import TimedWhatIf
    from tracengine.vllm.replay import check_vllm_version
    timed = VllmTimedReplay(events, step_time, trace_name)
    check_vllm_version(timed.workload.header)
    config = timed.config(overrides)     # before calibrating: say the plainer problem first
    past_output: set = set()
    self_check = timed.run(timed.recorded, None if overrides else past_output)
    new = self_check if not overrides else timed.run(config, past_output)
    changes = [(name, value, config.get(name)) for name, value in timed.recorded.items()
               if config.get(name) != value]
    return TimedWhatIf(timed.step_time, timed.events, self_check, new, changes, len(past_output))
