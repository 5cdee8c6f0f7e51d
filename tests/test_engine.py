"""The engine on the embedded model: the same tokens however a request is scheduled."""
import pytest

from tracengine import LLM, SamplingParams
from tracengine.errors import ConfigError, RequestError
from helpers import batched_and_alone

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = [
    "The scheduler decides which sequences run at every step of the engine.",
    "A prefix cache shares blocks between prompts that start the same way, so",
    "Preemption frees the KV cache of the newest sequence and sends it back",
    "Chunked prefill",
]


@pytest.fixture(scope="module")
def reference():
    """Each prompt alone, with a roomy cache and budget."""
    llm = LLM("", num_kvcache_blocks=256, kvcache_block_size=16, max_num_batched_tokens=4096)
    outputs = [llm.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in PROMPTS]
    llm.close()
    return outputs


def run(prompts, sampling_params=GREEDY, **config):
    llm = LLM("", **config)
    try:
        return [o["token_ids"] for o in llm.generate(prompts, sampling_params, use_tqdm=False, summary=True)], llm
    finally:
        llm.close()


def test_batched_equals_alone(reference):
    outputs, _ = run(PROMPTS, num_kvcache_blocks=256, kvcache_block_size=16)
    assert outputs == reference


def test_chunked_prefill_gives_the_same_tokens(reference):
    outputs, llm = run(PROMPTS, num_kvcache_blocks=256, kvcache_block_size=4, max_num_batched_tokens=7)
    assert outputs == reference
    assert llm.last_run["steps"]["num_prefill_steps"] > len(PROMPTS)   # prompts were split


def test_prefix_cache_hit_gives_the_same_tokens(reference):
    llm = LLM("", num_kvcache_blocks=256, kvcache_block_size=4)
    try:
        first = llm.generate([PROMPTS[1]], GREEDY, use_tqdm=False)[0]["token_ids"]
        again = llm.generate([PROMPTS[1]], GREEDY, use_tqdm=False)[0]["token_ids"]
        assert llm.scheduler.block_manager.num_hit_blocks > 0
    finally:
        llm.close()
    assert first == again == reference[1]


def test_preemption_gives_the_same_tokens(reference):
    # 20 blocks of 4 tokens: too few for all four to decode together
    outputs, llm = run(PROMPTS, num_kvcache_blocks=20, kvcache_block_size=4)
    assert llm.last_run["preemption"]["num_preemptions"] > 0
    assert outputs == reference


def test_many_requests_of_mixed_lengths_give_their_tokens_alone():
    """24 token prompts of 3-150 tokens, each with its own max_tokens: on the
    CPU this takes prefill in length groups, decode copies attended by row
    range, finished sequences' rows left dead, refills and chunked prefill."""
    prompts = [[1 + (31 * i + 7 * j) % 1000 for j in range(3 + (47 * i) % 148)] for i in range(24)]
    params = [SamplingParams(temperature=0.0, max_tokens=4 + (5 * i) % 21, ignore_eos=True) for i in range(24)]
    config = dict(num_kvcache_blocks=512, kvcache_block_size=16, max_num_batched_tokens=1024, max_num_seqs=32)
    llm = LLM("", **config)
    try:
        batched, alone = batched_and_alone(llm, prompts, params)
        assert llm.last_run["steps"]["num_prefill_steps"] > 1   # the budget split the prompts
    finally:
        llm.close()
    assert batched == alone


def test_seeded_sampling_is_reproducible_and_batch_independent():
    sp = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    batched, _ = run(PROMPTS[:2], num_kvcache_blocks=128, seed=3, sampling_params=sp)
    alone, _ = run(PROMPTS[:1], num_kvcache_blocks=128, seed=3, sampling_params=sp)
    other_seed, _ = run(PROMPTS[:1], num_kvcache_blocks=128, seed=4, sampling_params=sp)
    assert batched[0] == alone[0]
    assert other_seed[0] != alone[0]


def test_unknown_argument_and_bad_config_are_one_line_errors():
    with pytest.raises(ConfigError, match="unknown engine argument 'num_blocks'"):
        LLM("", num_blocks=4)
    with pytest.raises(ConfigError, match=r"num_kvcache_blocks must be a positive integer or -1 \(as many as fit\), got 0"):
        LLM("", num_kvcache_blocks=0)


def test_prompt_longer_than_max_model_len_is_refused():
    llm = LLM("", max_model_len=32, num_kvcache_blocks=16)
    try:
        with pytest.raises(RequestError, match="longer than max_model_len=32"):
            llm.generate([list(range(40))], GREEDY, use_tqdm=False)
    finally:
        llm.close()


def test_the_summary_is_the_stats_of_the_run(tmp_path):
    # one set of run figures: generate's summary is `tracengine stats` of the trace the run recorded
    from tracengine import stats
    path = str(tmp_path / "run.trace")
    llm = LLM("", num_kvcache_blocks=20, kvcache_block_size=4)
    try:
        llm.generate(PROMPTS, GREEDY, use_tqdm=False, record=path, summary=True)
        recorded = llm.last_run                        # read back from the trace
        llm.reset()
        llm.generate(PROMPTS, GREEDY, use_tqdm=False, summary=True)
        folded = llm.last_run                          # no trace: folded as the events came
        llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
        assert llm.last_run is None and llm.sink.enabled is False   # not asked for: no events built
    finally:
        llm.close()
    assert recorded == stats(path)
    for part in ("requests", "tokens", "preemption", "prefix_cache", "kv_blocks", "head_of_line"):
        assert folded[part] == recorded[part], part
    assert [r["ttft_steps"] for r in folded["per_request"]] == [r["ttft_steps"] for r in recorded["per_request"]]
    assert recorded["preemption"]["num_preemptions"] > 0
    assert recorded["tokens"]["num_completion_tokens"] == len(PROMPTS) * GREEDY.max_tokens


def test_a_second_summary_on_the_same_engine_counts_its_own_run():
    # the engine's steps and clock go on from the first run; the second summary is of its own run
    llm = LLM("", num_kvcache_blocks=20, kvcache_block_size=4)
    try:
        llm.generate(PROMPTS, GREEDY, use_tqdm=False, summary=True)
        first = llm.last_run
        llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False, summary=True)
        second = llm.last_run
    finally:
        llm.close()
    assert first["requests"]["num_requests"] == len(PROMPTS)
    assert second["requests"]["num_requests"] == 2 and second["requests"]["num_finished"] == 2
    assert second["tokens"]["num_completion_tokens"] == 2 * GREEDY.max_tokens
    assert all(r["ttft_s"] is not None and r["ttft_s"] >= 0 and r["queueing_s"] >= 0 for r in second["per_request"])
