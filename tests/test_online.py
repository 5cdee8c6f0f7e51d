"""Requests that arrive over time: the engine adds each when its time has come,
sleeps while nothing is runnable (no empty steps), records arrivals and idle
gaps, and the recorded run replays exactly."""
import json
from pathlib import Path

import pytest

from tracengine.cli import main
from tracengine.engine.config import Config
from tracengine.engine.llm_engine import LLMEngine
from tracengine.engine.sampling_params import SamplingParams
from tracengine.replay.reexec import reexecute
from tracengine.sim.runners import SyntheticRunner
from tracengine.trace.events import RequestAdded, ScheduleDecision, StepEnd
from tracengine.trace.sinks import ListSink
from tracengine.trace.tracelog import FORMAT_VERSION, open_trace
from tracengine.workload import arrival_times

DATA = Path(__file__).parent / "data"


def step_starts(events) -> list[int]:
    """Each step's start in ns from the run's start: the gaps and durations before it, plus its gap."""
    starts, t = [], 0
    for e in events:
        if isinstance(e, StepEnd):
            starts.append(t + e.gap_ns)
            t += e.gap_ns + e.schedule_ns + e.model_ns + e.postprocess_ns
    return starts


def check_arrivals(events, arrivals_ns):
    """Every request entered at the first step that started at or after its arrival time."""
    starts = step_starts(events)
    added = [e for e in events if isinstance(e, RequestAdded)]
    assert sorted(e.arrival_ns for e in added) == sorted(arrivals_ns)
    for e in added:
        assert starts[e.step] >= e.arrival_ns                         # not before its arrival
        assert e.step == 0 or starts[e.step - 1] < e.arrival_ns       # and not a step late
    # no empty steps: every step scheduled something
    decisions = [e for e in events if isinstance(e, ScheduleDecision)]
    assert len(decisions) == len(starts) and all(d.seqs for d in decisions)
    return starts, added


def test_engine_waits_for_arrivals_instead_of_running_empty_steps():
    sink = ListSink()
    engine = LLMEngine(Config(num_kvcache_blocks=64, kvcache_block_size=4, max_model_len=256), SyntheticRunner(), sink)
    times = [0.0, 0.0, 0.03, 0.06, 0.061]
    for i, t in enumerate(times):
        engine.add_request(list(range(10 * i + 1, 10 * i + 7)), SamplingParams(max_tokens=3, ignore_eos=True),
                           arrival_ns=round(t * 1e9))
    assert not engine.is_finished()            # requests still to come count as work
    while not engine.is_finished():
        engine.step()
    events = sink.events
    starts, added = check_arrivals(events, [round(t * 1e9) for t in times])
    assert [e.seq_id for e in added] == [0, 1, 2, 3, 4]
    # 3 tokens each, one prefill and two decodes alone (a few ms) before the next arrival 30 ms later:
    # the engine went idle, and the first step after it carries the wait in its gap
    gaps = [e.gap_ns for e in events if isinstance(e, StepEnd)]
    ends = [s + e.schedule_ns + e.model_ns + e.postprocess_ns
            for s, e in zip(starts, (e for e in events if isinstance(e, StepEnd)))]
    s2 = next(e.step for e in added if e.seq_id == 2)
    assert ends[s2 - 1] < 30_000_000 <= starts[s2] and gaps[s2] >= 30_000_000 - ends[s2 - 1]


def test_a_request_that_arrived_earlier_enters_now_and_keeps_its_time():
    sink = ListSink()
    engine = LLMEngine(Config(num_kvcache_blocks=16, kvcache_block_size=4), SyntheticRunner(), sink)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2), arrival_ns=0)
    assert engine.scheduler.waiting and not engine.pending
    assert sink.events[0].arrival_ns == 0


def test_a_request_that_can_never_run_is_refused_when_added(tmp_path):
    from tracengine.errors import RequestError
    engine = LLMEngine(Config(num_kvcache_blocks=2, kvcache_block_size=4), SyntheticRunner(), ListSink())
    with pytest.raises(RequestError, match="the cache has 2"):
        engine.add_request(list(range(20)), SamplingParams(max_tokens=2), arrival_ns=5_000_000_000)
    assert engine.is_finished()


@pytest.fixture(scope="module")
def online_trace(tmp_path_factory, one_torch_thread):
    """A recorded run of the embedded model with Poisson arrivals."""
    from tracengine.engine.llm import LLM
    path = tmp_path_factory.mktemp("online") / "online.trace"
    times = arrival_times(10, 40.0, 1.0, seed=5)
    with LLM(kvcache_block_size=8, num_kvcache_blocks=64, seed=5) as llm:
        prompts = [[(7 * i + j) % 1000 + 1 for j in range(12 + 3 * i)] for i in range(10)]
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
                               record=str(path), use_tqdm=False, arrival_ns=[round(t * 1e9) for t in times])
    assert all(len(o["token_ids"]) == 5 for o in outputs)
    return path, times


def test_generate_with_arrival_times_records_them(online_trace):
    path, times = online_trace
    events = list(read_events(str(path)))
    check_arrivals(events[1:], [round(t * 1e9) for t in times])
    assert events[0].format_version == FORMAT_VERSION


def test_online_run_replays_exactly_and_diffs_against_itself(online_trace, capsys):
    path, _ = online_trace
    result = reexecute(read_events(str(path)))
    assert result.divergence is None and result.num_unfinished == 0
    assert main(["diff", str(path), str(path)]) == 0
    assert main(["replay", str(path)]) == 0
    capsys.readouterr()


