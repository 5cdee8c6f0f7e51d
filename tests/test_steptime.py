"""Step-time models: calibration recovers known coefficients, the roofline's
counts match hand arithmetic, and a what-if in simulated time under the
recorded config with an exact model gives the recorded schedule."""
import json
import random

import msgspec
import pytest

from tracengine.cli.main import main
from tracengine.engine.config import Config
from tracengine.errors import TracengineError
from tracengine.analysis.timeline import RequestTimeline
from tracengine.replay.reexec import reexecute
from tracengine.sim.roofline import HARDWARE, ModelShape, RooflineStepTime
from tracengine.engine.request import Request
from tracengine.sim.engine import run_timed
from tracengine.replay.timed import timed_whatif
from tracengine.replay.whatif import whatif
from tracengine.engine.sequence import Sequence
from tracengine.sim.steptime import FEATURES, LinearStepTime, calibrate, load_step_time, seqs_shape, step_shape
from tracengine.trace.events import SeqAbort, StepEnd
from tracengine.trace.views import without_wall_clock
from tracengine.trace.tracelog import write_trace
from tracengine.analysis.figures import Stats, to_json_object

# ns per unit of (const, tokens, seqs, context, attended); prefill fits (const, tokens, seqs, attended),
# decode (const, seqs, context)
TRUTH = {
    "prefill": {"schedule_ns": [20_000, 10, 500, 0, 0], "model_ns": [1_000_000, 3_000, 20_000, 0, 2],
                "postprocess_ns": [5_000, 1, 800, 0, 0]},
    "decode": {"schedule_ns": [15_000, 0, 400, 1, 0], "model_ns": [800_000, 0, 50_000, 40, 0],
               "postprocess_ns": [4_000, 0, 700, 0, 0]},
}
CONFIG = Config(num_kvcache_blocks=96, kvcache_block_size=4, max_num_batched_tokens=96, max_num_seqs=8, eos=999)


def bursty_workload(seed=0, n=80):
    """Bursts of arrivals and shared prefixes, so batches mix lengths, chunks and cache hits."""
    rng = random.Random(seed)
    prefix = [rng.randrange(900) for _ in range(24)]
    requests, t = [], 0
    for i in range(n):
        t += rng.choice((0, 0, 1_000_000, 30_000_000))
        head = prefix[:rng.randrange(0, 25)] if rng.random() < 0.5 else []
        prompt = head + [rng.randrange(900) for _ in range(rng.randint(1, 100))]
        requests.append(Request(prompt, rng.randint(1, 30), ignore_eos=True, arrival_ns=t))
    return requests


@pytest.fixture(scope="module")
def recorded():
    return run_timed(CONFIG, bursty_workload(), LinearStepTime(TRUTH, gap_ns=30_000))


def test_step_shape_counts_context_and_scored_pairs():
    # 3 tokens after 5 cached: context 8, pairs 3*5 + (1+2+3) = 21; a decode of 1 after 9: 10 and 10
    assert step_shape([(3, 5), (1, 9)]) == (4, 2, 18, 31)


@pytest.mark.parametrize("seed", range(20))
def test_seqs_shape_of_a_batch_is_its_step_shape(seed):
    """seqs_shape sums a decode batch (one token each) as two sums, and a decode step's batch
    (is_prefill False) or a drafting one the same way: the same shape as step_shape's."""
    rng = random.Random(seed)
    seqs = []
    for i in range(rng.randrange(1, 9)):
        seq = Sequence(i, [1] * 40, 4)
        seq.num_cached_tokens = rng.randrange(40)
        seq.num_scheduled_tokens = 1 if seed % 2 else rng.choice([0, 1, 1, 2, 7])
        seqs.append(seq)
    shape = step_shape((s.num_scheduled_tokens, s.num_cached_tokens) for s in seqs)
    assert seqs_shape(seqs) == shape
    assert seqs_shape(seqs, drafts=True) == shape
    if seed % 2:     # one token each: what a decode step schedules
        assert seqs_shape(seqs, is_prefill=False) == shape


