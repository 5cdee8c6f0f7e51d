"""Scripted workloads for snapshot tests: requests made by hand (`make_request`), run through the
scheduler with made-up tokens (`run_requests`), and the canned and random workloads and the
every-event-type runs that tracengine's own tests pin."""
import dataclasses
import itertools
import random


from tracengine.engine.config import Config
from tracengine.engine.llm_engine import LLMEngine
from tracengine.engine.sampling_params import SamplingParams
from tracengine.errors import TracengineError
from tracengine.engine.request import NO_TIME, Request
from tracengine.sim.runners import SyntheticRunner, run_workload

_FRESH_TOKEN_IDS = itertools.count(1 << 30)   # far above any vocabulary a test writes ids from


def make_request(prompt: int | list[int], max_tokens: int = 8, *, arrival_step: int = 0,
                 arrival_ns: int = NO_TIME, ignore_eos: bool = False, temperature: float = 1.0,
                 seq_id: int | None = None) -> Request:
    """One request of a scripted workload. `prompt`: token ids, or a length (that
    many ids no other request shares, so only prompts given as ids share a
    prefix). It enters before step `arrival_step`, or, with `arrival_ns` (ns from the
    start), when the simulated clock reaches it."""
    ids = list(prompt) if not isinstance(prompt, int) else [next(_FRESH_TOKEN_IDS) for _ in range(prompt)]
    return Request(ids, max_tokens, arrival_step=arrival_step, ignore_eos=ignore_eos, temperature=temperature, seq_id=seq_id, arrival_ns=arrival_ns)


def constant_step_time(step_ns: int = 1_000_000):
    """A step-time model in which every step lasts `step_ns` (for workloads with arrival times)."""
    from tracengine.sim.steptime import PARTS, PHASES, LinearStepTime
    row = {part: [step_ns if part == "model_ns" else 0, 0, 0, 0, 0] for part in PARTS}
    return LinearStepTime({phase: dict(row) for phase in PHASES}, source={"model": "constant"})


def run_requests(config: Config, requests: list[Request], runner=None, step_time=None,
                 policy: type | str | None = None) -> list:
    """The requests through the real scheduler with the synthetic runner (or
    `runner`); the events, TraceHeader first. With arrival times (any request
    made with `arrival_ns`) the clock is simulated by `step_time`, by
    default every step lasting 1 ms; otherwise requests enter at their steps.
    `policy`: a Scheduler subclass, or None for the one `config.scheduling_policy` names."""
    runner = runner if runner is not None else SyntheticRunner(eos=config.eos, seed=config.seed)
    if any(r.arrival_ns >= 0 for r in requests):
        from tracengine.engine.policies import BUILTIN_POLICIES, policy_path, scheduler_class
        from tracengine.sim.engine import run_timed     # it refuses a request that can never run
        if policy is not None:
            name = policy_path(scheduler_class(config, policy))
            if name not in BUILTIN_POLICIES:
                raise TracengineError(f"a workload with arrival times runs built-in policies only, not {name}; "
                                      "give arrival steps")
            config = config.replace(scheduling_policy=name)
        timed = [r if r.arrival_ns >= 0 else dataclasses.replace(r, arrival_ns=0) for r in requests]
        return run_timed(config, timed, step_time if step_time is not None else constant_step_time(), runner)
    return run_workload(config, requests, runner, policy=policy)


def random_workload(rng: random.Random, num_requests: int = 8, max_prompt_len: int = 40,
                    max_output_len: int = 12, max_arrival_step: int = 10, block_size: int = 4,
                    vocab_size: int = 1000) -> list[Request]:
    """Requests of random lengths and arrivals; about half share a prefix of whole
    blocks with another prompt, so the prefix cache is exercised."""
    prefixes = [[rng.randrange(vocab_size) for _ in range(block_size * rng.randint(1, 3))] for _ in range(2)]
    requests = []
    for _ in range(num_requests):
        n = rng.randint(1, max_prompt_len)
        prefix = rng.choice(prefixes)[:n] if rng.random() < 0.5 else []
        prompt = prefix + [rng.randrange(vocab_size) for _ in range(n - len(prefix))]
        requests.append(Request(prompt, rng.randint(1, max_output_len), arrival_step=rng.randint(0, max_arrival_step), ignore_eos=rng.random() < 0.3))
    return requests


def _tokens(seq: int, n: int) -> list[int]:
    """n distinct token ids for request `seq`, so only deliberate prefixes are shared."""
    return list(range(1000 + 100 * seq, 1000 + 100 * seq + n))


