"""Our Qwen3 against Hugging Face transformers' own, on the same weights, and
the loader's handling of real and broken checkpoint directories."""
import json
import shutil

import pytest
import torch
import transformers
from transformers import AutoTokenizer

from tracengine.engine.config import Config
from tracengine.errors import ModelError
from tracengine.model import EMBEDDED_MODEL_DIR
from tracengine.model.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from tracengine.model.loader import load_hf_config, load_model, resolve_model_dir
from tracengine.model.qwen3 import Qwen3ForCausalLM
from tracengine.runner.model_runner import ModelRunner
from tracengine.engine.sampling_params import SamplingParams
from tracengine.engine.sequence import Sequence

PROMPTS = [
    "The morning started grey and cold.",
    "To make bread you need",
    "A computer does one small thing at a time, but it does it very quickly. When many people",
    "Zebra quantum 42!",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def load_ours(path: str) -> Qwen3ForCausalLM:
    model = Qwen3ForCausalLM(load_hf_config(path))
    load_model(model, path)
    return model.eval()


def load_reference(path: str):
    return transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def all_logits(model: Qwen3ForCausalLM, token_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor(token_ids)
    return model.compute_logits(model(ids, torch.arange(len(token_ids))))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)


@pytest.fixture(scope="module")
def reference():
    return load_reference(EMBEDDED_MODEL_DIR)


def test_embedded_model_is_the_default_and_has_an_eos(tokenizer):
    assert resolve_model_dir("") == EMBEDDED_MODEL_DIR
    hf_config = load_hf_config(EMBEDDED_MODEL_DIR)
    assert hf_config.architectures == ["Qwen3ForCausalLM"]
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.eos_token_id == hf_config.eos_token_id
    assert len(tokenizer) == hf_config.vocab_size


def test_logits_match_transformers(tokenizer, reference):
    ours = load_ours(EMBEDDED_MODEL_DIR)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        with torch.inference_mode():
            expected = reference(torch.tensor([ids])).logits[0]
        assert (all_logits(ours, ids) - expected).abs().max().item() < 1e-4, prompt


def test_greedy_generation_through_the_runner_matches_transformers(tokenizer, reference):
    runner = ModelRunner(Config(kvcache_block_size=4, num_kvcache_blocks=64, max_model_len=256))
    for seq_id, prompt in enumerate(PROMPTS):
        ids = tokenizer.encode(prompt)
        with torch.inference_mode():
            expected = reference.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                          do_sample=False, max_new_tokens=20)[0, len(ids):].tolist()
        seq = Sequence(seq_id, ids, 4, SamplingParams(temperature=0.0))
        seq.block_table = list(range(32))   # 32 blocks of 4 tokens: room for prompt and output
        seq.num_scheduled_tokens = len(ids)
        is_prefill = True
        while seq.num_completion_tokens < len(expected):
            token_id = runner.run([seq], is_prefill)[0]
            seq.num_cached_tokens = seq.num_tokens
            seq.append_token(token_id)
            is_prefill = False
        assert seq.completion_token_ids == expected, prompt
    runner.exit()


@pytest.mark.parametrize("attention_bias", [False, True])
def test_untied_random_hf_checkpoint_matches_transformers(tmp_path, attention_bias):
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=24, max_position_embeddings=256, tie_word_embeddings=False,
        attention_bias=attention_bias, rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    transformers.Qwen3ForCausalLM(config).save_pretrained(tmp_path)   # safetensors, Hugging Face's own layout
    reference = load_reference(str(tmp_path))
    ours = load_ours(str(tmp_path))
    assert ours.lm_head.weight is not ours.model.embed_tokens.weight
    ids = torch.randint(0, 320, (50,)).tolist()
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    assert (all_logits(ours, ids) - expected).abs().max().item() < 1e-4


def test_tied_head_shares_the_embedding():
    ours = load_ours(EMBEDDED_MODEL_DIR)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight


# --- broken directories: one-line ModelError ---------------------------------

def copy_embedded(tmp_path):
    path = tmp_path / "model"
    shutil.copytree(EMBEDDED_MODEL_DIR, path)
    return path


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def assert_one_line(excinfo):
    assert "\n" not in str(excinfo.value)


def test_missing_directory(tmp_path):
    with pytest.raises(ModelError, match="model directory not found") as excinfo:
        load_hf_config(str(tmp_path / "nowhere"))
    assert_one_line(excinfo)


