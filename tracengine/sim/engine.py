"""The engine in simulated time: the real Scheduler and BlockManager, requests
entering at their arrival times, each step lasting what a step-time model
(steptime.py, roofline.py) says instead of what a clock reads.

The loop is the engine's: a step starts the loop's own gap after the last one
ended, or, when nothing is queued, the model's wake-up time after the next
arrival (the engine sleeps until then); every request that has arrived by a step's start
is added before it. The events are an ordinary trace whose StepEnds hold the
simulated durations and gaps, so stats, tui, diff, export and replay read it.
No model and no torch: tokens come from a runner without one (replay.whatif.OutputRunner
for a what-if, SyntheticRunner for a workload). A session's later turn arrives when its session
releases it (workload/sessions.py): its dependencies' last finish (the end of that step) plus its
think time."""
import math

import msgspec

from tracengine.engine.config import Config
from tracengine.engine.llm_engine import LLMEngine
from tracengine.errors import TracengineError
from tracengine.engine.request import Request
from tracengine.sim.clock import ClockedEngine, SimulatedStepper, in_arrival_order, run_in_time, taking
from tracengine.sim.runners import Departures, SyntheticRunner, check_requests
from tracengine.trace.events import ModelInfo, TraceHeader
from tracengine.trace.sinks import NULL_SINK, ListSink
from tracengine.trace.header import make_header
from tracengine.workload.sessions import SessionRelease, has_sessions


def _on_stepper(name: str) -> property:
    """An engine's count that its stepper keeps (read and written there)."""
    return property(lambda self: getattr(self.stepper, name), lambda self, value: setattr(self.stepper, name, value))


class SimulatedEngine(LLMEngine):
    """LLMEngine whose steps take simulated time: `now_ns` is set to a step's
    start before `step()`, which advances it by the model's durations. The step, the
    clock and the counts are its `stepper`'s (sim/clock.SimulatedStepper, compiled),
    which ClockedEngine calls directly."""

    def __init__(self, config: Config, runner, step_time, sink=NULL_SINK, policy=None):
        self.step_time = step_time
        self.stepper = SimulatedStepper(step_time)    # before reset, which sets its counts
        super().__init__(config, runner, sink, policy=policy)

    # kept by the stepper: the clock (now_ns, last_step_end_ns), the steps and their tokens, `waits`
    now_ns = _on_stepper("now_ns")
    last_step_end_ns = _on_stepper("last_step_end_ns")
    num_steps = _on_stepper("num_steps")
    num_batched_tokens = _on_stepper("num_batched_tokens")
    waits = _on_stepper("waits")     # the last step scheduled nothing: every sequence waits for a CPU tier's transfer

    def reset(self, sink=NULL_SINK):
        super().reset(sink)
        self.start_ns = self.last_step_end_ns = self.now_ns = 0
        self.waits = False
        self.stepper.bind(self.scheduler, self.runner, sink, self.pending, self.spec, self.proposer)

    def clock_ns(self) -> int:
        # simulated time, not the machine's: on its clock (the time since boot) a request
        # arriving later than the uptime would wait, forever, for a time to come
        return self.now_ns

    def step(self):
        """schedule -> run -> postprocess -> StepEnd, as LLMEngine.step, timed by the model."""
        return self.stepper.step()


def checked_requests(scheduler, requests):
    """`requests` (an iterator), each refused as check_requests refuses it when it is taken."""
    for i, request in enumerate(requests):
        check_requests(scheduler, [request], first_index=i)
        yield request


def run_timed(config: Config, requests, step_time, runner=None, sink=None,
              header: TraceHeader | None = None, max_steps: int = 10_000_000, policy=None,
              first_step_ns: int = 0, on_progress=None) -> list:
    """Run `requests` (each with `arrival_ns`) in simulated time; the events, header first.
    `requests`: a list, run in arrival order, a request without a seq_id numbered by its index;
    or an iterator giving them in arrival order (a workload file read as the run goes, numbered
    as they come: the run holds only the requests that have arrived and not finished; none
    leaves before it finishes). With `sink` given (a TraceWriter) the events go there and the
    list holds the header only. `first_step_ns`: the earliest start of step 0 (a recording's
    start-up: see TimedReplay). `on_progress(num_finished, now_ns)`: as run_in_time's."""
    events_sink = sink if sink is not None else ListSink()
    runner = runner if runner is not None else SyntheticRunner(eos=config.eos, seed=config.seed)
    engine = SimulatedEngine(config, runner, step_time, events_sink, policy=policy)   # policy: as LLMEngine's
    sessions = None       # a sessions workload's turns, sent as their sessions release them
    if isinstance(requests, list):
        check_requests(engine.scheduler, requests)     # all of them, before the run
        departures = Departures(requests, "abort_ns")
        if has_sessions(requests):
            sessions = SessionRelease(requests)
            take = sessions.pop
        else:
            take = in_arrival_order(requests)
    else:
        departures = None
        take = taking(enumerate(checked_requests(engine.scheduler, requests)))
    clocked = ClockedEngine(engine, step_time, first_step_ns,
                            departures.due if departures is not None and departures.next_due < math.inf else None)
    run_in_time(clocked, take, sessions, max_steps, on_progress)
    head = header if header is not None else make_header(config)
    return [head] if sink is not None else [head, *events_sink.events]


