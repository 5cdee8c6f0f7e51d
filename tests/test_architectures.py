"""Every architecture in the registry against transformers' own, on a tiny
random checkpoint that transformers writes (model/tiny.py: no download):
logits through the paged runner (a chunked prefill reading its cached
prefix, then a decode), and greedy tokens identical to `generate` through
the engine under prefix caching, chunked prefill and preemption, with both
scheduling policies and on two tensor-parallel ranks (gloo); and the
roofline's weight counts against the model's own parameters."""
import pytest
import torch
import transformers

from tracengine import LLM, SamplingParams
from tracengine.cli import main
from tracengine.engine.config import Config
from tracengine.engine.sequence import Sequence
from tracengine.errors import ConfigError
from tracengine.model.loader import load_hf_config
from tracengine.model.registry import check_max_model_len, model_class, sliding_window_of
from tracengine.model.tiny import TINY, tiny_hf_config, write_tiny_checkpoint
from tracengine.runner.model_runner import ModelRunner
from tracengine.sim.roofline import ModelShape
from tracengine.trace.tracelog import open_trace

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NUM_NEW_TOKENS = 12


def prompts() -> list[list[int]]:
    """Four prompts of 22-30 tokens; the last three share a 12-token prefix (3 blocks of 4)."""
    generator = torch.Generator().manual_seed(1)
    common = torch.randint(1, 1024, (12,), generator=generator).tolist()
    own = [torch.randint(1, 1024, (n,), generator=generator).tolist() for n in (26, 10, 14, 18)]
    return [own[0]] + [common + tail for tail in own[1:]]


@pytest.fixture(scope="module", params=list(TINY))
def checkpoint(request, tmp_path_factory):
    """(architecture, checkpoint directory, transformers' model, its greedy tokens for prompts())."""
    architecture = request.param
    path = write_tiny_checkpoint(str(tmp_path_factory.mktemp(architecture)), architecture)
    reference = getattr(transformers, architecture).from_pretrained(path, dtype=torch.float32).eval()
    expected = []
    with torch.inference_mode():
        for ids in prompts():
            ids = torch.tensor([ids])
            out = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=NUM_NEW_TOKENS, eos_token_id=[], pad_token_id=0)
            expected.append(out[0, ids.size(1):].tolist())
    assert all(len(tokens) == NUM_NEW_TOKENS for tokens in expected)   # eos never stops it
    return architecture, path, reference, expected


def test_runner_logits_match_transformers(checkpoint):
    architecture, path, reference, _ = checkpoint
    ids = prompts()[0]   # 26 tokens
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    runner = ModelRunner(Config(model=path, kvcache_block_size=4, num_kvcache_blocks=16, max_model_len=64))
    assert type(runner.model).__name__ == architecture
    seq = Sequence(0, ids[:-1], 4)
    seq.block_table = list(range(7))   # 7 blocks of 4: 26 tokens and one more
    # a chunk of 16 tokens, then the other 9 reading the first 16 from the cache, then a decode
    seq.num_scheduled_tokens = 16
    first = runner.compute_logits([seq], True)[0]
    seq.num_cached_tokens, seq.num_scheduled_tokens = 16, 9
    second = runner.compute_logits([seq], True)[0]
    seq.num_cached_tokens = 25
    seq.append_token(ids[-1])
    decode = runner.compute_logits([seq], False)[0]
    runner.exit()
    for position, logits in ((15, first), (24, second), (25, decode)):
        torch.testing.assert_close(logits, expected[position], atol=1e-4, rtol=0)


@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
def test_greedy_tokens_match_transformers_generate(checkpoint, policy, tmp_path, capsys):
    architecture, path, _, expected = checkpoint
    # A budget of 16 tokens chunks the 26- and 30-token prompts; 20 blocks of 4 cannot hold the four
    # sequences at full length (4 x 10 blocks), so the running tail is preempted and recomputed.
    llm = LLM(path, kvcache_block_size=4, num_kvcache_blocks=20, max_num_batched_tokens=16, max_model_len=64,
              scheduling_policy=policy)
    trace = str(tmp_path / "run.trace")
    outputs = llm.generate(prompts(), SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True),
                           record=trace, use_tqdm=False, summary=True)
    summary = llm.last_run
    llm.close()
    assert [out["token_ids"] for out in outputs] == expected
    assert summary["prefix_cache"]["num_hit_blocks"] > 0
    assert summary["preemption"]["num_preemptions"] > 0
    header = next(iter(open_trace(trace)))
    assert header.model.architecture == architecture
    capsys.readouterr()
    assert main(["replay", trace]) == 0   # re-executed with no model, as any trace
    if policy == "prefill_first":         # and, as any trace, run under another config and calibrated from
        assert main(["replay", trace, "--set", "num_kvcache_blocks=40"]) == 0
        assert main(["calibrate", trace, "-o", str(tmp_path / "steptime.json")]) == 0
        assert "wrote" in capsys.readouterr().out


