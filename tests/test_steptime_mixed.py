"""A linear step-time model's optional `mixed` row: a prefill step that also decodes is priced
by it, so fixed step times can be given as NVIDIA Dynamo's mocker gives them (its `fixed`
timing charges such a step its prefill time plus its decode time). The latencies asserted
below are the ones Dynamo 1.6.1's offline replay gives for the same requests at 100 ms / 10 ms
(benchmarks/bench_vs_dynamo_requests.py compares whole workloads request by request)."""
import json

import pytest

from tracengine.analysis.stats import stats
from tracengine.engine.config import Config
from tracengine.engine.request import Request
from tracengine.errors import TracengineError
from tracengine.sim.engine import run_timed
from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime, load_step_time

MS = 1_000_000
CONFIG = Config(num_kvcache_blocks=1000, kvcache_block_size=16, max_num_batched_tokens=256, max_num_seqs=16,
                max_model_len=4096, eos=999, scheduling_policy="mixed")


def constant(ms: float) -> dict:
    return {part: [ms * MS if part == "model_ns" and f == "const" else 0.0 for f in FEATURES] for part in PARTS}


def fixed(mixed_ms: float | None) -> LinearStepTime:
    coefficients = {"prefill": constant(100), "decode": constant(10)}
    if mixed_ms is not None:
        coefficients["mixed"] = constant(mixed_ms)
    return LinearStepTime(coefficients)


def test_the_mixed_row_prices_a_prefill_step_that_also_decodes_and_defaults_to_the_prefill_row():
    model = fixed(110)
    assert model.predict(True, 300, 3, 300, 900, mixed=True) == (0, 110 * MS, 0)
    assert model.predict(True, 300, 3, 300, 900) == (0, 100 * MS, 0)
    assert model.predict(False, 3, 3, 300, 300) == (0, 10 * MS, 0)
    assert fixed(None).predict(True, 300, 3, 300, 900, mixed=True) == (0, 100 * MS, 0)


def test_the_mixed_row_round_trips_through_json_and_a_bad_one_is_refused(tmp_path):
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps(fixed(110).to_dict()))
    assert load_step_time(str(path)).predict(True, 5, 2, 9, 7, mixed=True) == (0, 110 * MS, 0)
    d = fixed(110).to_dict()
    d["coefficients"]["mixed"]["model_ns"] = [1.0, 2.0]
    path.write_text(json.dumps(d))
    with pytest.raises(TracengineError, match="finite coefficients"):
        load_step_time(str(path))


def latencies_ms(requests, step_time) -> list[tuple[float, float]]:
    """(TTFT, e2e) in ms per request, in seq_id order."""
    per_request = stats(run_timed(CONFIG, requests, step_time))["per_request"]
    return [(round(r["ttft_s"] * 1e3, 6), round(r["e2e_s"] * 1e3, 6)) for r in per_request]


@pytest.mark.parametrize("mixed_ms, expected", [
    (110, [(100, 390), (160, 200)]),      # Dynamo's: the step that prefills B also decodes A
    (None, [(100, 380), (150, 190)]),     # priced as a prefill step
])
def test_a_prompt_arriving_while_another_decodes_is_timed_as_dynamo_times_it(mixed_ms, expected):
    requests = [Request(list(range(32)), 20, arrival_ns=0, ignore_eos=True),
                Request(list(range(100, 132)), 5, arrival_ns=50 * MS, ignore_eos=True)]
    assert latencies_ms(requests, fixed(mixed_ms)) == expected


def test_a_chunked_prompt_beside_a_decode_pays_the_decode_in_every_chunk():
    """B's 400 tokens take two steps after A's decode takes one token of each budget: both mixed
    (110 ms), so B's first token comes at 320 ms (Dynamo: the same, at any budget it fills)."""
    requests = [Request(list(range(32)), 20, arrival_ns=0, ignore_eos=True),
                Request(list(range(100, 500)), 5, arrival_ns=50 * MS, ignore_eos=True)]
    assert latencies_ms(requests, fixed(110)) == [(100, 490), (270, 310)]


def test_a_last_chunk_of_one_prompt_token_is_prefill_not_decode():
    """A prompt one token longer than the budget: two prefill steps of 100 ms (Dynamo: 200 ms)."""
    requests = [Request(list(range(257)), 5, arrival_ns=0, ignore_eos=True)]
    assert latencies_ms(requests, fixed(110)) == [(200, 240)]


def test_a_recomputation_after_a_preemption_pays_its_prefill_and_a_decode():
    """B (16 tokens) is preempted for A's blocks when its second token needs a block; A done at
    140 ms, B's recomputation (its prompt and its token) samples its second token at 250 ms: the
    step costs 110 ms, as in Dynamo (it prices a token sampled after an earlier one as a decode)."""
    config = Config(num_kvcache_blocks=100, kvcache_block_size=16, max_num_batched_tokens=16384, max_num_seqs=16,
                    max_model_len=4096, eos=-1, scheduling_policy="mixed")
    requests = [Request(list(range(1000, 2583)), 5, arrival_ns=0, ignore_eos=True),
                Request(list(range(16)), 2, arrival_ns=0, ignore_eos=True)]
    s = stats(run_timed(config, requests, fixed(110)))
    assert s["preemption"]["num_preemptions"] == 1
    assert [(round(r["ttft_s"] * 1e3, 6), round(r["e2e_s"] * 1e3, 6)) for r in s["per_request"]] == [(100, 140),
                                                                                                        (100, 250)]
