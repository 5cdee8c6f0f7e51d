"""A disabled sink builds no events; an enabled one sees every step in order."""

import tracengine.engine.block_manager
import tracengine.engine.llm_engine
import tracengine.engine.scheduler
from tracengine.trace.events import ScheduleDecision, StepEnd
from tracengine.trace.sinks import NULL_SINK, ListSink
from tracengine.engine.llm_engine import LLMEngine
from tracengine.sim.runners import SyntheticRunner
from tracengine.engine.sampling_params import SamplingParams

from helpers import make_config


def run_workload(sink):
    config = make_config(num_kvcache_blocks=10, max_num_batched_tokens=16)
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos), sink)
    for n in (25, 8, 6, 12):
        engine.add_request(list(range(1, n + 1)), SamplingParams(max_tokens=6, ignore_eos=True))
    while not engine.is_finished():
        engine.step()
    return engine


def test_disabled_sink_builds_no_event(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an event was built with no sink attached")

    for module in (tracengine.engine.scheduler, tracengine.engine.block_manager, tracengine.engine.llm_engine):
        for name in dir(module):
            if name in ("ScheduleDecision", "ScheduledSeq", "Preempt", "TokenSample", "SeqFinish", "BlockAllocate",
                        "BlockAppend", "BlockHash", "BlockFree", "StepEnd", "RequestAdded"):
                monkeypatch.setattr(module, name, refuse)
    engine = run_workload(NULL_SINK)
    assert engine.num_steps > 0


def test_one_decision_and_one_step_end_per_step():
    sink = ListSink()
    engine = run_workload(sink)
    decisions = [e.step for e in sink.events if isinstance(e, ScheduleDecision)]
    ends = [e.step for e in sink.events if isinstance(e, StepEnd)]
    assert decisions == ends == list(range(engine.num_steps))
    steps = [e.step for e in sink.events]
    assert steps == sorted(steps)