def test_calibration_recovers_known_coefficients(recorded):
    model = calibrate(recorded, "synthetic.trace")
    for phase, parts in TRUTH.items():
        for part, weights in parts.items():
            assert model.coefficients[phase][part] == pytest.approx(weights, rel=1e-6, abs=1e-3), (phase, part)
    assert model.gap_ns == 30_000
    for name in ("total", "model"):
        assert model.error["held_out"][name]["total_rel"] == pytest.approx(0, abs=1e-9)
        assert model.error["held_out"][name]["median_abs_ms"] == pytest.approx(0, abs=1e-6)
    assert model.source["trace"] == "synthetic.trace" and model.source["model"] == "synthetic"


def test_calibration_of_noisy_times_reports_the_held_out_error(recorded):
    rng = random.Random(1)
    noisy = [e if type(e) is not StepEnd else
             StepEnd(e.step, e.num_free_blocks, e.schedule_ns, round(e.model_ns * rng.uniform(0.8, 1.2)),
                     e.postprocess_ns, e.gap_ns) for e in recorded]
    err = calibrate(noisy).error["held_out"]["model"]
    assert 0 < err["median_rel"] < 0.2          # 20% noise at most, fitted away on the mean
    assert abs(err["total_rel"]) < 0.05


def test_what_if_under_the_recorded_config_with_the_exact_model_gives_the_recorded_run(recorded):
    result = timed_whatif(recorded, {}, LinearStepTime(TRUTH, gap_ns=30_000))
    assert result.self_check[1:] == recorded[1:]       # every event, the simulated durations too
    assert reexecute(result.self_check).ok
    calibrated = timed_whatif(recorded, {})             # calibrated on the trace itself: the same schedule
    assert [without_wall_clock(e) for e in calibrated.self_check[1:]] == [without_wall_clock(e) for e in recorded[1:]]


def test_what_if_in_time_changes_the_schedule_and_replays(recorded):
    result = timed_whatif(recorded, {"num_kvcache_blocks": 40}, LinearStepTime(TRUTH, gap_ns=30_000))
    assert result.changes == [("num_kvcache_blocks", 96, 40)]
    assert result.new != result.self_check
    assert reexecute(result.new).ok


def test_linear_model_round_trips_through_json(tmp_path, recorded):
    model = calibrate(recorded)
    path = tmp_path / "st.json"
    path.write_text(json.dumps(model.to_dict()))
    loaded = load_step_time(str(path))
    assert loaded.predict(True, 10, 2, 30, 50) == model.predict(True, 10, 2, 30, 50)
    path.write_text('{"kind": "linear", "features": ["const"]}')
    with pytest.raises(TracengineError, match="features"):
        load_step_time(str(path))
    path.write_text("[1")
    with pytest.raises(TracengineError, match="not a step-time model"):
        load_step_time(str(path))


TINY = {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 4, "intermediate_size": 16, "vocab_size": 10, "torch_dtype": "bfloat16"}


def test_roofline_counts_match_hand_arithmetic():
    m = ModelShape.from_hf_config(TINY)
    # a layer: q 8*2*4=64, k and v 8*1*4=32 each, o 2*4*8=64, MLP 3*8*16=384: 576
    assert m.layer_matmul_params == 576
    # one token's K and V: 2 (K, V) * 2 layers * 1 KV head * 4 dims * 2 bytes = 32
    assert m.kv_bytes_per_token == 32
    # 5 tokens, 2 seqs, 7 pairs: 2*2*576*5 = 11520, logits 2*80*2 = 320, attention 4*2*2*4*7 = 448
    assert m.flops(5, 2, 7) == 11520 + 320 + 448
    # weights (2*576 + 80) * 2 bytes = 2464; KV (context 9 read + 5 written) * 32 = 448
    assert m.bytes_moved(5, 9) == 2464 + 448


