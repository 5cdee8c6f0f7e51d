"""The makers of a trace's sweep variants (sim/spec.py names them in a SweepSpec): what-ifs
in simulated time (TimedVariant) and step-exact ones (StepVariant), from the trace's events."""
from tracengine.replay.timed import StepVariant, TimedReplay, TimedVariant
from tracengine.sim.spec import PreparedSources, Source, SweepSpec, step_time_of


def timed_runner(spec: SweepSpec, events: list) -> TimedVariant:
    return TimedVariant(TimedReplay(events, step_time_of(spec.step_time)), spec.base, spec.slo, spec.policy)


def step_runner(spec: SweepSpec, events: list) -> StepVariant:
    return StepVariant(events, spec.base, spec.policy)


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


def fleet_runner(spec: SweepSpec, events: list):
    """The maker of a fleet what-if's variants (`replay TRACE --sweep ...` of a fleet): the
    fleet the variants change travels in the spec as data (spec.fleet)."""
    from tracengine.replay.fleet_whatif import FleetReplay, FleetTraceVariant
    from tracengine.sim.fleet import FleetSpec
    return FleetTraceVariant(FleetReplay(events, step_time_of(spec.step_time)), spec.base, spec.slo, spec.policy,
                             FleetSpec.from_dict(spec.fleet))


FLEET = f"{__name__}:fleet_runner"


def prepare_fleet(prepared: PreparedSources, source: Source, events: list, step_time, trace_name: str, base: dict,
                  slo, policy):
    """(spec, step-time model) of a sweep of fleet what-ifs of a trace (a fleet's, or one engine's
    through a fleet), as prepare_timed's: the model fitted on the trace (its replica 0) unless
    given; the fleet every variant starts from, the recorded one (one replica for one engine's)."""
    from tracengine.replay.fleet_whatif import FleetReplay, FleetTraceVariant
    replay = FleetReplay(events, step_time, trace_name)
    model = replay.ensure_step_time()
    spec = SweepSpec(FLEET, source.digest, base, model.to_dict(), slo, policy, fleet=replay.recorded_spec.to_dict())
    replay.step_time = step_time_of(spec.step_time)
    prepared.add(source, events)
    prepared.add_runner(spec, FleetTraceVariant(replay, base, slo, policy))
    return spec, replay.step_time
