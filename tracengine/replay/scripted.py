"""Runners without a model, for replay, what-if and tests. They answer
`run(seqs, is_prefill)` like the model runner, from a script instead of
logits. Also canned and random workloads that drive `LLMEngine` with them."""
import random
from dataclasses import dataclass

import xxhash

from tracengine.config import Config
from tracengine.errors import TracengineError
from tracengine.events import ListSink
from tracengine.llm_engine import LLMEngine
from tracengine.sampling_params import SamplingParams
from tracengine.tracelog import make_header


class SyntheticRunner:
    """A stand-in model: each token is a hash of (seed, seq_id, position), so
    like the real model it does not depend on batching, chunking or preemption.
    `eos_at` maps a seq_id to the completion index at which it emits `eos`."""

    def __init__(self, vocab_size: int = 1000, seed: int = 0, eos: int = -1, eos_at: dict[int, int] | None = None):
        self.vocab_size = vocab_size
        self.seed = seed
        self.eos = eos
        self.eos_at = eos_at or {}

    def token_for(self, seq) -> int:
        position = seq.num_cached_tokens + seq.num_scheduled_tokens
        if position == seq.num_tokens and self.eos_at.get(seq.seq_id) == seq.num_completion_tokens:
            return self.eos
        h = xxhash.xxh64_intdigest(f"{self.seed}:{seq.seq_id}:{position}".encode())
        token = h % self.vocab_size
        return token if token != self.eos else (token + 1) % self.vocab_size

    def run(self, seqs, is_prefill: bool) -> list[int]:
        return [self.token_for(seq) for seq in seqs]

    def exit(self):
        pass


class RecordedRunner:
    """Re-execution: the tokens a trace recorded for the current step, by seq_id.
    `tokens` is replaced before each step; a sequence the trace did not sample
    this step (the replay has already diverged) gets `filler`."""

    def __init__(self, filler: int = 0):
        self.tokens: dict[int, int] = {}
        self.filler = filler

    def run(self, seqs, is_prefill: bool) -> list[int]:
        tokens, filler = self.tokens, self.filler
        return [tokens.get(seq.seq_id, filler) for seq in seqs]

    def exit(self):
        pass


class OutputRunner:
    """What-if: each sequence gets its recorded completion token by completion
    index, wherever the new schedule puts it. A middle chunk gets the sample
    recorded at the same position if there is one, else `filler` (either way
    the sample is dropped); a sequence that runs past its recorded output gets
    `filler` and is noted in `past_output_seq_ids`."""

    def __init__(self, outputs: dict[int, list[int]], middle: dict[tuple[int, int], int] | None = None,
                 filler: int = 0):
        self.outputs = outputs
        self.middle = middle or {}
        self.filler = filler
        self.past_output_seq_ids: set[int] = set()

    def run(self, seqs, is_prefill: bool) -> list[int]:
        tokens = []
        for seq in seqs:
            position = seq.num_cached_tokens + seq.num_scheduled_tokens
            if position < seq.num_tokens:          # a middle chunk
                tokens.append(self.middle.get((seq.seq_id, position), self.filler))
                continue
            output = self.outputs.get(seq.seq_id, ())
            index = seq.num_completion_tokens
            if index < len(output):
                tokens.append(output[index])
            else:
                self.past_output_seq_ids.add(seq.seq_id)
                tokens.append(self.filler)
        return tokens

    def exit(self):
        pass


@dataclass(slots=True)
class WorkloadRequest:
    """One request of a scripted workload, added before step `arrival_step`."""
    prompt_token_ids: list[int]
    max_tokens: int = 8
    arrival_step: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    seq_id: int | None = None     # None: its index in the workload


def run_workload(config: Config, requests: list[WorkloadRequest], runner=None, sink: ListSink | None = None,
                 max_steps: int = 1_000_000, on_step=None) -> list:
    """Drive `LLMEngine` over a scripted workload; returns the events, header
    first. Each request enters before its arrival step; when the engine goes
    idle before the next arrival, that arrival is brought forward. `on_step(engine)`
    is called after every step (property tests check invariants there)."""
    sink = sink if sink is not None else ListSink()
    runner = runner if runner is not None else SyntheticRunner(eos=config.eos, seed=config.seed)
    engine = LLMEngine(config, runner, sink)
    pending = sorted(range(len(requests)), key=lambda i: requests[i].arrival_step)
    next_request = 0
    while next_request < len(pending) or not engine.is_finished():
        now = engine.num_steps
        if engine.is_finished():      # idle: the next arrivals come now
            now = max(now, requests[pending[next_request]].arrival_step)
        while next_request < len(pending) and requests[pending[next_request]].arrival_step <= now:
            i = pending[next_request]
            r = requests[i]
            engine.add_request(r.prompt_token_ids, SamplingParams(r.temperature, r.max_tokens, r.ignore_eos),
                               seq_id=i if r.seq_id is None else r.seq_id)
            next_request += 1
        engine.step()
        if on_step is not None:
            on_step(engine)
        if engine.num_steps >= max_steps:
            raise TracengineError(f"the workload did not finish in {max_steps} steps")
    return [make_header(config), *sink.events]


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
                    "shared_prefix", "max_tokens_one", "eos_vs_length")
