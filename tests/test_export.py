"""`tracengine export --perfetto`: the trace-event JSON is well formed and says
what the trace says. Step s lasts (s + 1) ms (see test_stats.py), so step s
starts at s(s+1)/2 ms: 0, 1000, 3000, 6000, 10000, 15000, 21000, 28000 us."""
import json
import random

import pytest

from helpers import cut_like_a_kill
from test_stats import online_case, preemption_case, run_engine, worked_example
from tracengine.cli import main
from tracengine.trace.events import Preempt, RequestAdded
from tracengine.analysis.export_stream import export_perfetto
from tracengine.trace.tracelog import write_trace

PHASES = {"X", "i", "C", "M"}
METADATA_NAMES = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def start_us(step: int) -> int:
    return step * (step + 1) // 2 * 1000


def validate(doc: dict) -> None:
    """The Trace Event Format as the viewers read it: object form; required keys per
    phase; complete events with durations >= 0 (no B/E to balance); per track,
    timestamps in order and slices that nest or follow each other."""
    assert set(doc) == {"traceEvents", "displayTimeUnit", "metadata"}
    assert doc["displayTimeUnit"] in ("ms", "ns")
    last_ts, open_slices = {}, {}
    for e in doc["traceEvents"]:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str) and isinstance(e.get("args", {}), dict)
        if e["ph"] == "M":
            assert e["name"] in METADATA_NAMES and isinstance(e["tid"], int)
            assert ("name" in e["args"]) if e["name"].endswith("_name") else isinstance(e["args"]["sort_index"], int)
            continue
        assert isinstance(e["ts"], int) and e["ts"] >= 0, e
        if e["ph"] == "C":
            track = ("C", e["pid"], e["name"])
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        else:
            track = (e["pid"], e["tid"])
        assert e["ts"] >= last_ts.get(track, 0), f"timestamps go back on {track}: {e}"
        last_ts[track] = e["ts"]
        if e["ph"] == "i":
            assert e["s"] in ("t", "p", "g")
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e
            stack = open_slices.setdefault(track, [])
            while stack and stack[-1] <= e["ts"]:
                stack.pop()                                  # slices that ended before this one
            assert not stack or e["ts"] + e["dur"] <= stack[-1], f"slices overlap on {track}: {e}"
            stack.append(e["ts"] + e["dur"])


def request_spans(doc: dict, seq_id: int) -> list[tuple]:
    return [(e["name"], e["ts"], e["dur"]) for e in doc["traceEvents"]
            if e["ph"] == "X" and e["pid"] == 2 and e["tid"] == seq_id + 1]


def export(events, tmp_path) -> dict:
    path = tmp_path / "out.json"
    written = export_perfetto(events, path)
    doc = json.loads(path.read_text())
    assert written["metadata"] == doc["metadata"] and written["num_trace_events"] == len(doc["traceEvents"])
    return doc


def random_run():
    rng = random.Random(7)
    n = 14
    return run_engine([rng.randint(3, 30) for _ in range(n)], max_tokens=6,
                      arrivals=sorted(rng.randint(0, 12) for _ in range(n)),
                      num_kvcache_blocks=14, max_num_batched_tokens=24, max_num_seqs=6)


@pytest.mark.parametrize("make", [worked_example, preemption_case, random_run])
def test_export_is_valid_trace_event_json(make, tmp_path):
    events = make()
    doc = export(events, tmp_path)
    validate(doc)
    kinds = {(e["ph"], e["name"]) for e in doc["traceEvents"]}
    assert {("C", "free_kv_blocks"), ("C", "batch"), ("C", "tokens"), ("C", "queues")} <= kinds
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    added = {e.seq_id: e.step for e in events if type(e) is RequestAdded}
    assert [names[(2, s + 1)] for s in added] == [f"seq {s}" for s in added]   # a track per request
    for seq_id, step in added.items():
        spans = request_spans(doc, seq_id)
        assert spans[0][1] == start_us(step), seq_id       # from arrival
        for (_, ts, dur), (_, next_ts, _) in zip(spans, spans[1:]):
            assert ts + dur == next_ts    # back to back, from arrival to finish
    preempts = [e for e in events if type(e) is Preempt]
    instants = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert len([e for e in instants if e["name"] == "preempt"]) == len(preempts)
    # each request's events come when it has finished: the arrivals in finishing order, each once
    assert sorted(e["args"]["seq_id"] for e in instants if e["name"] == "arrival") == sorted(added)
    if make is random_run:
        assert preempts   # the random run is meant to preempt


