"""Fixtures for tests: canned and random workloads that each show a scheduling
behaviour, and the run that emits every event type. Not used by any command."""
import random

from tracengine.engine.config import Config
from tracengine.engine.llm_engine import LLMEngine
from tracengine.engine.sampling_params import SamplingParams
from tracengine.replay.runners import SyntheticRunner, WorkloadRequest


def random_workload(rng: random.Random, num_requests: int = 8, max_prompt_len: int = 40,
                    max_output_len: int = 12, max_arrival_step: int = 10, block_size: int = 4,
                    vocab_size: int = 1000) -> list[WorkloadRequest]:
    """Requests of random lengths and arrivals; about half share a prefix of whole
    blocks with another prompt, so the prefix cache is exercised."""
    prefixes = [[rng.randrange(vocab_size) for _ in range(block_size * rng.randint(1, 3))] for _ in range(2)]
    requests = []
    for _ in range(num_requests):
        n = rng.randint(1, max_prompt_len)
        prefix = rng.choice(prefixes)[:n] if rng.random() < 0.5 else []
        prompt = prefix + [rng.randrange(vocab_size) for _ in range(n - len(prefix))]
        requests.append(WorkloadRequest(prompt, rng.randint(1, max_output_len), rng.randint(0, max_arrival_step),
                                        ignore_eos=rng.random() < 0.3))
    return requests


def _tokens(seq: int, n: int) -> list[int]:
    """n distinct token ids for request `seq`, so only deliberate prefixes are shared."""
    return list(range(1000 + 100 * seq, 1000 + 100 * seq + n))


def canned_workload(name: str) -> tuple[Config, list[WorkloadRequest], SyntheticRunner]:
    """Small workloads that each show one scheduling behaviour (block size 4,
    eos 999): the snapshot tests pin their step tables."""
    R, eos = WorkloadRequest, 999

    def config(**changes):
        values = dict(num_kvcache_blocks=64, kvcache_block_size=4, max_num_batched_tokens=64, max_num_seqs=16,
                      max_model_len=1024, eos=eos)
        return Config(**{**values, **changes})

    shared = _tokens(9, 8)                        # two blocks of a common prefix
    workloads = {
        # the seeds' worked example: budget 20, prompts 25, 8, 6
        "worked_example": (config(max_num_batched_tokens=20),
                           [R(_tokens(0, 25), 3, ignore_eos=True), R(_tokens(1, 8), 3, ignore_eos=True),
                            R(_tokens(2, 6), 3, ignore_eos=True)], {}),
        # s1 needs 6 free blocks while s0 holds 5 of 10: s2 would fit but waits behind s1
        "head_of_line": (config(num_kvcache_blocks=10),
                         [R(_tokens(0, 20), 8, 0, True), R(_tokens(1, 24), 4, 1, True), R(_tokens(2, 4), 2, 1, True)],
                         {}),
        # 4 prompts of 2 blocks in 9 blocks: every sequence needs a third block at once
        "preemption_tail": (config(num_kvcache_blocks=9), [R(_tokens(i, 8), 6, ignore_eos=True) for i in range(4)], {}),
        # s1 needs a block, nobody is left behind it in running: it preempts itself
        "self_preemption": (config(num_kvcache_blocks=4),
                            [R(_tokens(0, 6), 4, ignore_eos=True), R(_tokens(1, 8), 4, ignore_eos=True)], {}),
        # the long tail s2 is preempted; its prefix blocks stay cached and its recompute hits them
        "recompute_prefix_hit": (config(num_kvcache_blocks=8),
                                 [R(_tokens(0, 8), 3, ignore_eos=True), R(_tokens(1, 4), 3, ignore_eos=True),
                                  R(_tokens(2, 20), 3, ignore_eos=True)], {}),
        # s1 shares s0's two prefix blocks while s0 runs; s2 finds them again after both finished
        "shared_prefix": (config(), [R(shared + _tokens(0, 4), 3, 0, True), R(shared + _tokens(1, 6), 3, 2, True),
                                     R(shared + _tokens(2, 1), 2, 12, True)], {}),
        "max_tokens_one": (config(), [R(_tokens(0, 5), 1, ignore_eos=True), R(_tokens(1, 9), 1, ignore_eos=True),
                                      R(_tokens(2, 3), 2, ignore_eos=True)], {}),
        # s0 samples eos at completion 2, s1 at once; s2 ignores its eos; s3 runs to max_tokens
        "eos_vs_length": (config(), [R(_tokens(0, 5), 6), R(_tokens(1, 6), 6), R(_tokens(2, 4), 3, ignore_eos=True),
                                     R(_tokens(3, 4), 3)], {0: 2, 1: 0, 2: 1}),
        # a long prompt arrives while two sequences decode: prefill_first stalls them for its three
        # chunks, mixed decodes them beside each chunk
        "long_prompt_during_decode": (config(max_num_batched_tokens=16),
                                      [R(_tokens(0, 6), 8, 0, True), R(_tokens(1, 4), 8, 0, True),
                                       R(_tokens(2, 40), 2, 2, True)], {}),
    }
    cfg, requests, eos_at = workloads[name]
    return cfg, requests, SyntheticRunner(eos=eos, eos_at=eos_at)


def every_event_type_config() -> Config:
    # 10 blocks of 4 tokens and a budget of 16: chunked prefill, a prefix hit and a preemption
    return Config(num_kvcache_blocks=10, kvcache_block_size=4, max_num_batched_tokens=16, max_num_seqs=4,
                  max_model_len=64, eos=999)


def every_event_type(sink) -> LLMEngine:
    """A run that emits every event type: seq 0 (20 tokens) is chunked 16 + 4, seq 1 hits
    its 8-token prefix, seq 2 preempts itself, seq 3 stops on EOS, the others on length.
    `traces/format-v1.trace` pins it, so it never changes."""
    config = every_event_type_config()
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos, eos_at={3: 2}), sink)
    prefix = list(range(500, 508))
    engine.add_request(prefix + list(range(20, 32)), SamplingParams(max_tokens=8))
    engine.step()
    engine.step()
    engine.add_request(prefix + list(range(40, 45)), SamplingParams(max_tokens=8))
    engine.add_request(list(range(60, 66)), SamplingParams(max_tokens=10))
    engine.add_request(list(range(70, 75)), SamplingParams(max_tokens=6))
    while not engine.is_finished():
        engine.step()
    return engine


CANNED_WORKLOADS = ("worked_example", "head_of_line", "preemption_tail", "self_preemption", "recompute_prefix_hit",
                    "shared_prefix", "max_tokens_one", "eos_vs_length", "long_prompt_during_decode")