def test_roofline_step_is_the_larger_bound_plus_overhead():
    m = ModelShape.from_hf_config(TINY)
    roof = RooflineStepTime(m, peak_flops=1e9, bandwidth=1e9, overhead_ns=500)
    # compute 12288 FLOPs / 1e9 = 12288 ns beats memory 2912 bytes / 1e9 = 2912 ns
    assert roof.predict(True, 5, 2, 9, 7) == (500, 12288, 0)
    slow_memory = RooflineStepTime(m, peak_flops=1e12, bandwidth=1e8, overhead_ns=0)
    assert slow_memory.predict(False, 5, 2, 9, 7) == (0, 29120, 0)     # 2912 bytes / 1e8 B/s
    rng = random.Random(0)     # predict's coefficients, worked out once, are flops' and bytes_moved's
    for peak, bandwidth in ((1e9, 1e9), (1e12, 1e8), HARDWARE["H200"]):
        roof = RooflineStepTime(m, peak, bandwidth, 7)
        for _ in range(200):
            tokens, seqs, context, attended = (rng.randrange(1, 10**6) for _ in range(4))
            seconds = max(m.flops(tokens, seqs, attended) / peak, m.bytes_moved(tokens, context) / bandwidth)
            assert roof.predict(True, tokens, seqs, context, attended) == (7, round(seconds * 1e9), 0)
    h200 = RooflineStepTime.for_hardware(m, "H200", bandwidth_tbs=2.0)
    assert h200.peak_flops == HARDWARE["H200"][0] and h200.bandwidth == 2e12
    for name in ("h200", "H200", "h100-pcie"):     # a preset in any case, named as the preset
        roof = RooflineStepTime.for_hardware(m, name)
        assert (roof.peak_flops, roof.bandwidth) == HARDWARE[name.upper().replace("PCIE", "PCIe")]
        assert roof.hardware == name.upper().replace("PCIE", "PCIe")
    with pytest.raises(TracengineError, match="presets: H200, H100, H100-PCIe, A100"):
        RooflineStepTime.for_hardware(m, "TPU")
    with pytest.raises(TracengineError, match="both"):
        RooflineStepTime.for_hardware(m, None, peak_tflops=100)


def test_roofline_config_errors(tmp_path):
    bad = dict(TINY, num_hidden_layers=0)
    with pytest.raises(TracengineError, match="num_hidden_layers"):
        ModelShape.from_hf_config(bad)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    assert ModelShape.from_file(str(tmp_path)).num_layers == 2
    assert ModelShape.from_file(str(tmp_path)).name == tmp_path.name      # a checkpoint: its directory
    (tmp_path / "qwen3-8b.json").write_text(json.dumps(TINY))
    assert ModelShape.from_file(str(tmp_path / "qwen3-8b.json")).name == "qwen3-8b"   # a file of its own




def test_calibrate_command_writes_the_model_and_refuses_to_overwrite(tmp_path, recorded, capsys):
    trace, out = str(tmp_path / "run.trace"), str(tmp_path / "st.json")
    write_trace(trace, recorded)
    assert main(["calibrate", trace, "-o", out]) == 0
    text = capsys.readouterr().out
    assert "held-out steps" in text and "wrote" in text
    assert json.loads((tmp_path / "st.json").read_text())["source"]["trace"] == "run.trace"
    assert main(["calibrate", trace, "-o", out]) == 2
    assert "exists" in capsys.readouterr().err


def test_replay_set_on_a_trace_with_arrivals_runs_in_simulated_time(tmp_path, recorded, capsys):
    trace = str(tmp_path / "run.trace")
    write_trace(trace, recorded)
    assert main(["replay", trace, "--set", "num_kvcache_blocks=40"]) == 0
    text = capsys.readouterr().out
    assert "in simulated time" in text and "TTFT p50 ms" in text and "what-if" in text
    # the self-check of an exactly fitted model is exact
    duration = next(line for line in text.splitlines() if line.startswith("duration ms"))
    assert "+0.0%" in duration
    assert main(["replay", trace, "--set", "num_kvcache_blocks=40", "--arrivals", "steps"]) == 0
    assert "in simulated time" not in capsys.readouterr().out