def simulate_config(overrides: dict, requests: list[Request]) -> Config:
    """A simulated engine's config: defaults, then `overrides`. max_model_len defaults to the
    longest request, as no model bounds it; the KV cache has no runner to size it."""
    if "num_kvcache_blocks" not in overrides:
        raise TracengineError("a simulation has no GPU to size the KV cache: give --set num_kvcache_blocks=N")
    values = dict(overrides)
    if "max_model_len" not in values:
        values["max_model_len"] = max(len(r.prompt) + r.num_history_tokens + r.max_tokens for r in requests)
    return Config().replace(**values)


def with_kv_bytes(config: Config, step_time) -> Config:
    """`config` with the KV bytes of a token of the roofline model `step_time` times, where a CPU
    tier needs them and none are given (as a fleet's transfers take them, fleet/overrides.py)."""
    model = getattr(step_time, "model", None) if getattr(step_time, "kind", "") == "roofline" else None
    if not config.kv_offloading_size or config.kv_bytes_per_token or model is None:
        return config
    return config.replace(kv_bytes_per_token=model.kv_bytes_per_token)


def simulated_model(step_time) -> ModelInfo:
    """The model a simulated run names: the one the step-time model came from."""
    source = getattr(step_time, "source", {}) or {}
    return ModelInfo(source.get("model", "") or "synthetic", source.get("dtype", "none"), "simulated")


def simulation_header(config: Config, step_time) -> TraceHeader:
    """The header of a simulated run of tracengine's engine."""
    return make_header(config, simulated_model(step_time), device=f"simulated ({step_time.kind})")


def as_simulated(header: TraceHeader, step_time, model: ModelInfo | None = None) -> TraceHeader:
    """A scheduler's own header (vLLM's, SGLang's) as a run in simulated time writes it: created_at
    0 (arrival_ns count from the run's start), the step-time model's device, and `model` (a
    recorded run's) or the step-time model's."""
    return msgspec.structs.replace(header, created_at=0.0, device=f"simulated ({step_time.kind})",
                                   model=model if model is not None else simulated_model(step_time))


def token_prompts(requests):
    """`requests`, each checked as it is taken: a simulation has no tokenizer, so every prompt
    is token ids (or lengths made into them, or hash ids)."""
    for i, r in enumerate(requests):
        if isinstance(r.prompt, str):
            raise TracengineError(f"{r.source or f'request {i}'}: a text prompt needs a tokenizer; "
                                  "simulate takes token ids (prompt_token_ids) or lengths")
        yield r


def check_token_prompts(requests: list[Request]):
    """token_prompts over a whole list, before a run."""
    for _ in token_prompts(requests):
        pass


def simulate(config: Config, requests, step_time, sink=None, header: TraceHeader | None = None,
             on_progress=None) -> list:
    """`requests` (each with its arrival_ns; a list, or an iterator as run_timed takes it)
    through the scheduler in simulated time, tokens from SyntheticRunner; the events (header first), or with `sink` (a TraceWriter made with
    `header`, by default `simulation_header`) the header alone. `on_progress`: as run_timed's."""
    if isinstance(requests, list):
        check_token_prompts(requests)
    else:      # an iterator (run_timed): each is checked as the run takes it
        requests = token_prompts(requests)
    header = header if header is not None else simulation_header(config, step_time)
    # the config comes from the user's flags, not a trace: a policy it names is loaded
    return run_timed(config, requests, step_time, sink=sink, header=header, policy=config.scheduling_policy,
                     on_progress=on_progress)