def test_two_ranks_match_transformers_generate(checkpoint):
    architecture, path, _, expected = checkpoint
    llm = LLM(path, tensor_parallel_size=2, kvcache_block_size=4, num_kvcache_blocks=64,
              max_num_batched_tokens=16, max_model_len=64)
    layer = llm.runner.model.model.layers[0]
    if architecture == "Qwen3MoeForCausalLM":
        # every rank holds every expert, with half of each one's 32 intermediate features
        assert len(layer.mlp.experts) == 4
        assert layer.mlp.experts[0].gate_up_proj.weight.shape == (2 * 16, 64)
    else:
        assert layer.mlp.gate_up_proj.weight.shape == (2 * 64, 64)   # half of 128, gate and up
    outputs = llm.generate(prompts(), SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True),
                           use_tqdm=False)
    llm.close()
    assert [out["token_ids"] for out in outputs] == expected


def test_a_sliding_window_shorter_than_max_model_len_is_refused(tmp_path, capsys):
    path = write_tiny_checkpoint(str(tmp_path), "MistralForCausalLM", sliding_window=32)
    # max_model_len: the default 4096, clipped to the model's 512 positions
    message = ("max_model_len=512 is longer than the model's sliding window of 32 tokens, and "
               "sliding-window attention is not implemented; set max_model_len to at most 32")
    with pytest.raises(ConfigError) as excinfo:
        LLM(path, kvcache_block_size=4, num_kvcache_blocks=16)
    assert str(excinfo.value) == message
    capsys.readouterr()
    assert main(["generate", "--quiet", "--model", path, "--prompt-lens", "5", "--tensor-parallel-size", "2"]) == 2
    assert capsys.readouterr().err == f"tracengine: error: {message}\n"   # refused before a worker starts
    llm = LLM(path, kvcache_block_size=4, num_kvcache_blocks=16, max_model_len=32)   # every sequence fits the window
    assert llm.config.max_model_len == 32
    llm.close()


def test_the_roofline_counts_the_models_own_weights(checkpoint):
    architecture, path, _, _ = checkpoint
    shape = ModelShape.from_file(path)
    hf_config = load_hf_config(path)
    with torch.device("meta"):
        model = model_class(hf_config)(hf_config)
    # matmul weights (2-D) by name, a tied LM head under its own name too; embeddings are looked up, not read whole
    weights = {name: p.numel() for name, p in model.named_parameters(remove_duplicate=False)
               if p.dim() == 2 and "embed_tokens" not in name}
    experts = sum(n for name, n in weights.items() if ".experts." in name)
    assert sum(weights.values()) - experts == shape.weight_bytes // shape.dtype_bytes   # float32: 4 bytes
    assert experts == shape.expert_bytes // shape.dtype_bytes * shape.num_experts
    num_sparse = sum(type(m).__name__ == "SparseMoeBlock" for m in model.modules())
    assert shape.num_sparse_layers == num_sparse == (1 if architecture == "Qwen3MoeForCausalLM" else 0)


@pytest.mark.parametrize("architecture, changes, window", [
    ("MistralForCausalLM", dict(sliding_window=32), 32),
    ("MistralForCausalLM", dict(sliding_window=None), None),
    ("Qwen2ForCausalLM", dict(sliding_window=32), None),    # use_sliding_window is off
    # Qwen2 slides from layer max_window_layers on: from layer 1 of 2, or none
    ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=32, max_window_layers=1), 32),
    ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=32, max_window_layers=2), None),
])
def test_the_sliding_window_is_the_one_the_reference_applies(architecture, changes, window):
    hf_config = tiny_hf_config(architecture, **changes)
    assert sliding_window_of(hf_config) == window
    check_max_model_len(hf_config, 32)   # a window as long as every sequence is causal attention
    if window is not None:
        with pytest.raises(ConfigError, match="max_model_len=33 is longer than the model's sliding window of 32"):
            check_max_model_len(hf_config, 33)


def test_a_moe_expert_width_the_ranks_cannot_split_is_refused():
    from tracengine.runner.tp_check import check_tensor_parallel
    hf_config = tiny_hf_config("Qwen3MoeForCausalLM", moe_intermediate_size=33)   # experts are split, not dealt out
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 does not divide the model's moe_intermediate_size 33"):
        check_tensor_parallel(Config(tensor_parallel_size=2), hf_config, torch.device("cpu"))