def test_whatif_table_figures_are_the_stats_of_each_trace(tmp_path, recorded, capsys):
    # each row's figure is stats' own under its name: TPOT is TPOT, ITL is ITL
    import re
    from tracengine.analysis.stats import stats
    from tracengine.trace.tracelog import TraceReader
    trace, whatif = str(tmp_path / "run.trace"), str(tmp_path / "whatif.trace")
    write_trace(trace, recorded)
    assert main(["replay", trace, "--set", "num_kvcache_blocks=40", "--record", whatif]) == 0
    lines = capsys.readouterr().out.splitlines()
    with TraceReader(trace) as reader:
        s_recorded = stats(reader.events())
    with TraceReader(whatif) as reader:
        s_whatif = stats(reader.events())
    names = {"TTFT": "ttft", "ITL": "itl", "TPOT": "tpot", "e2e": "e2e"}
    plain = {"duration ms": (("steps", "total_s"), 1e3), "steps": (("steps", "num_steps"), 1),
             "prefill steps": (("steps", "num_prefill_steps"), 1),
             "preemptions": (("preemption", "num_preemptions"), 1),
             "completion tokens/s": (("throughput", "completion_tokens_per_s"), 1)}
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["recorded", "simulated"]) + 1
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[start:] if re.search(r"\s{2,}\S", line)]
    labels = [r[0] for r in rows]
    assert {"TPOT p50 ms", "ITL p50 ms", "TTFT p99 ms", "e2e p50 steps"} <= set(labels)
    for label, value, _sim, _err, new, _change in rows:
        if label in plain:
            keys, scale = plain[label]
        else:
            name, p, unit = label.split()
            keys, scale = ("latency", names[name], "seconds" if unit == "ms" else "steps", p), (
                1e3 if unit == "ms" else 1)
        for s, cell in ((s_recorded, value), (s_whatif, new)):
            figure = s
            for key in keys:
                figure = figure[key]
            assert float(cell.replace(",", "")) == pytest.approx(figure * scale, abs=0.051), label


def test_time_aware_commands_on_a_torn_trace_say_so(tmp_path, recorded, capsys):
    from helpers import cut_like_a_kill
    trace = str(tmp_path / "torn.trace")
    write_trace(trace, recorded)
    cut_like_a_kill(trace, 5)
    for command in (["replay", trace, "--set", "num_kvcache_blocks=40"],
                    ["replay", trace, "--sweep", "num_kvcache_blocks=40,60", "--jobs", "1"],
                    ["calibrate", trace]):
        assert main(command) == 0
        err = capsys.readouterr().err
        assert f"tracengine: note: {trace}: torn last frame: " in err, command