def test_engine_track_of_the_worked_example(tmp_path):
    doc = export(worked_example(), tmp_path)
    steps = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert [(e["name"], e["ts"], e["dur"]) for e in steps] == [
        ("prefill", 0, 1000), ("prefill", 1000, 2000), ("decode", 3000, 3000), ("decode", 6000, 4000)]
    assert {k: steps[1]["args"][k] for k in ("batch_size", "num_batched_tokens", "stop_reason", "seq_ids")} == {
        "batch_size": 3, "num_batched_tokens": 19, "stop_reason": "waiting_empty", "seq_ids": [0, 1, 2]}
    # step 1 (2000 us from 1000): schedule 100, model 1800, postprocess 100
    phases = [(e["name"], e["ts"], e["dur"]) for e in doc["traceEvents"]
              if e.get("cat") == "phase" and e["args"]["step"] == 1]
    assert phases == [("schedule", 1000, 100), ("model", 1100, 1800), ("postprocess", 2900, 100)]
    free = [(e["ts"], e["args"]["num_free_blocks"]) for e in doc["traceEvents"] if e["name"] == "free_kv_blocks"]
    assert free == [(1000, 57), (3000, 53), (6000, 52), (10000, 64)]
    tokens = [e["args"]["num_batched_tokens"] for e in doc["traceEvents"] if e["name"] == "tokens"]
    assert tokens == [20, 19, 3, 3]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"engine", "requests"}


def test_request_tracks_of_the_preemption_case(tmp_path):
    doc = export(preemption_case(), tmp_path)
    # seq 0: chunks at steps 0 and 1, decode 2..4
    assert request_spans(doc, 0) == [("prefill", 0, 1000), ("prefill", 1000, 2000), ("decode", 3000, 12000)]
    # seq 1: waits through step 0, prefill at 1, decode 2..4
    assert request_spans(doc, 1) == [("waiting", 0, 1000), ("prefill", 1000, 2000), ("decode", 3000, 12000)]
    # seq 2: preempted at step 2 by seq 1, blocked at 3 and 4, re-prefilled at 5, decode 6..7
    assert request_spans(doc, 2) == [("waiting", 0, 1000), ("prefill", 1000, 2000), ("preempted", 3000, 12000),
                                     ("prefill", 15000, 6000), ("decode", 21000, 15000)]
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == 3 and e["pid"] == 2]
    assert spans[3]["args"] == {"seq_id": 2, "steps": [5, 5], "chunk": 0, "num_tokens": 3, "recompute": True}
    assert spans[4]["args"]["num_tokens"] == 2
    [instant] = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["name"] == "preempt"]
    assert (instant["pid"], instant["tid"], instant["ts"], instant["s"]) == (2, 3, 3000, "t")
    assert instant["args"] == {"step": 2, "by_seq_id": 1, "num_computed_tokens": 6, "num_freed_blocks": 2}


def test_running_request_left_out_of_a_prefill_step_is_paused(tmp_path):
    # seq 0 (4 tokens) arrives at step 0, seq 1 (4 tokens) before step 2: step 2 prefills seq 1 only
    doc = export(run_engine([4, 4], max_tokens=4, arrivals=[0, 2]), tmp_path)
    assert [name for name, _, _ in request_spans(doc, 0)] == ["prefill", "decode", "paused", "decode"]
    assert request_spans(doc, 0)[2] == ("paused", start_us(2), 3000)




def test_cli_export(tmp_path, capsys):
    trace, out = tmp_path / "run.trace", tmp_path / "out.json"
    write_trace(trace, preemption_case())
    assert main(["export", str(trace), "--perfetto", str(out)]) == 0
    assert "8 steps, 3 requests" in capsys.readouterr().out
    validate(json.loads(out.read_text()))


def test_export_of_a_torn_trace(tmp_path):
    trace = tmp_path / "run.trace"
    write_trace(trace, preemption_case())
    cut_like_a_kill(trace, 5)
    doc = export(str(trace), tmp_path)
    validate(doc)
    assert doc["metadata"]["num_steps"] == 7 and doc["metadata"]["torn_tail"]


