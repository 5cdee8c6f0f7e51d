"""Sweeps through SGLang's own scheduler (docs/sweeps.md, docs/sglang.md): the makers of an
SGLang trace's variants (replay/sweeps.py's, for SGLang's scheduler: what-ifs in simulated time
and step-exact ones) and of `simulate --scheduler sglang`'s. A maker is named in the SweepSpec,
so a worker, local or Ray, makes the same variant object from the same source."""
from tracengine.sim.spec import PreparedSources, Source, SweepSpec, step_time_of


def timed_runner(spec: SweepSpec, events: list):
    """replay/timed.TimedVariant over SGLang's scheduler."""
    from tracengine.replay.timed import TimedVariant
    from tracengine.sglang.timed import SglangTimedReplay
    return TimedVariant(SglangTimedReplay(events, step_time_of(spec.step_time)), spec.base, spec.slo)


def step_runner(spec: SweepSpec, events: list):
    """replay/timed.StepVariant over SGLang's scheduler."""
    from tracengine.replay.timed import StepVariant
    from tracengine.sglang.whatif import SglangStepReplay
    return StepVariant(SglangStepReplay(events), spec.base)


def simulate_runner(spec: SweepSpec, requests):
    from tracengine.sglang.simulate import SglangSimulation
    from tracengine.sim.sweep import SimulateVariant
    return SimulateVariant(requests, spec.base, step_time_of(spec.step_time), spec.slo, SglangSimulation)


TIMED, STEPS, SIMULATE = f"{__name__}:timed_runner", f"{__name__}:step_runner", f"{__name__}:simulate_runner"


def prepare_timed(prepared: PreparedSources, source: Source, events: list, step_time, trace_name: str, base: dict,
                  slo, policy=None):
    """As replay/sweeps.prepare_timed (`policy` is tracengine's: an SGLang trace has none)."""
    from tracengine.replay.timed import TimedVariant
    from tracengine.sglang.replay import check_sglang_version
    from tracengine.sglang.timed import SglangTimedReplay
    replay = SglangTimedReplay(events, step_time, trace_name)
    check_sglang_version(replay.header)
    model = replay.ensure_step_time()
    spec = SweepSpec(TIMED, source.digest, base, model.to_dict(), slo)
    replay.step_time = step_time_of(spec.step_time)
    prepared.add(source, events)
    prepared.add_runner(spec, TimedVariant(replay, base, slo))
    return spec, replay.step_time


def prepare_steps(prepared: PreparedSources, source: Source, events: list, base: dict, policy=None) -> SweepSpec:
    """As replay/sweeps.prepare_steps."""
    from tracengine.sglang.replay import check_sglang_version
    check_sglang_version(events[0])
    prepared.add(source, events)
    return SweepSpec(STEPS, source.digest, base, None)