def test_missing_config_json(tmp_path):
    path = copy_embedded(tmp_path)
    (path / "config.json").unlink()
    with pytest.raises(ModelError, match="no config.json") as excinfo:
        load_hf_config(str(path))
    assert_one_line(excinfo)


def test_malformed_config_json(tmp_path):
    path = copy_embedded(tmp_path)
    (path / "config.json").write_text('{"model_type": "qwen3",')
    with pytest.raises(ModelError, match="not valid JSON") as excinfo:
        load_hf_config(str(path))
    assert_one_line(excinfo)


SUPPORTED = ("LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
             "Qwen3MoeForCausalLM")


@pytest.mark.parametrize("changes, name", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel"),
    ({"architectures": ["Qwen3ForSequenceClassification"]}, "Qwen3ForSequenceClassification"),
    ({"model_type": "gpt2", "architectures": []}, "model_type 'gpt2'"),   # no architectures: named by model_type
])
def test_wrong_architecture(tmp_path, changes, name):
    path = copy_embedded(tmp_path)
    edit_config(path, **changes)
    with pytest.raises(ModelError) as excinfo:
        load_hf_config(str(path))
    assert str(excinfo.value) == f"unsupported architecture {name}; supported: {SUPPORTED} (in {path})"


def test_a_config_without_architectures_is_named_by_its_model_type(tmp_path):
    path = copy_embedded(tmp_path)
    edit_config(path, architectures=None)
    assert load_hf_config(str(path)).model_type == "qwen3"


def test_unsupported_rope_type(tmp_path):
    path = copy_embedded(tmp_path)
    edit_config(path, rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ModelError, match="rope type 'linear' is not supported; supported: default, llama3"):
        load_hf_config(str(path))


def test_missing_weights(tmp_path):
    path = copy_embedded(tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="no \\*.safetensors weights") as excinfo:
        load_hf_config(str(path))
    assert_one_line(excinfo)


def test_checkpoint_with_a_missing_tensor(tmp_path):
    from safetensors.torch import load_file, save_file
    path = copy_embedded(tmp_path)
    weights = load_file(path / "model.safetensors")
    del weights["model.layers.1.self_attn.v_proj.weight"]   # qkv_proj is then only partly filled
    save_file(weights, path / "model.safetensors")
    model = Qwen3ForCausalLM(load_hf_config(str(path)))
    with pytest.raises(ModelError, match="no weight for model.layers.1.self_attn.qkv_proj.weight"):
        load_model(model, str(path))


def test_checkpoint_with_a_wrong_shape(tmp_path):
    path = copy_embedded(tmp_path)
    edit_config(path, intermediate_size=128)   # the stored MLP weights are 256 wide
    model = Qwen3ForCausalLM(load_hf_config(str(path)))
    with pytest.raises(ModelError, match="does not fit parameter of shape") as excinfo:
        load_model(model, str(path))
    assert_one_line(excinfo)


def test_runner_reports_a_bad_model_directory(tmp_path):
    with pytest.raises(ModelError, match="model directory not found"):
        ModelRunner(Config(model=str(tmp_path / "nowhere")))


# --- tensor-parallel shards: each rank's weight_loader cuts its piece ---------

def test_weight_loaders_cut_tensor_parallel_shards():
    full_q, full_k, full_v = torch.randn(8 * 4, 16), torch.randn(2 * 4, 16), torch.randn(2 * 4, 16)
    qkv = QKVParallelLinear(16, 4, 8, 2, tp_rank=1, tp_size=2)   # rank 1 holds heads 4-7 and kv head 1
    for shard_id, full in (("q", full_q), ("k", full_k), ("v", full_v)):
        qkv.weight.weight_loader(qkv.weight, full, shard_id)
    assert torch.equal(qkv.weight.data, torch.cat([full_q[16:], full_k[4:], full_v[4:]]))

    gate, up = torch.randn(12, 16), torch.randn(12, 16)
    gate_up = MergedColumnParallelLinear(16, [12, 12], tp_rank=0, tp_size=2)
    gate_up.weight.weight_loader(gate_up.weight, gate, 0)
    gate_up.weight.weight_loader(gate_up.weight, up, 1)
    assert torch.equal(gate_up.weight.data, torch.cat([gate[:6], up[:6]]))

    down, bias = torch.randn(16, 12), torch.randn(16)
    row = RowParallelLinear(12, 16, bias=True, tp_rank=1, tp_size=2)
    row.weight.weight_loader(row.weight, down)
    row.bias.weight_loader(row.bias, bias)
    assert torch.equal(row.weight.data, down[:, 6:]) and torch.equal(row.bias.data, bias)