def test_generate_arrival_times_must_match_the_prompts():
    from tracengine.engine.llm import LLM
    from tracengine.errors import TracengineError
    with LLM(num_kvcache_blocks=16) as llm:
        with pytest.raises(TracengineError, match="2 prompts but 1 arrival times"):
            llm.generate([[1, 2], [3, 4]], arrival_ns=[0], use_tqdm=False)
        with pytest.raises(TracengineError, match="arrival times are ns from the start"):
            llm.generate([[1, 2]], arrival_ns=[-1], use_tqdm=False)


def events_json(capsys, path, kind):
    assert main(["events", str(path), "--json", "--type", kind]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_cli_mooncake_workload_arrives_on_time_and_hits_the_prefix_cache(tmp_path, capsys):
    trace = tmp_path / "mooncake.trace"
    # arrivals 0, 0.5, 1.5, 1.5 s at --time-scale 4: 0, 0.125, 0.375, 0.375 s
    code = main(["generate", "--workload", str(DATA / "mooncake_sample.jsonl"), "--length-scale", "0.05",
                 "--time-scale", "4", "--block-size", "8", "--num-kvcache-blocks", "64", "--temperature", "0",
                 "--quiet", "--record", str(trace)])
    assert code == 0 and "requests     4 (0 eos, 4 length)" in capsys.readouterr().out
    added = events_json(capsys, trace, "RequestAdded")
    assert [e["arrival_ns"] for e in added] == [0, 125_000_000, 375_000_000, 375_000_000]
    assert [len(e["prompt_token_ids"]) for e in added] == [50, 30, 15, 55]
    hits = {e["seq_id"]: e["num_cached_blocks"] for e in events_json(capsys, trace, "BlockAllocate")}
    assert hits[3] == 50 // 8                 # request 0's prompt is request 3's prefix: 6 whole blocks
    check_arrivals(list(read_events(str(trace)))[1:], [0, 125_000_000, 375_000_000, 375_000_000])
    assert main(["replay", str(trace)]) == 0


def test_cli_request_rate_on_a_synthetic_workload(tmp_path, capsys):
    trace = tmp_path / "rate.trace"
    code = main(["generate", "--num-prompts", "6", "--input-len", "8:16", "--output-len", "2:4",
                 "--request-rate", "50", "--burstiness", "2", "--seed", "3", "--quiet", "--record", str(trace)])
    assert code == 0
    assert "latency      TTFT p50 " in capsys.readouterr().out
    added = events_json(capsys, trace, "RequestAdded")
    assert [e["arrival_ns"] for e in added] == [round(t * 1e9) for t in arrival_times(6, 50.0, 2.0, 3)]


@pytest.mark.parametrize("argv, match", [
    (["--workload", str(DATA / "mooncake_sample.jsonl"), "--length-scale", "0.05", "--max-model-len", "40"],
     "mooncake_sample.jsonl:1: a prompt of 50 tokens can never fit max_model_len=40"),
    (["--workload", str(DATA / "mooncake_sample.jsonl"), "--length-scale", "0.05", "--num-kvcache-blocks", "3"],
     "mooncake_sample.jsonl:1: request of 50 prompt + 1 max tokens needs 4 KV blocks"),
    (["--workload", "no-such-workload.jsonl"], "no-such-workload.jsonl"),
    (["--workload", str(DATA / "azure_sample.csv"), "--workload-format", "mooncake"], "azure_sample.csv:1: not valid JSON"),
    (["--request-rate", "0"], "--request-rate expects a positive number or inf"),
])
def test_cli_workload_errors_are_one_line(capsys, argv, match):
    code = main(["generate", "--quiet", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("tracengine: error: ") and match in err[0], err


def read_events(path: str) -> list:
    return list(open_trace(path))


TRACES = Path(__file__).parent.parent / "traces"


def test_the_kept_online_trace_pins_format_2_with_arrivals(capsys):
    path = TRACES / "online.trace"
    events = read_events(str(path))
    assert events[0].format_version == 2
    arrivals = [e.arrival_ns for e in events if isinstance(e, RequestAdded)]
    starts, added = check_arrivals(events[1:], arrivals)
    assert len(added) == 10 and len({e.step for e in added}) > 5      # entered over the run, not at step 0
    # step 11 finished the last running request; s2 arrived later and step 12 waited for it
    ends = {e.step: starts[e.step] + e.schedule_ns + e.model_ns + e.postprocess_ns
            for e in events if isinstance(e, StepEnd)}
    s2 = next(e for e in added if e.seq_id == 2)
    assert s2.step == 12 and ends[11] < s2.arrival_ns <= starts[12]
    assert main(["diff", str(path), str(path)]) == 0
    assert main(["replay", str(path)]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("name", ["format-v1", "worked_example", "preemption", "default_mix"])
def test_older_traces_still_read_and_replay(name):
    events = read_events(str(TRACES / f"{name}.trace"))
    result = reexecute(events)
    assert result.divergence is None and result.num_unfinished == 0
    if name == "format-v1":
        assert events[0].format_version == 1
        assert all(e.arrival_ns == -1 for e in events if isinstance(e, RequestAdded))
        assert all(e.gap_ns == 0 for e in events if isinstance(e, StepEnd))


def test_a_request_still_to_come_can_be_aborted_before_it_enters():
    sink = ListSink()
    engine = LLMEngine(Config(num_kvcache_blocks=16, kvcache_block_size=4), SyntheticRunner(), sink)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2), arrival_ns=60_000_000_000)
    later = engine.add_request([4, 5, 6], SamplingParams(max_tokens=2), arrival_ns=90_000_000_000)
    assert engine.abort_request(0, "abort") is not None and engine.abort_request(7, "abort") is None
    assert [seq.seq_id for _, _, seq in engine.pending] == [later.seq_id]
    engine.abort_request(later.seq_id, "abort")
    assert engine.is_finished() and sink.events == []       # they never entered: nothing recorded