def test_time_aware_whatif_and_sweep_in_json(tmp_path, recorded, capsys):
    from tracengine.analysis.stats import stats
    from tracengine.sim.sweep import FIGURES, row_of
    from tracengine.trace.tracelog import TraceReader
    trace, whatif = str(tmp_path / "run.trace"), str(tmp_path / "whatif.trace")
    write_trace(trace, recorded)
    assert main(["replay", trace, "--set", "num_kvcache_blocks=40", "--record", whatif, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert list(d) == ["trace", "arrivals", "step_time", "changes", "recorded", "simulated", "what_if",
                       "num_past_output", "record"]
    assert d["arrivals"] == "time" and d["step_time"]["kind"] == "linear" and d["record"] == whatif
    assert d["changes"] == [{"name": "num_kvcache_blocks", "old": 96, "new": 40}]
    for key, path in (("recorded", trace), ("what_if", whatif)):
        with TraceReader(path) as reader:
            assert d[key] == json.loads(json.dumps(to_json_object(stats(reader.events()))))
    assert d["simulated"]["steps"]["num_steps"] == d["recorded"]["steps"]["num_steps"]   # an exact model
    assert main(["replay", trace, "--sweep", "num_kvcache_blocks=40,60", "--jobs", "1", "--json"]) == 0
    sweep = json.loads(capsys.readouterr().out)
    assert sweep["arrivals"] == "time" and [v["set"] for v in sweep["variants"]] == [
        {"num_kvcache_blocks": 40}, {"num_kvcache_blocks": 60}]
    assert list(sweep["variants"][0]["figures"]) == FIGURES
    assert sweep["variants"][0]["figures"] == json.loads(json.dumps(row_of(msgspec.convert(d["what_if"], Stats))))
    assert main(["replay", trace, "--arrivals", "time", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["what_if"] is None


def test_calibration_recovers_the_wake_up_time_apart_from_the_loop_gap():
    truth = LinearStepTime(TRUTH, gap_ns=30_000, wake_ns=250_000)
    events = run_timed(CONFIG, bursty_workload(seed=3), truth)
    model = calibrate(events)
    assert (model.gap_ns, model.wake_ns) == (30_000, 250_000)
    # every step after idle starts the wake-up time after the arrival it admitted first
    again = timed_whatif(events, {}, truth)
    assert again.self_check[1:] == events[1:]
    # a model file saved before wake_ns existed wakes after the loop gap
    d = model.to_dict()
    del d["wake_ns"]
    assert LinearStepTime.from_dict(d).wake_ns == 30_000
    d["wake_ns"] = -1
    with pytest.raises(TracengineError, match="wake_ns"):
        LinearStepTime.from_dict(d)


def test_decode_fit_is_not_pulled_up_by_rare_stalls(recorded):
    # one decode step in a hundred stalls (20 times as long, a shared machine's hiccup): a mean
    # would put every step 19% above the typical one; the fit keeps the typical step
    stalled = []
    for e in recorded:
        if type(e) is StepEnd and e.step % 100 == 7:
            e = StepEnd(e.step, e.num_free_blocks, e.schedule_ns, e.model_ns * 20, e.postprocess_ns, e.gap_ns)
        stalled.append(e)
    model = calibrate(stalled)
    shape = (8, 8, 400, 400)      # a decode of 8 sequences, 400 tokens of context
    typical = LinearStepTime(TRUTH).predict(False, *shape)[1]
    assert model.predict(False, *shape)[1] == pytest.approx(typical, rel=0.02)


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00", None])
def test_a_step_time_file_that_is_binary_or_missing_is_a_one_line_error(tmp_path, content, capsys):
    path = tmp_path / "st.json"
    if content is not None:
        path.write_bytes(content)
    for flags in (["--step-time", str(path)], ["--roofline", str(path), "--hardware", "H200"]):
        workload = tmp_path / "w.jsonl"
        workload.write_text('{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [0]}\n')
        assert main(["simulate", str(workload), *flags, "--set", "num_kvcache_blocks=100"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{path}: not a" in err


def test_a_feature_the_recording_never_varied_gets_no_weight():
    """Every prefill of one sequence: the seqs column is the constant again. The fit gives it
    weight 0 (the constant keeps the cost) instead of splitting one weight between the two,
    which a what-if batching several prompts a step would extrapolate; predictions of the
    recorded shapes are exact all the same."""
    requests = [Request(list(range(i, i + 10 + 7 * i)), 5, ignore_eos=True, arrival_ns=i * 50_000_000)
                for i in range(12)]      # far apart: one prompt a prefill step
    events = run_timed(CONFIG, requests, LinearStepTime(TRUTH, gap_ns=30_000))
    model = calibrate(events)
    seqs = FEATURES.index("seqs")
    for part, weights in TRUTH["prefill"].items():
        fitted = model.coefficients["prefill"][part]
        assert fitted[seqs] == 0, part
        assert fitted[0] == pytest.approx(weights[0] + weights[seqs], rel=1e-6), part   # the constant holds both
        assert fitted[1] == pytest.approx(weights[1], rel=1e-6) and fitted[4] == pytest.approx(weights[4], rel=1e-6)
    assert model.error["held_out"]["total"]["total_rel"] == pytest.approx(0, abs=1e-9)


SHAPE = {"name": "m", "hidden_size": 8, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "head_dim": 4,
         "intermediate_size": 16, "vocab_size": 10, "dtype_bytes": 2}


@pytest.mark.parametrize("change, message", [
    ({"source": "run.trace"}, "source and error are JSON objects"),
    ({"error": [1]}, "source and error are JSON objects"),
    ({"source": {"model": 5}}, "source model is a string"),
    ({"kind": "roofline", "model": {**SHAPE, "hidden_size": "8"}, "peak_flops": 1e12, "bandwidth": 1e12},
     "hidden_size must be a positive integer"),
    ({"kind": "roofline", "model": {**SHAPE, "num_layers": -2}, "peak_flops": 1e12, "bandwidth": 1e12},
     "num_layers must be a positive integer"),
    ({"kind": "roofline", "model": SHAPE, "peak_flops": 1e12, "bandwidth": 1e12, "overhead_ns": float("nan")},
     "overhead is a number of ns"),
    ({"kind": "roofline", "model": SHAPE, "peak_flops": 1e12, "bandwidth": 1e12, "hardware": [1]},
     "hardware is a name"),
    ({"kind": "roofline", "model": {**SHAPE, "dtype": "float32"}, "peak_flops": 1e12, "bandwidth": 1e12},
     "dtype is one of"),
])
def test_a_step_time_file_with_a_field_of_the_wrong_kind_is_refused(tmp_path, recorded, change, message):
    """Refused when read, in one line: not a traceback in the run, nor a trace whose header
    (named from the model's source) cannot be read back."""
    path = tmp_path / "st.json"
    path.write_text(json.dumps({**calibrate(recorded).to_dict(), **change}))
    with pytest.raises(TracengineError, match=message):
        load_step_time(str(path))


def test_roofline_flags_and_configs_of_the_wrong_kind_are_refused():
    m = ModelShape.from_hf_config(TINY)
    for overhead in (float("nan"), float("inf"), -1.0):
        with pytest.raises(TracengineError, match="--overhead-ms"):
            RooflineStepTime.for_hardware(m, "H200", overhead_ms=overhead)
    with pytest.raises(TracengineError, match="at least 1"):     # 1e-300 TFLOP/s: every step infinite
        RooflineStepTime.for_hardware(m, peak_tflops=1e-300, bandwidth_tbs=1.0)
    with pytest.raises(TracengineError, match="unknown dtype"):
        ModelShape.from_hf_config(dict(TINY, torch_dtype=["bfloat16"]))
    # null, as some configs write it, is the default: head_dim hidden / heads, KV heads the heads
    loose = ModelShape.from_hf_config(dict(TINY, head_dim=None, num_key_value_heads=None))
    assert (loose.head_dim, loose.num_kv_heads) == (4, 2)


def recording_with_clients_that_leave():
    """A run in time (the exact model's) in which two clients leave before their requests end."""
    requests = bursty_workload(seed=3, n=30)
    for r, leave_ns in ((requests[2], 4_000_000), (requests[9], 45_000_000)):
        r.max_tokens, r.abort_ns = 40, r.arrival_ns + leave_ns
    return run_timed(CONFIG, requests, LinearStepTime(TRUTH, gap_ns=30_000))


def aborts(events):
    return [(e.step, e.seq_id, e.reason, e.num_completion_tokens) for e in events if type(e) is SeqAbort]


def test_a_client_that_left_the_recording_leaves_the_what_if_when_it_left():
    """A recorded SeqAbort is replayed: the request is taken out of the time-aware self-check and
    what-if when its client left (and of a step-exact what-if before the step it left at), not run
    on past its recorded tokens to its max_tokens."""
    recorded = recording_with_clients_that_leave()
    left = aborts(recorded)
    assert [seq_id for _, seq_id, _, _ in left] == [2, 9] and all(n < 40 for *_, n in left)
    model = LinearStepTime(TRUTH, gap_ns=30_000)
    result = timed_whatif(recorded, {}, model)
    assert result.self_check[1:] == recorded[1:]       # the aborts where they were, every event the same
    assert result.num_past_output == 0
    assert reexecute(result.self_check).ok
    # under a bigger budget each either leaves at the time it left, or has finished by then
    bigger = timed_whatif(recorded, {"max_num_batched_tokens": 256}, model)
    before, after = RequestTimeline(), RequestTimeline()
    for e in recorded:
        before.add(e)
    for e in bigger.new:
        after.add(e)
    for _, seq_id, _, _ in left:
        left_ns = before.start_ns(before.requests[seq_id].abort.step)
        new = after.requests[seq_id]
        if new.abort is not None:
            assert after.start_ns(new.abort.step) == min(
                after.start_ns(rec.step) for rec in after.steps if after.start_ns(rec.step) >= left_ns)
        else:
            assert after.end_ns(new.finish_step) <= left_ns
    assert [seq_id for _, seq_id, _, _ in aborts(bigger.new)] == [2]    # 9 finished before its client left
    assert reexecute(bigger.new).ok
    step_exact = whatif(recorded, {})
    assert aborts(step_exact.events) == left
    assert step_exact.new["requests"] == step_exact.original["requests"]


def test_no_fitted_weight_is_negative_so_a_longer_step_never_costs_less(recorded):
    """Times that fall as a batch grows (noise, in a real recording of short prompts) would fit
    a negative weight, and a simulation of long prompts would extrapolate it to 0 ns steps."""
    falling = {phase: {part: list(w) for part, w in parts.items()} for phase, parts in TRUTH.items()}
    falling["prefill"]["model_ns"][4] = -20          # attended pairs make a prefill shorter
    falling["decode"]["model_ns"][3] = -100          # and context a decode
    events = run_timed(CONFIG, bursty_workload(), LinearStepTime(falling, gap_ns=30_000))
    model = calibrate(events)
    for phase in ("prefill", "decode"):
        for part, weights in model.coefficients[phase].items():
            assert all(w >= 0 for w in weights), (phase, part, weights)
    short, long = model.predict(True, 100, 1, 100, 5050), model.predict(True, 3000, 1, 3000, 4501500)
    assert sum(long) >= sum(short) > 0
    assert sum(model.predict(False, 8, 8, 24_000, 24_000)) >= sum(model.predict(False, 8, 8, 800, 800)) > 0
    # weights the recording supports (all of them non-negative) are recovered as before
    exact = calibrate(recorded)
    assert exact.coefficients["prefill"]["model_ns"] == pytest.approx(TRUTH["prefill"]["model_ns"], rel=1e-6,
                                                                         abs=1e-3)


def test_features_the_recording_never_varied_are_named_where_the_model_is_used(tmp_path, recorded, capsys):
    """Every request at once: one prefill step, whose time the model can only give as a constant,
    so a what-if's prefills of other sizes are all timed as that one; the self-check, of the same
    one prefill, cannot show it. calibrate, the what-if and simulate say so."""
    from tracengine.sim.steptime import unvaried_note
    at_once = [Request([i + 1] * 10, 12, ignore_eos=True, arrival_ns=0) for i in range(3)]
    events = run_timed(CONFIG, at_once, LinearStepTime(TRUTH, gap_ns=30_000))
    model = calibrate(events)
    assert model.source["num_steps_by_phase"]["prefill"] == 1
    assert model.source["unvaried"]["prefill"] == ["tokens", "seqs", "attended"]
    note = unvaried_note(model)
    assert note.startswith("note: the calibration recording never varied the prefill steps' tokens, seqs, "
                           "attended (1 step)")
    assert unvaried_note(calibrate(recorded)) is None            # every feature varied
    trace, saved = str(tmp_path / "once.trace"), str(tmp_path / "st.json")
    write_trace(trace, events)
    assert main(["calibrate", trace, "-o", saved]) == 0
    assert note in capsys.readouterr().out
    assert unvaried_note(load_step_time(saved)) == note          # kept in the saved model
    assert main(["replay", trace, "--set", "max_num_seqs=1"]) == 0
    assert note in capsys.readouterr().out
    assert main(["simulate", "--num-prompts", "3", "--step-time", saved, "--set", "num_kvcache_blocks=100",
                 "--quiet"]) == 0
    assert note in capsys.readouterr().out


def test_roofline_counts_only_the_experts_a_moe_step_uses():
    # 4 layers, 3 of them sparse: 8 experts of 4 features, top 2; layer 1 (in mlp_only_layers) dense
    moe = ModelShape.from_hf_config(dict(TINY, num_hidden_layers=4, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=4, mlp_only_layers=[1], decoder_sparse_step=1))
    assert (moe.num_experts, moe.num_experts_per_tok, moe.num_sparse_layers) == (8, 2, 3)
    # attention 192 (576 - 384 of the dense MLP); a sparse layer: router 8*8 = 64, an expert 3*8*4 = 96
    assert (moe.attention_params, moe.sparse_layer_shared_params, moe.expert_params) == (192, 256, 96)
    # a token: one dense layer 576, three sparse 256 + 2 experts * 96 = 448 each: 576 + 1344 = 1920
    assert moe.active_params_per_token == 1920
    assert moe.flops(5, 2, 7) == 2 * 1920 * 5 + 320 + 4 * 4 * 2 * 4 * 7
    # every step reads (576 + 3 * 256 + 80) * 2 bytes = 2848; each expert hit, 3 layers * 96 * 2 = 576 more
    assert (moe.weight_bytes, moe.expert_bytes) == (2848, 576)
    assert moe.experts_hit(1) == pytest.approx(2)                       # one token: its top 2
    assert moe.experts_hit(1000) == pytest.approx(8)                    # a long prefill: all 8
    assert moe.experts_hit(3) == pytest.approx(8 * (1 - 0.75 ** 3))     # each expert missed with 6/8 per token
    # one decode token: weights, 2 experts, KV of 9 context + 1 new (2 * 4 layers * 4 dims * 2 bytes = 64 a token)
    assert moe.bytes_moved(1, 9) == pytest.approx(2848 + 576 * 2 + 64 * 10)
    roof = RooflineStepTime(moe, peak_flops=1e15, bandwidth=1e9, overhead_ns=0)
    assert roof.predict(False, 1, 1, 9, 10) == (0, round(moe.bytes_moved(1, 9)), 0)   # memory-bound, 1 B/ns
    loaded = RooflineStepTime.from_dict(json.loads(json.dumps(roof.to_dict())))
    assert loaded.model == moe and loaded.predict(True, 40, 3, 90, 500) == roof.predict(True, 40, 3, 90, 500)
    # transformers saves Qwen3-MoE's expert count as num_local_experts
    saved = dict(TINY, num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=4, mlp_only_layers=[])
    assert ModelShape.from_hf_config(saved).num_sparse_layers == 2
    with pytest.raises(TracengineError, match="num_experts_per_tok 9 is more than num_experts 8"):
        ModelShape.from_hf_config(dict(saved, num_experts_per_tok=9))
    bad = roof.to_dict()
    bad["model"]["num_sparse_layers"] = 0
    with pytest.raises(TracengineError, match="all 0 \\(a dense model\\) or a MoE's"):
        RooflineStepTime.from_dict(bad)


def test_roofline_of_qwen3_30b_a3b_counts_its_published_sizes():
    # Qwen3-30B-A3B's config.json shape; its model card: 30.5B parameters, 3.3B activated
    config = dict(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                  intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                  vocab_size=151936, decoder_sparse_step=1, mlp_only_layers=[], torch_dtype="bfloat16")
    m = ModelShape.from_hf_config(config, "Qwen3-30B-A3B")
    embedding = m.vocab_size * m.hidden_size      # untied: looked up, not multiplied, but counted in the card's sizes
    total = m.weight_bytes // 2 + m.expert_bytes // 2 * m.num_experts + embedding
    active = m.active_params_per_token + m.lm_head_params + embedding
    assert round(total / 1e9, 1) == 30.5 and round(active / 1e9, 1) == 3.4   # 3.35: the card rounds down, norms aside
