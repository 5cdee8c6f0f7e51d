"""The makers of a trace's sweep variants (sim/spec.py names them in a SweepSpec): what-ifs
in simulated time (TimedVariant) and step-exact ones (StepVariant), from the trace's events."""
from tracengine.replay.timed import StepVariant, TimedReplay, TimedVariant, prepare_timed_sweep
from tracengine.sim.spec import PreparedSources, Source, SweepSpec, step_time_of


def timed_runner(spec: SweepSpec, events: list) -> TimedVariant:
    return TimedVariant(TimedReplay(events, step_time_of(spec.step_time)), spec.base, spec.slo, spec.policy)


def step_runner(spec: SweepSpec, events: list) -> StepVariant:
    from tracengine.replay.whatif import StepReplay
    return StepVariant(StepReplay(events), spec.base, spec.policy)


TIMED, STEPS = f"{__name__}:timed_runner", f"{__name__}:step_runner"


def prepare_timed(prepared: PreparedSources, source: Source, events: list, step_time, trace_name: str, base: dict,
                  slo, policy):
    """(spec, step-time model) of a sweep of what-ifs in simulated time of tracengine's trace
    (replay/timed.prepare_timed_sweep)."""
    return prepare_timed_sweep(prepared, source, events, TimedReplay(events, step_time, trace_name), TIMED, base,
                               slo, policy)


def prepare_steps(prepared: PreparedSources, source: Source, events: list, base: dict, policy) -> SweepSpec:
    """The spec of a sweep of step-exact what-ifs."""
    prepared.add(source, events)
    return SweepSpec(STEPS, source.digest, base, None, None, policy)


