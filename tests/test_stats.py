"""`tracengine stats`: figures checked against small traces computed by hand.

Traces come from LLMEngine + SyntheticRunner with their StepEnd timings
replaced by fixed ones: step s lasts (s + 1) ms, so step s starts at
s(s+1)/2 ms and ends at (s+1)(s+2)/2 ms."""
import itertools
import json
import subprocess
import sys

import msgspec
import pytest

from helpers import cut_like_a_kill, make_config
from tracengine.cli import main
from tracengine.trace.events import RequestAdded, StepEnd, TokenSample
from tracengine.trace.sinks import ListSink
from tracengine.engine.llm_engine import LLMEngine
from tracengine.sim.runners import SyntheticRunner
from tracengine.engine.sampling_params import SamplingParams
from tracengine.analysis.figures import percentile, summarize, summarize_counts
from tracengine.analysis.stats import stats
from tracengine.trace.tracelog import TraceWriter, make_header

MS = 1_000_000


def fixed_timing(event):
    """Step s lasts 0.1 + (s + 0.8) + 0.1 = s + 1 ms, with no gap before it; a request arrives
    at the start of the step it was added before (as in a format-1 trace)."""
    if type(event) is RequestAdded:
        return msgspec.structs.replace(event, arrival_ns=-1)
    if type(event) is not StepEnd:
        return event
    return msgspec.structs.replace(event, schedule_ns=MS // 10, model_ns=event.step * MS + 8 * MS // 10,
                                   postprocess_ns=MS // 10, gap_ns=0)


def run_engine(prompt_lens, max_tokens, arrivals=None, **overrides) -> list:
    """Header first, then the events of the run; prompts share no tokens."""
    config = make_config(**overrides)
    sink = ListSink()
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos), sink)
    arrivals = arrivals or [0] * len(prompt_lens)
    pending = list(zip(arrivals, prompt_lens))
    while pending or not engine.is_finished():
        while pending and (pending[0][0] <= engine.num_steps or engine.is_finished()):
            _, n = pending.pop(0)
            prompt = [1000 + engine.next_seq_id * 10000 + j for j in range(n)]
            engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        engine.step()
    return [make_header(config)] + [fixed_timing(e) for e in sink.events]


def worked_example():
    # the seeds' example: budget 20, prompts 25, 8, 6; roomy cache
    return run_engine([25, 8, 6], max_tokens=3, num_kvcache_blocks=64, max_num_batched_tokens=20)


def preemption_case():
    # same workload, 11 blocks of 4: step 1 takes all 7 + 2 + 2; step 2 seq 1 (9 tokens) needs a block,
    # the running tail seq 2 gives way; seq 2 (7 tokens, 2 blocks) then waits for blocks until step 5
    return run_engine([25, 8, 6], max_tokens=4, num_kvcache_blocks=11, max_num_batched_tokens=20)


def per_request(s, key):
    return [r[key] for r in s["per_request"]]


def test_percentiles_on_a_known_list():
    values = list(range(100, -1, -1))          # 0..100 unsorted: rank p lands on the value p
    assert summarize(values) == {"count": 101, "mean": 50.0, "p50": 50.0, "p90": 90.0, "p99": 99.0}
    assert percentile([0.0, 10.0], 50) == 5.0   # halfway between the two
    assert percentile([0.0, 10.0], 90) == 9.0
    assert percentile([7.0], 99) == 7.0
    assert summarize([]) == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}


def test_figures_of_counted_values_are_those_of_the_list_that_repeats_them():
    """summarize_counts({value: count}) is summarize of the list holding each value count times
    (ITL is counted this way: a run's memory does not grow with its tokens)."""
    import random
    rng = random.Random(7)
    for _ in range(200):
        counts = {rng.randrange(-5, 40) * 250_000: rng.randrange(1, 30) for _ in range(rng.randrange(1, 12))}
        values = [v / 1e9 for v, c in counts.items() for _ in range(c)]
        rng.shuffle(values)
        got, want = summarize_counts(counts, 1e9), summarize(values)
        assert got.keys() == want.keys() and got["count"] == want["count"]
        for key in ("mean", "p50", "p90", "p99"):
            assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-15)
    assert summarize_counts({}) == summarize([])
    assert summarize_counts({1: 8, 4: 1}) == summarize([1] * 8 + [4])


