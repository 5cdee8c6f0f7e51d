"""A sink that reads no decode step's sequences (a lean live fold, trace/sinks.py) gets a decode
step's ScheduleDecision with its `seqs` empty, every other field as it was; a prefill or mixed
step's keeps them. A simulation's figures are the same either way."""
import msgspec
import pytest

from tracengine.analysis.stats import stats
from tracengine.analysis.timeline_sink import RequestTimelineSink
from tracengine.engine.config import Config
from tracengine.engine.request import Request
from tracengine.sim.engine import run_timed
from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime
from tracengine.trace.events import ScheduleDecision
from tracengine.trace.header import make_header
from tracengine.trace.sinks import ListSink

CONFIG = Config(num_kvcache_blocks=24, kvcache_block_size=4, max_num_batched_tokens=16, max_num_seqs=3,
                max_model_len=64, scheduling_policy="mixed", eos=999)
REQUESTS = [Request(list(range(5 * i, 5 * i + 9 + 6 * (i % 3))), 4 + i % 5, arrival_ns=i * 30_000, ignore_eos=True)
            for i in range(10)]


class NoDecodeSeqs(ListSink):
    decode_seqs = False


def timing() -> LinearStepTime:
    return LinearStepTime({phase: {part: [1000.0 * (k + 1) for k in range(len(FEATURES))] for part in PARTS}
                           for phase in ("prefill", "decode", "mixed")}, gap_ns=5_000, wake_ns=0)


def decisions(sink) -> list[ScheduleDecision]:
    run_timed(CONFIG, list(REQUESTS), timing(), sink=sink)
    return [e for e in sink.events if type(e) is ScheduleDecision]


def test_a_decode_steps_sequences_only_for_a_sink_that_reads_them():
    kept, without = decisions(ListSink()), decisions(NoDecodeSeqs())
    phases = {d.phase for d in kept}
    assert {"decode", "prefill"} <= phases and "mixed" in phases
    assert all(d.seqs for d in kept)
    assert [d.seqs for d in without] == [[] if d.phase == "decode" else d.seqs for d in kept]
    assert [msgspec.structs.replace(d, seqs=[]) for d in without] == [msgspec.structs.replace(d, seqs=[]) for d in kept]


@pytest.mark.parametrize("lean", [True, False])
def test_only_a_lean_live_fold_with_no_writer_behind_it_reads_no_decode_sequences(lean):
    header = make_header(CONFIG)
    assert RequestTimelineSink(header, lean=lean).decode_seqs is not lean
    assert RequestTimelineSink(header, inner=ListSink(), lean=lean).decode_seqs
    assert RequestTimelineSink(header, inner=NoDecodeSeqs(), lean=lean).decode_seqs is not lean


def test_a_lean_live_folds_figures_are_those_of_every_event():
    lean = RequestTimelineSink(make_header(CONFIG), lean=True)
    assert not lean.decode_seqs
    run_timed(CONFIG, list(REQUESTS), timing(), sink=lean)
    every_event = ListSink()
    run_timed(CONFIG, list(REQUESTS), timing(), sink=every_event)
    assert stats(lean.timeline) == stats([make_header(CONFIG)] + every_event.events)


def test_a_fleets_lean_live_fold_reads_no_decode_sequences_unless_a_writer_is_behind_it():
    from tracengine.fleet.engine import fleet_header
    from tracengine.fleet.spec import FleetSpec
    from tracengine.fleet.stats import FleetTimelines
    header = fleet_header(CONFIG, timing(), FleetSpec(2, "round_robin"))
    assert not FleetTimelines(header, lean=True).decode_seqs
    assert FleetTimelines(header, ListSink(), lean=True).decode_seqs
    assert FleetTimelines(header).decode_seqs