def canned_workload(name: str) -> tuple[Config, list[Request], SyntheticRunner]:
    """Small workloads that each show one scheduling behaviour (block size 4,
    eos 999): the snapshot tests pin their step tables."""
    R, eos = Request, 999

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
                         [R(_tokens(0, 20), 8, arrival_step=0, ignore_eos=True), R(_tokens(1, 24), 4, arrival_step=1, ignore_eos=True), R(_tokens(2, 4), 2, arrival_step=1, ignore_eos=True)],
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
        "shared_prefix": (config(), [R(shared + _tokens(0, 4), 3, arrival_step=0, ignore_eos=True), R(shared + _tokens(1, 6), 3, arrival_step=2, ignore_eos=True),
                                     R(shared + _tokens(2, 1), 2, arrival_step=12, ignore_eos=True)], {}),
        "max_tokens_one": (config(), [R(_tokens(0, 5), 1, ignore_eos=True), R(_tokens(1, 9), 1, ignore_eos=True),
                                      R(_tokens(2, 3), 2, ignore_eos=True)], {}),
        # s0 samples eos at completion 2, s1 at once; s2 ignores its eos; s3 runs to max_tokens
        "eos_vs_length": (config(), [R(_tokens(0, 5), 6), R(_tokens(1, 6), 6), R(_tokens(2, 4), 3, ignore_eos=True),
                                     R(_tokens(3, 4), 3)], {0: 2, 1: 0, 2: 1}),
        # a long prompt arrives while two sequences decode: prefill_first stalls them for its three
        # chunks, mixed decodes them beside each chunk
        "long_prompt_during_decode": (config(max_num_batched_tokens=16),
                                      [R(_tokens(0, 6), 8, arrival_step=0, ignore_eos=True), R(_tokens(1, 4), 8, arrival_step=0, ignore_eos=True),
                                       R(_tokens(2, 40), 2, arrival_step=2, ignore_eos=True)], {}),
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


def aborts_between_steps(writer) -> LLMEngine:
    """A server's run in engine terms, with each abort flushed as a server's engine loop does
    (format 8's between-steps frames): seq 1 is aborted while seq 0 runs (its frame comes
    before step 2's), seq 0 finishes, then seq 2 arrives, runs two steps and is aborted with
    nothing left to run (its frame is the last before the end frame). `writer`: a TraceWriter.
    `traces/format-v8.trace` pins it."""
    config = every_event_type_config()
    engine = LLMEngine(config, SyntheticRunner(eos=config.eos), writer)
    sp = SamplingParams(max_tokens=5, ignore_eos=True)
    engine.add_request(list(range(20, 30)), sp)
    engine.add_request(list(range(40, 46)), sp)
    engine.step()
    engine.step()
    engine.abort_request(1, "client")
    writer.flush()
    while not engine.is_finished():
        engine.step()
    engine.add_request(list(range(60, 66)), sp)
    engine.step()
    engine.step()
    engine.abort_request(2, "client")
    writer.flush()
    return engine


def every_fleet_event_type(sink=None) -> list:
    """A fleet run that writes every fleet event type (format 4): one prefill and two decode
    replicas, round robin, KV transfers of 0.1 ms plus 1 GB/s; the events, header first (with
    `sink`, a TraceWriter made with `fleet_event_type_header()`, the header alone).
    `traces/format-v4.trace` pins it."""
    from tracengine.fleet.engine import simulate_fleet
    config, spec, step_time, requests = _fleet_event_type_run()
    return simulate_fleet(config, requests, step_time, spec, sink, fleet_event_type_header() if sink else None)


def fleet_event_type_header():
    from tracengine.fleet.engine import fleet_header
    config, spec, step_time, _ = _fleet_event_type_run()
    return fleet_header(config, step_time, spec)


def _fleet_event_type_run():
    from tracengine.fleet.spec import FleetSpec
    from tracengine.engine.request import Request
    from tracengine.sim.steptime import FEATURES, PARTS, LinearStepTime
    config = every_event_type_config()
    spec = FleetSpec(num_prefill_replicas=1, num_decode_replicas=2, kv_bytes_per_token=512, kv_transfer_gbps=1.0,
                     kv_transfer_latency_ns=100_000)
    fixed = {part: [1_000_000 if part == "model_ns" else 0] + [0] * (len(FEATURES) - 1) for part in PARTS}
    step_time = LinearStepTime({"prefill": fixed, "decode": fixed})
    prefix = list(range(500, 508))
    requests = [Request(prefix + list(range(20 + 10 * i, 25 + 10 * i)), 4, i * 500_000, seq_id=i)
                for i in range(3)]
    return config, spec, step_time, requests


CANNED_WORKLOADS = ("worked_example", "head_of_line", "preemption_tail", "self_preemption", "recompute_prefix_hit",
                    "shared_prefix", "max_tokens_one", "eos_vs_length", "long_prompt_during_decode")