def test_worked_example_figures():
    s = stats(worked_example())
    assert s["requests"] == {"num_requests": 3, "num_finished": 3, "num_unfinished": 0,
                             "finish_reasons": {"length": 3}, "num_aborted": 0}
    # step 0: 20 tokens of seq 0; step 1: its last 5 + 8 + 6 = 19; steps 2, 3: decode 3 each
    assert s["tokens"] == {"num_prompt_tokens": 39, "num_completion_tokens": 9,
                           "num_prefill_tokens": 39, "num_decode_tokens": 6}
    assert s["steps"] == {"num_steps": 4, "num_prefill_steps": 2, "num_decode_steps": 2,
                          "total_s": 0.010, "prefill_s": 0.003, "decode_s": 0.007,   # 1+2 | 3+4 ms
                          "gap_s": 0.0, "mean_gap_s": 0.0, "idle_s": 0.0, "num_idle_gaps": 0,
                          "num_mixed_steps": 0, "mixed_s": 0.0}
    assert per_request(s, "first_scheduled_step") == [0, 1, 1]
    assert per_request(s, "first_token_step") == [1, 1, 1]       # seq 0 after its second chunk
    assert per_request(s, "queueing_steps") == [0, 1, 1]
    assert per_request(s, "ttft_steps") == [2, 2, 2]             # steps 0 and 1
    assert per_request(s, "e2e_steps") == [4, 4, 4]              # tokens at steps 1, 2, 3
    assert per_request(s, "queueing_s") == [0.0, 0.001, 0.001]   # step 0 lasts 1 ms
    assert per_request(s, "ttft_s") == [0.003, 0.003, 0.003]     # end of step 1: 1 + 2 ms
    assert per_request(s, "e2e_s") == [0.010, 0.010, 0.010]      # end of step 3: 1 + 2 + 3 + 4 ms
    lat = s["latency"]
    assert lat["ttft"]["steps"] == {"count": 3, "mean": 2.0, "p50": 2.0, "p90": 2.0, "p99": 2.0}
    assert lat["itl"]["steps"] == {"count": 6, "mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}
    # ITL per request: end(2) - end(1) = 3 ms, end(3) - end(2) = 4 ms
    assert lat["itl"]["seconds"]["p50"] == pytest.approx(0.0035)
    assert lat["queueing"]["steps"]["mean"] == pytest.approx(2 / 3)
    assert s["throughput"]["prefill_tokens_per_s"] == pytest.approx(39 / 0.003)
    assert s["throughput"]["decode_tokens_per_s"] == pytest.approx(6 / 0.007)
    assert s["preemption"] == {"num_preemptions": 0, "num_self_preemptions": 0, "num_preempted_requests": 0,
                               "num_recomputed_tokens": 0}
    # 7 + 2 + 2 blocks, no hits
    assert s["prefix_cache"] == {"num_allocated_blocks": 11, "num_hit_blocks": 0, "block_hit_rate": 0.0,
                                 "num_lookup_tokens": 39, "num_hit_tokens": 0, "token_hit_rate": 0.0}
    # free after each step: 57, 53, 52, 64 of 64; used 7, 11, 12, 0
    assert s["kv_blocks"] == {"num_blocks": 64, "utilization_mean": pytest.approx(30 / 64 / 4), "utilization_peak": 12 / 64,
                              "peak_step": 2, "min_free_blocks": 52}
    assert s["head_of_line"] == {"num_blocked_steps": 0, "num_blocked_prefill_steps": 0,
                                 "num_blocked_decode_steps": 0, "num_blocked_requests": 0}


def test_preemption_case_figures():
    s = stats(preemption_case())
    # steps: 0 P seq0 x20 | 1 P 0x5 1x8 2x6 | 2 D 0,1 (2 preempted by 1) | 3, 4 D 0,1 (2 blocked)
    #        | 5 P seq 2: 7 tokens, 1 cached block, computes 3 | 6, 7 D seq 2
    assert s["steps"]["num_steps"] == 8
    assert (s["steps"]["num_prefill_steps"], s["steps"]["num_decode_steps"]) == (3, 5)
    assert s["tokens"] == {"num_prompt_tokens": 39, "num_completion_tokens": 12,
                           "num_prefill_tokens": 20 + 19 + 3, "num_decode_tokens": 2 + 2 + 2 + 1 + 1}
    assert s["preemption"] == {"num_preemptions": 1, "num_self_preemptions": 0, "num_preempted_requests": 1,
                               "num_recomputed_tokens": 6}     # seq 2's prompt was in the cache
    assert per_request(s, "num_preemptions") == [0, 0, 1]
    assert per_request(s, "first_token_step") == [1, 1, 1]
    assert per_request(s, "finish_step") == [4, 4, 7]
    assert per_request(s, "ttft_steps") == [2, 2, 2]
    assert per_request(s, "e2e_steps") == [5, 5, 8]
    assert per_request(s, "e2e_s") == [0.015, 0.015, 0.036]   # ends of steps 4 and 7: 15 and 36 ms
    # ITL in steps: seqs 0 and 1 at 1, 2, 3, 4; seq 2 at 1, 5, 6, 7
    itl = s["latency"]["itl"]
    assert itl["steps"]["count"] == 9
    assert itl["steps"]["mean"] == 12 / 9
    assert itl["steps"]["p50"] == 1.0
    assert itl["steps"]["p90"] == pytest.approx(1.6)       # rank 7.2 of [1]*8 + [4]
    assert itl["steps"]["p99"] == pytest.approx(3.76)      # rank 7.92
    # seq 2's long gap: end(5) - end(1) = 21 - 3 = 18 ms
    assert itl["seconds"]["p99"] == pytest.approx(0.008 + (0.018 - 0.008) * 0.92)
    # 7 + 2 + 2 + 2 blocks allocated, seq 2's first block a hit on re-prefill: 25 + 8 + 6 + 7 tokens looked up
    assert s["prefix_cache"] == {"num_allocated_blocks": 13, "num_hit_blocks": 1, "block_hit_rate": 1 / 13,
                                 "num_lookup_tokens": 46, "num_hit_tokens": 4, "token_hit_rate": 4 / 46}
    # free after each step: 4, 0, 1, 1, 11, 9, 9, 11 of 11 -> used 7+11+10+10+0+2+2+0 = 42 blocks*steps
    assert s["kv_blocks"] == {"num_blocks": 11, "utilization_mean": pytest.approx(42 / 11 / 8),
                              "utilization_peak": 1.0, "peak_step": 1, "min_free_blocks": 0}
    # steps 3 and 4 decode because the waiting head, seq 2, does not fit
    assert s["head_of_line"] == {"num_blocked_steps": 2, "num_blocked_prefill_steps": 0,
                                 "num_blocked_decode_steps": 2, "num_blocked_requests": 1}


def test_head_of_line_counts_prefill_and_decode_steps():
    # 6 blocks of 4. Step 0: seq 0 (12 tokens, 3 blocks) and seq 1 (9, 3) take all 6; the head seq 2
    # (8 tokens, 2 blocks) does not fit: prefill stops on no_free_blocks. Step 1: the head still does not
    # fit, so the step decodes (seq 0 preempts seq 1 for a block) with seq 2 as blocked_seq_id.
    s = stats(run_engine([12, 9, 8], max_tokens=2, num_kvcache_blocks=6))
    assert s["head_of_line"] == {"num_blocked_steps": 2, "num_blocked_prefill_steps": 1,
                                 "num_blocked_decode_steps": 1, "num_blocked_requests": 1}
    assert s["preemption"]["num_recomputed_tokens"] == 9   # seq 1's prompt


JSON_KEYS = {
    "stats_version": None,
    "trace": {"torn_tail", "kvcache_block_size", "num_kvcache_blocks"},
    "requests": {"num_requests", "num_finished", "num_unfinished", "finish_reasons", "num_aborted"},
    "tokens": {"num_prompt_tokens", "num_completion_tokens", "num_prefill_tokens", "num_decode_tokens"},
    "steps": {"num_steps", "num_prefill_steps", "num_decode_steps", "total_s", "prefill_s", "decode_s",
              "gap_s", "mean_gap_s", "idle_s", "num_idle_gaps", "num_mixed_steps", "mixed_s"},
    "throughput": {"prefill_tokens_per_s", "decode_tokens_per_s", "completion_tokens_per_s", "requests_per_s",
                   "total_tokens_per_s", "mixed_tokens_per_s"},
    "latency": {"queueing", "ttft", "itl", "tpot", "e2e"},
    "goodput": None,
    "preemption": {"num_preemptions", "num_self_preemptions", "num_preempted_requests", "num_recomputed_tokens"},
    "prefix_cache": {"num_allocated_blocks", "num_hit_blocks", "block_hit_rate", "num_lookup_tokens",
                     "num_hit_tokens", "token_hit_rate"},
    "kv_blocks": {"num_blocks", "utilization_mean", "utilization_peak", "peak_step", "min_free_blocks"},
    "head_of_line": {"num_blocked_steps", "num_blocked_prefill_steps", "num_blocked_decode_steps",
                     "num_blocked_requests"},
    "sessions": None,
    "spec_decoding": None,
    "lora_adapters": None,
    "cpu_tier": None,
    "kv_connector": None,          # a vLLM trace's KV connector (analysis/vllm_inputs.py)
    "structured_output": None,     # and its grammars
    "kv_groups": None,             # a hybrid model's KV cache groups (analysis/kv_groups.py)
    "per_request": None,
}
REQUEST_KEYS = {"seq_id", "added_step", "arrival_s", "first_scheduled_step", "first_token_step", "finish_step",
                "finish_reason", "num_prompt_tokens", "num_completion_tokens", "num_preemptions", "queueing_steps",
                "ttft_steps", "tpot_steps", "e2e_steps", "queueing_s", "ttft_s", "tpot_s", "e2e_s"}
GOODPUT_KEYS = {"slo_s", "num_good_requests", "good_request_share", "requests_per_s"}


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "run.trace"
    events = preemption_case()
    with TraceWriter(path, events[0]) as writer:
        for event in events[1:]:
            writer.emit(event)
    return path


def test_json_keys_are_stable(trace_file, capsys):
    assert main(["stats", str(trace_file), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert list(s) == list(JSON_KEYS)
    assert s["stats_version"] == 1
    for key, fields in JSON_KEYS.items():
        if fields is not None:
            assert set(s[key]) == fields, key
    assert s["goodput"] is None                    # no --slo given
    for name in ("queueing", "ttft", "itl", "tpot", "e2e"):
        for unit in ("steps", "seconds"):
            assert set(s["latency"][name][unit]) == {"count", "mean", "p50", "p90", "p99"}
    assert all(set(r) == REQUEST_KEYS for r in s["per_request"])


def test_a_file_gives_the_figures_of_its_events(trace_file):
    assert stats(trace_file) == stats(preemption_case())
    assert stats(str(trace_file)) == stats(preemption_case())


def test_python_api(trace_file):
    import tracengine
    import tracengine.analysis.stats  # noqa: F401  importing the module leaves tracengine.stats the function
    assert tracengine.stats(trace_file) == stats(trace_file)


def test_text_form(trace_file, capsys):
    assert main(["stats", str(trace_file)]) == 0
    out = capsys.readouterr().out
    assert "3 requests (3 finished), 39 prompt + 12 completion tokens" in out
    assert "8 steps (3 prefill, 5 decode)" in out
    assert "1 (0 self) of 1 requests, 6 tokens recomputed" in out
    assert "1/13 blocks (7.7%)" in out


def test_torn_trace_gives_every_complete_step(trace_file):
    cut_like_a_kill(trace_file, 5)
    s = stats(trace_file)
    assert s["steps"]["num_steps"] == 7
    assert s["trace"]["torn_tail"].startswith("torn last frame: ")
    assert s["requests"]["num_unfinished"] == 1     # seq 2 finishes in the lost step 7


def test_stats_of_a_trace_being_written(tmp_path):
    path = tmp_path / "live.trace"
    events = worked_example()
    with TraceWriter(path, events[0]) as writer:
        for event in events[1:]:
            writer.emit(event)
            if type(event) is StepEnd and event.step == 1:
                s = stats(path)     # the writer is still open
                assert s["steps"]["num_steps"] == 2
                assert per_request(s, "first_token_step") == [1, 1, 1]


@pytest.mark.parametrize("content, message", [
    (None, "No such file"),
    (b"not a trace at all", "not a tracengine trace"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "bad.trace"
    if content is not None:
        path.write_bytes(content)
    assert main(["stats", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: ") and message in err and err.count("\n") == 1


def test_corrupt_trace_names_the_offset(trace_file, capsys):
    data = bytearray(trace_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    trace_file.write_bytes(bytes(data))
    assert main(["stats", str(trace_file), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "checksum" in captured.err and "offset" in captured.err and captured.err.count("\n") == 1


def test_no_torch_on_the_analysis_side():
    code = "import sys, tracengine.analysis.stats, tracengine.analysis.export; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def online_case():
    """Three requests arriving over time, every step 1 ms, gaps as set by hand:
    s0 (8 tokens, 3 out) at 0: steps 0-2 at [0,1] [1,2] [2,3] ms; the engine then idles 5 ms;
    s1 (4 tokens, 2 out) arrived at 7.5 ms, prefilled in step 3 at [8,9]; s2 (4 tokens, 1 out)
    arrived at 9.5 ms, prefilled in step 4 at [10,11] after a 1 ms gap (prefill first: s1 waits);
    step 5 at [11,12] decodes s1's second token."""
    config = make_config()
    sink = ListSink()
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos), sink)
    sp = dict(temperature=0.0, ignore_eos=True)
    engine.add_request(list(range(100, 108)), SamplingParams(max_tokens=3, **sp))
    for _ in range(3):
        engine.step()
    engine.add_request(list(range(200, 204)), SamplingParams(max_tokens=2, **sp))
    engine.step()
    engine.add_request(list(range(300, 304)), SamplingParams(max_tokens=1, **sp))
    while not engine.is_finished():
        engine.step()
    arrivals, gaps = {0: 0, 1: 7_500_000, 2: 9_500_000}, {3: 5 * MS, 4: MS}

    def timed(event):
        if type(event) is RequestAdded:
            return msgspec.structs.replace(event, arrival_ns=arrivals[event.seq_id])
        if type(event) is StepEnd:
            return msgspec.structs.replace(fixed_timing(event), model_ns=8 * MS // 10, gap_ns=gaps.get(event.step, 0))
        return event
    return [make_header(config)] + [timed(e) for e in sink.events]


def test_online_figures_from_arrival_times():
    s = stats(online_case())
    assert per_request(s, "added_step") == [0, 3, 4]
    assert per_request(s, "arrival_s") == [0.0, 0.0075, 0.0095]
    assert per_request(s, "queueing_s") == pytest.approx([0.0, 0.0005, 0.0005])   # start(3) = 8, start(4) = 10 ms
    assert per_request(s, "ttft_s") == pytest.approx([0.001, 0.0015, 0.0015])     # end(0) = 1, end(3) = 9, end(4) = 11
    assert per_request(s, "e2e_s") == pytest.approx([0.003, 0.0045, 0.0015])      # end(2) = 3, end(5) = 12, end(4)
    # s0: tokens at the ends of steps 0, 1, 2 (1, 2, 3 ms); s1 at steps 3 and 5 (9, 12 ms); s2 one token
    assert per_request(s, "tpot_s") == pytest.approx([0.001, 0.003, None])
    assert per_request(s, "tpot_steps") == [1.0, 2.0, None]
    assert s["latency"]["itl"]["seconds"]["count"] == 3
    assert s["latency"]["itl"]["seconds"]["mean"] == pytest.approx(0.005 / 3)    # 1, 1 and 3 ms
    assert s["latency"]["tpot"]["seconds"]["mean"] == pytest.approx(0.002)
    st = s["steps"]
    assert st["total_s"] == pytest.approx(0.012)        # 6 steps of 1 ms + gaps of 5 and 1 ms
    assert st["gap_s"] == pytest.approx(0.006)
    # idle from the end of step 2 (3 ms) until s1 arrived (7.5 ms); the 0.5 ms to step 3 is the loop's
    assert (st["idle_s"], st["num_idle_gaps"]) == (pytest.approx(0.0045), 1)
    tp = s["throughput"]
    assert tp["requests_per_s"] == pytest.approx(3 / 0.012)
    assert tp["completion_tokens_per_s"] == pytest.approx(6 / 0.012)             # 3 + 2 + 1 tokens
    assert tp["total_tokens_per_s"] == pytest.approx((16 + 6) / 0.012)           # 8 + 4 + 4 prompt tokens
    assert s["goodput"] is None


@pytest.mark.parametrize("slo, good", [
    ({"ttft": 0.0012}, [0]),                    # TTFTs 1, 1.5, 1.5 ms
    ({"ttft": 0.002, "tpot": 0.002}, [0, 2]),   # s1's TPOT is 3 ms; s2 has one token, a TPOT of 0
    ({"e2e": 0.004}, [0, 2]),                   # e2e 3, 4.5, 1.5 ms
    ({"ttft": 0.0015, "tpot": 0.003, "e2e": 0.0045}, [0, 1, 2]),   # every objective met exactly counts
])
def test_goodput_under_slos(slo, good):
    g = stats(online_case(), slo)["goodput"]
    assert set(g) == GOODPUT_KEYS and g["slo_s"] == slo
    assert g["num_good_requests"] == len(good)
    assert g["good_request_share"] == pytest.approx(len(good) / 3)
    assert g["requests_per_s"] == pytest.approx(len(good) / 0.012)


def test_slo_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "online.trace"
    events = online_case()
    with TraceWriter(path, events[0]) as writer:
        for event in events[1:]:
            writer.emit(event)
    assert main(["stats", str(path), "--slo", "ttft=2ms", "--slo", "tpot=0.002s", "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["goodput"]
    assert g["slo_s"] == {"ttft": 0.002, "tpot": 0.002} and g["num_good_requests"] == 2
    assert main(["stats", str(path), "--slo", "ttft=2", "--slo", "tpot=2000us"]) == 0   # a bare number is ms, as in vLLM
    out = capsys.readouterr().out
    assert "goodput       166.667 requests/s: 2 of 3 (66.7%) met ttft <= 2 ms, tpot <= 2 ms" in out
    assert "requests/s    250.000 over the run" in out
    assert ("6 steps (3 prefill, 3 decode) in 12.000 ms (the run's wall time, idle included)\n"
            "gaps between steps: 6.000 ms in all, 1.000 ms mean per step; 4.500 ms of it idle") in out
    for bad in ("ttft", "latency=2ms", "ttft=-1ms", "ttft=soon"):
        assert main(["stats", str(path), "--slo", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tracengine: error: --slo expects NAME=VALUE") and err.count("\n") == 1


def test_an_event_naming_an_unknown_request_is_a_trace_error():
    """Every event that names a sequence must come after its RequestAdded: a trace where one
    does not (spliced, or written by something else) is refused, naming the event, whatever
    its type; the block-level events no figure reads are not checked."""
    from tracengine.analysis.timeline import fold
    from tracengine.errors import TraceError
    from tracengine.trace.events import (BlockAllocate, Preempt, ScheduleDecision, ScheduledSeq, SeqAbort,
                                         SeqFinish, TokenSample)
    header = make_header(make_config())
    known = RequestAdded(0, 1, [1, 2, 3], 4, 1.0, False)
    for event in (ScheduleDecision(0, "decode", [ScheduledSeq(1, 1, 3), ScheduledSeq(7, 1, 3)], 2, "running_empty"),
                  ScheduleDecision(0, "mixed", [ScheduledSeq(1, 1, 3), ScheduledSeq(7, 2, 0)], 3, "waiting_empty",
                                   num_decode_seqs=1),
                  TokenSample(0, 7, 5, True), BlockAllocate(0, 7, [1], 0), Preempt(0, 7, 7, [1], 4),
                  SeqFinish(0, 7, "length", 4, 1), SeqAbort(0, 7, "client", "running", 4, 1)):
        with pytest.raises(TraceError, match=f"{type(event).__name__} at step 0 names seq_id 7, which no "
                                             f"RequestAdded introduced"):
            fold([header, known, event])
        assert fold([header, known, RequestAdded(0, 7, [1], 4, 1.0, False), event]).requests.keys() == {1, 7}
    assert fold([header, known, TokenSample(0, 7, 5, False)]).requests.keys() == {1}   # a middle chunk's: not folded


@pytest.mark.parametrize("with_writer", [False, True])
def test_a_live_fold_gives_the_figures_of_its_events_and_is_freed_with_its_sink(tmp_path, with_writer):
    """RequestTimelineSink (generate's and simulate's summary) folds as the events come: the same
    figures as the events folded after, passed on to a writer unchanged, and no reference cycle:
    with the collector off, the sink and its timeline go when the last reference does."""
    import gc
    import weakref
    from tracengine.analysis.timeline import RequestTimeline
    from tracengine.analysis.timeline_sink import RequestTimelineSink
    from tracengine.trace.tracelog import TraceReader

    def alive_timelines() -> int:     # counted, not weakly referenced: the compiled core's classes take no weakref
        return sum(type(o) is RequestTimeline for o in gc.get_objects())

    events = preemption_case()
    path = tmp_path / "run.trace"
    collecting = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        num_alive = alive_timelines()
        writer = TraceWriter(path, events[0]) if with_writer else None
        sink = RequestTimelineSink(events[0], writer)
        for event in events[1:]:
            sink.emit(event)
        if writer is not None:
            writer.close()
            with TraceReader(path) as reader:
                assert list(reader.events())[1:] == events[1:]
        figures = stats(sink.timeline)
        assert figures == stats(events) and figures["preemption"]["num_preemptions"] > 0
        gone = weakref.ref(sink)
        assert alive_timelines() == num_alive + 1
        del sink, writer
        assert gone() is None and alive_timelines() == num_alive
    finally:
        if collecting:
            gc.enable()


@pytest.mark.parametrize("num_kvcache_blocks", [11, 64])
def test_inter_token_gaps_counted_as_they_come_are_those_of_each_requests_token_steps(num_kvcache_blocks):
    """The fold counts each gap between two kept tokens of a request when the later one's step
    ends, lean or not; they are the gaps of the token steps a full fold keeps, in steps and
    between step ends, a trace cut mid-step (a token with no StepEnd after it) included."""
    from tracengine.analysis.timeline import RequestTimeline, fold
    events = run_engine([25, 8, 6, 13, 30], max_tokens=6, arrivals=[0, 0, 2, 3, 9],
                        num_kvcache_blocks=num_kvcache_blocks, max_num_batched_tokens=20)
    last_end = max(i for i, e in enumerate(events) if type(e) is StepEnd)
    for cut in (events, events[:last_end]):      # whole; the last step's tokens without its end
        full = fold(cut)
        lean = RequestTimeline(lean=True)
        for event in cut:
            lean.add(event)
        want_steps, want_ns = {}, {}
        for req in full.requests.values():
            steps = list(req.token_steps)
            for a, b in zip(steps, steps[1:]):
                want_steps[b - a] = want_steps.get(b - a, 0) + 1
                gap = full.end_ns(b) - full.end_ns(a)
                want_ns[gap] = want_ns.get(gap, 0) + 1
        assert sum(want_steps.values()) > 10
        assert full.itl() == lean.itl() == (want_steps, want_ns)
        assert all(not req.token_steps for req in lean.requests.values())
        assert stats(lean) == stats(full)


def tokens_interleaved(events):
    """The events with each step's kept tokens reordered round-robin over the steps of their
    requests' tokens before (those after tokens of steps 1, 1, 2, 3 come as 1, 2, 3, 1), in
    the places the step's tokens had."""
    out, last, places, groups = list(events), {}, [], {}
    for i, event in enumerate(events):
        if type(event) is TokenSample and event.kept:
            places.append(i)
            groups.setdefault(last.get(event.seq_id, -1), []).append(event)
            last[event.seq_id] = event.step
        elif type(event) is StepEnd:
            order = [e for column in itertools.zip_longest(*groups.values()) for e in column if e is not None]
            for i, e in zip(places, order):
                out[i] = e
            places, groups = [], {}
    return out


def test_inter_token_gaps_do_not_depend_on_the_order_of_a_steps_tokens():
    """The fold counts a step's open gaps in runs of one earlier step: its tokens in another order,
    runs that come back to an earlier step included, give the same gaps, lean or not, a trace cut
    mid-step included; reading them mid-step (`itl`) changes nothing after."""
    from tracengine.analysis.timeline import RequestTimeline, fold
    # step 6's tokens follow tokens of steps 1, 1, 1, 2, 4, 4, 5: interleaved, 1, 2, 4, 5, 1, 4, 1
    events = run_engine([25, 8, 6, 13, 30, 7, 9], max_tokens=6, arrivals=[0, 0, 1, 2, 3, 4, 5],
                        num_kvcache_blocks=64, max_num_batched_tokens=20)
    interleaved = tokens_interleaved(events)
    assert interleaved != events
    last_end = max(i for i, e in enumerate(events) if type(e) is StepEnd)
    for cut in (slice(None), slice(last_end)):
        want = fold(events[cut]).itl()
        lean = RequestTimeline(lean=True)
        for event in interleaved[cut]:
            lean.add(event)
            if type(event) is TokenSample:
                lean.itl()
        assert fold(interleaved[cut]).itl() == lean.itl() == want
