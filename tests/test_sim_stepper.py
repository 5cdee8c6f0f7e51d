"""The simulated engine's compiled step (sim/clock.SimulatedStepper): the same events whether the
clock calls it directly or through the engine's methods; its clock and counts are the engine's;
and the per-step helpers it relies on (Stepped, a linear model's rows, the fold's gap counts)."""
import random

import pytest

from tracengine.analysis.step_figures import GapCounts
from tracengine.engine.config import Config
from tracengine.engine.request import Request
from tracengine.sim.clock import ClockedEngine, SimulatedStepper, Stepped, in_arrival_order, run_in_time
from tracengine.sim.engine import SimulatedEngine
from tracengine.sim.runners import SyntheticRunner
from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime
from tracengine.trace.sinks import ListSink


def linear(mixed: bool = True) -> LinearStepTime:
    """Every weight a different number, so that a weight read from the wrong place shows."""
    rows = ("prefill", "decode", "mixed") if mixed else ("prefill", "decode")
    return LinearStepTime({phase: {part: [1000.5 * (i + 1) + 10 * j + k * 0.25 for k in range(len(FEATURES))]
                                   for j, part in enumerate(PARTS)} for i, phase in enumerate(rows)},
                          gap_ns=7_000, wake_ns=11_000)


def requests() -> list[Request]:
    return [Request(list(range(3 * i, 3 * i + 10 + 7 * (i % 3))), 5 + i % 4, arrival_ns=i * 40_000,
                    ignore_eos=True) for i in range(12)]


def run(policy: str) -> tuple[list, SimulatedEngine]:
    config = Config(num_kvcache_blocks=20, kvcache_block_size=4, max_num_batched_tokens=24, max_num_seqs=4,
                    max_model_len=64, scheduling_policy=policy, eos=999)
    sink = ListSink()
    timing = linear()
    engine = SimulatedEngine(config, SyntheticRunner(eos=config.eos, seed=config.seed), timing, sink, policy=policy)
    run_in_time(ClockedEngine(engine, timing), in_arrival_order(requests()))
    return sink.events, engine


@pytest.mark.parametrize("policy", ["mixed", "prefill_first"])
def test_the_clock_steps_the_engine_through_its_stepper_which_keeps_its_clock_and_counts(policy):
    events, engine = run(policy)
    assert len(events) > 50
    assert engine.now_ns == engine.stepper.now_ns == engine.last_step_end_ns > 0
    assert engine.num_steps == engine.stepper.num_steps > 0


def test_the_engine_keeps_its_clock_and_counts_in_its_stepper():
    engine = SimulatedEngine(Config(num_kvcache_blocks=8), SyntheticRunner(), linear())
    assert isinstance(engine.stepper, SimulatedStepper) and ClockedEngine(engine, linear()).stepper is engine.stepper
    engine.now_ns = 123
    assert engine.stepper.now_ns == engine.clock_ns() == 123
    engine.reset()
    assert (engine.now_ns, engine.num_steps, engine.waits) == (0, 0, False)
    assert engine.stepper.scheduler is engine.scheduler


def test_stepped_is_replaced_as_a_named_tuple_was():
    stepped = Stepped([1], [2], True, 5)
    other = stepped._replace(finished=[])
    assert (other.finished, other.aborted, other.ran, other.end_ns) == ([], [2], True, 5)
    assert stepped.finished == [1] and "end_ns=5" in repr(other)


@pytest.mark.parametrize("mixed_row", [True, False])
def test_a_linear_model_prices_each_phase_by_its_own_row(mixed_row):
    model = linear(mixed_row)
    shape = (37, 3, 1200, 9000)
    for is_prefill, mixed, phase in ((True, False, "prefill"), (False, False, "decode"),
                                     (True, True, "mixed" if mixed_row else "prefill")):
        want = []
        for part in PARTS:
            k, t, s, c, a = model.coefficients[phase][part]
            ns = k + t * shape[0] + s * shape[1] + c * shape[2] + a * shape[3]
            want.append(round(ns) if ns > 0 else 0)
        assert model.predict(is_prefill, *shape, mixed=mixed) == tuple(want)


def test_gap_counts_count_what_dicts_would():
    rng = random.Random(7)
    gaps, steps, ns = GapCounts(), {}, {}
    for i in range(2000):
        size = 1 if rng.random() < 0.8 else rng.randint(1, 4)
        duration, count = size * (10 if rng.random() < 0.9 else 11), rng.randint(1, 3)
        gaps.add(size, duration, count)
        steps[size] = steps.get(size, 0) + count
        ns[duration] = ns.get(duration, 0) + count
        if i % 300 == 0:       # read along the way: counted in, and counting goes on
            assert gaps.copy().counted() == (steps, ns)
    assert gaps.counted() == (steps, ns)


def test_round_ns_is_round():
    from tracengine.sim.steptime import round_ns
    rng = random.Random(3)
    values = [0.5, 1.5, 2.5, 1e-300, 0.49999999999999994, 2.0 ** 52 + 0.5, 2.0 ** 53, 1e20, 4503599627370495.5]
    values += [rng.random() * 10 ** rng.uniform(-5, 19) for _ in range(20_000)]
    values += [rng.randint(0, 10 ** 9) + 0.5 for _ in range(20_000)]
    assert [round_ns(v) for v in values] == [round(v) for v in values]
