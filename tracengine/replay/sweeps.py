"""The makers of a trace's sweep variants (sim/spec.py names them in a SweepSpec): what-ifs
in simulated time (TimedVariant) and step-exact ones (StepVariant), from the trace's events."""
from tracengine.replay.timed import StepVariant, TimedReplay, TimedVariant
from tracengine.sim.spec import PreparedSources, Source, SweepSpec, step_time_of


def timed_runner(spec: SweepSpec, events: list) -> TimedVariant:
    return TimedVariant(TimedReplay(events, step_time_of(spec.step_time)), spec.base, spec.slo, spec.policy)


def step_runner(spec: SweepSpec, events: list) -> StepVariant:
    from tracengine.replay.whatif import StepReplay
    return StepVariant(StepReplay(events), spec.base, spec.policy)


TIMED, STEPS = f"{__name__}:timed_runner", f"{__name__}:step_runner"


def prepare_timed(prepared: PreparedSources, source: Source, events: list, step_time, trace_name: str, base: dict,
                  slo, policy):
    """(spec, step-time model) of a sweep of what-ifs in simulated time, its variant object made
    here once: the model fitted on the trace unless given, and shipped as data (to_dict), which
    every process, this one too, runs with."""
    replay = TimedReplay(events, step_time, trace_name)
    model = replay.ensure_step_time()
    spec = SweepSpec(TIMED, source.digest, base, model.to_dict(), slo, policy)
    replay.step_time = step_time_of(spec.step_time)
    prepared.add(source, events)
    prepared.add_runner(spec, TimedVariant(replay, base, slo, policy))
    return spec, replay.step_time


def prepare_steps(prepared: PreparedSources, source: Source, events: list, base: dict, policy) -> SweepSpec:
    """The spec of a sweep of step-exact what-ifs."""
    prepared.add(source, events)
    return SweepSpec(STEPS, source.digest, base, None, None, policy)