@pytest.mark.parametrize("damage", ["missing", "flipped byte"])
def test_cli_export_bad_input(tmp_path, capsys, damage):
    trace, out = tmp_path / "run.trace", tmp_path / "out.json"
    if damage == "flipped byte":
        write_trace(trace, preemption_case())
        data = bytearray(trace.read_bytes())
        data[len(data) // 2] ^= 0xFF
        trace.write_bytes(bytes(data))
    assert main(["export", str(trace), "--perfetto", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: ") and err.count("\n") == 1
    assert not out.exists()     # nothing half-written


def test_arrivals_and_idle_gaps_of_an_online_run(tmp_path):
    """test_stats.online_case: steps of 1 ms at 0, 1, 2, then idle 3..8 ms, steps at 8, 10, 11 ms;
    s1 arrives at 7.5 ms, s2 at 9.5 ms."""
    doc = export(online_case(), tmp_path)
    validate(doc)
    steps = [(e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert steps == [(0, 1000), (1000, 1000), (2000, 1000), (8000, 1000), (10000, 1000), (11000, 1000)]
    idle = [(e["ts"], e["dur"], e["args"]) for e in doc["traceEvents"] if e.get("cat") == "idle"]
    # idle from the end of step 2 until s1 arrived; the 1 ms gap before step 4 (s1 in flight) is not idle
    assert idle == [(3000, 4500, {"before_step": 3, "idle_ns": 4_500_000, "gap_ns": 5_000_000})]
    arrivals = sorted((e["tid"], e["ts"]) for e in doc["traceEvents"] if e["name"] == "arrival")
    assert arrivals == [(1, 0), (2, 7500), (3, 9500)]
    assert request_spans(doc, 1) == [("waiting", 7500, 500), ("prefill", 8000, 2000), ("paused", 10000, 1000),
                                     ("decode", 11000, 1000)]
    assert request_spans(doc, 2) == [("waiting", 9500, 500), ("prefill", 10000, 1000)]


def steady_trace(path, num_steps: int) -> None:
    """A run of `num_steps` steps in which a request of 6 tokens arrives every other step and
    asks for 4: as many requests in flight at its end as at its start."""
    from tracengine.engine.llm_engine import LLMEngine
    from tracengine.engine.sampling_params import SamplingParams
    from tracengine.sim.runners import SyntheticRunner
    from tracengine.trace.tracelog import TraceWriter, make_header
    from helpers import make_config
    config = make_config()
    with TraceWriter(path, make_header(config), deflate=False) as writer:
        engine = LLMEngine(config, SyntheticRunner(eos=config.eos), writer)
        for step in range(num_steps):
            if step % 2 == 0:
                engine.add_request([7 + step % 50] * 6, SamplingParams(max_tokens=4, ignore_eos=True))
            engine.step()


def test_export_memory_is_bounded_by_a_step_not_the_trace(tmp_path, monkeypatch):
    """Issue 34: the export streams, so its peak memory does not grow with the trace. The
    reader reads SCAN_BYTES at a time: made small here, so both traces are many reads long."""
    import tracemalloc
    from tracengine.trace import reader
    monkeypatch.setattr(reader, "SCAN_BYTES", 8 << 10)
    steady_trace(tmp_path / "warm.trace", 10)
    export_perfetto(str(tmp_path / "warm.trace"), tmp_path / "warm.json")     # its imports, not measured
    peaks = []
    for num_steps in (1000, 4000):
        trace = tmp_path / f"{num_steps}.trace"
        steady_trace(trace, num_steps)
        tracemalloc.start()
        export_perfetto(str(trace), tmp_path / f"{num_steps}.json")
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        validate(json.loads((tmp_path / f"{num_steps}.json").read_text()))
    assert peaks[1] < 1.25 * peaks[0], peaks     # 4 times the steps: not 4 times the memory


def test_a_one_pass_read_names_damage_as_the_indexed_read_does(tmp_path):
    from tracengine.errors import TraceCorruptError
    from tracengine.trace.tracelog import TraceReader
    trace = tmp_path / "run.trace"
    steady_trace(trace, 600)
    data = bytearray(trace.read_bytes())
    data[-2000] ^= 0xFF                  # a late frame: many slices after the first
    trace.write_bytes(bytes(data))
    with TraceReader(trace) as reader:
        with pytest.raises(TraceCorruptError) as indexed:
            list(reader.events())
    with TraceReader(trace, max_frames=1) as reader:
        with pytest.raises(TraceCorruptError) as once:
            list(reader.events_once(frames_per_slice=50))
    assert str(once.value) == str(indexed.value) and once.value.offset == indexed.value.offset
