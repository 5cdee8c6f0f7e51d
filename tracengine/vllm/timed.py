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

import msgspec

from tracengine.errors import TraceError, TracengineError
from tracengine.replay.timed import TimedWorkload
from tracengine.sim.engine import as_simulated
from tracengine.sim.clock import in_arrival_order, run_in_time
from tracengine.trace.sinks import ListSink
from tracengine.vllm.drive import VllmClockedEngine


def run_timed(scheduler, specs, step_time, *, first_step_ns: int = 0, past_output: set | None = None,
              max_steps: int = 10_000_000) -> int:
    """Runs `specs` (drive.RequestSpec, with `arrival_ns` and `abort_ns`) through `scheduler`, which
    records (its StepEnds get the simulated times); returns the number of steps. `first_step_ns`:
    the earliest start of step 0 (a recording's start-up, as replay/timed.TimedReplay's)."""
    from tracengine.vllm.offloading import offloading_worker
    engine = VllmClockedEngine(scheduler, specs, step_time, first_step_ns, past_output,
                               kv_worker=offloading_worker(scheduler))     # native offloading's workers
    try:
        return run_in_time(engine, in_arrival_order(specs), max_steps=max_steps)
    except TracengineError as exc:
        if engine.num_scheduled >= max_steps:
            raise TraceError(f"vLLM's scheduler did not finish the simulation in {max_steps} steps") from None
        raise exc


def run_config(config: dict, specs, step_time, model=None, first_step_ns: int = 0,
               past_output: set | None = None) -> list:
    """The events (header first) of `specs` through vLLM's scheduler for `config` in simulated time."""
    from tracengine.vllm.build import build_scheduler
    scheduler = build_scheduler(config, live_offloading=True)
    from tracengine.vllm.header import trace_header
    header = as_simulated(trace_header(scheduler), step_time, model)
    sink = ListSink()
    scheduler.record_to(sink, created_at=0.0)
    run_timed(scheduler, specs, step_time, first_step_ns=first_step_ns, past_output=past_output)
    scheduler.shutdown()
    return [header] + sink.events


class VllmTimedReplay(TimedWorkload):
    """A vLLM trace's workload ready to run in simulated time under any config (replay/timed.py's
    TimedReplay, for vLLM's scheduler): requests at their recorded arrival times, clients leaving
    when they left, each request's recorded tokens. Calibrates on the trace unless given a model."""

    def __init__(self, events, step_time=None, trace_name: str = ""):
        from tracengine.analysis.timeline import RequestTimeline
        from tracengine.trace.events import StepEnd
        from tracengine.vllm.whatif import extract_workload
        self.events = events = list(events)
        self.workload = workload = extract_workload(events, in_time=True)
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
        build_scheduler(config, record="", live_offloading=True).shutdown()
        return config


    def changes(self, config: dict) -> list[tuple[str, object, object]]:
        return [(name, value, config.get(name)) for name, value in self.recorded.items() if config.get(name) != value]

    def run(self, config: dict, policy=None) -> tuple[list, int]:
        """As TimedReplay.run: the events under `config`, and how many requests ran past their
        recorded output. `policy` is tracengine's, never given here."""
        past_output: set = set()
        events = run_config(config, self.workload.specs, self.ensure_step_time(), self.workload.header.model,
                            self.first_step_ns, past_output)
        events[0] = msgspec.structs.replace(events[0], created_at=time.time())
        return events, len(past_output)


def timed_whatif(events, overrides: dict, step_time=None, trace_name: str = "", policy=None):
    """replay/timed.whatif_in_time for a vLLM trace. `policy` is tracengine's (--policy), never given here."""
    from tracengine.replay.timed import whatif_in_time
    from tracengine.vllm.replay import check_vllm_version
    timed = VllmTimedReplay(events, step_time, trace_name)
    check_vllm_version(timed.workload.header)
    return whatif_in_time(timed, overrides)
