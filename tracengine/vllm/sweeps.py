"""Sweeps through vLLM's own scheduler (docs/sweeps.md, docs/vllm.md): the makers of a vLLM
trace's variants (replay/sweeps.py's, for vLLM's scheduler: what-ifs in simulated time and
step-exact ones) and of `simulate --scheduler vllm`'s. A maker is named in the SweepSpec, so
a worker, local or Ray, makes the same variant object from the same source."""
from tracengine.sim.spec import PreparedSources, Source, SweepSpec, step_time_of


def timed_runner(spec: SweepSpec, events: list):
    """replay/timed.TimedVariant over vLLM's scheduler."""
    from tracengine.replay.timed import TimedVariant
    from tracengine.vllm.timed import VllmTimedReplay
    return TimedVariant(VllmTimedReplay(events, step_time_of(spec.step_time)), spec.base, spec.slo)


def step_runner(spec: SweepSpec, events: list):
    """replay/timed.StepVariant over vLLM's scheduler."""
    from tracengine.replay.timed import StepVariant
    from tracengine.vllm.whatif import VllmStepReplay
    return StepVariant(VllmStepReplay(events), spec.base)


def simulate_runner(spec: SweepSpec, requests):
    from tracengine.sim.sweep import SimulateVariant
    from tracengine.vllm.simulate import VllmSimulation
    return SimulateVariant(requests, spec.base, step_time_of(spec.step_time), spec.slo, VllmSimulation)


TIMED, STEPS, SIMULATE = f"{__name__}:timed_runner", f"{__name__}:step_runner", f"{__name__}:simulate_runner"


def prepare_timed(prepared: PreparedSources, source: Source, events: list, step_time, trace_name: str, base: dict,
                  slo, policy=None):
    """As replay/sweeps.prepare_timed (`policy` is tracengine's: a vLLM trace has none)."""
    from tracengine.vllm.replay import check_vllm_version
    from tracengine.vllm.timed import VllmTimedReplay
    replay = VllmTimedReplay(events, step_time, trace_name)
    check_vllm_version(replay.workload.header)
    model = replay.ensure_step_time()
    spec = SweepSpec(TIMED, source.digest, base, model.to_dict(), slo)
    replay.step_time = step_time_of(spec.step_time)
    prepared.add(source, events)
    from tracengine.replay.timed import TimedVariant
    prepared.add_runner(spec, TimedVariant(replay, base, slo))
    return spec, replay.step_time


def prepare_steps(prepared: PreparedSources, source: Source, events: list, base: dict, policy=None) -> SweepSpec:
    """As replay/sweeps.prepare_steps."""
    from tracengine.vllm.replay import check_vllm_version
    from tracengine.trace.tracelog import split_header
    check_vllm_version(split_header(events)[0])
    prepared.add(source, events)
    return SweepSpec(STEPS, source.digest, base, None)
