"""Build the embedded tiny Qwen3 model in tracengine/model/embedded/.

A byte-level BPE tokenizer is trained on scripts/tiny_corpus.txt, then a
small Qwen3ForCausalLM (random init at a fixed seed, std 0.02, norms 1) is
trained a few hundred steps on the same text with transformers' own Qwen3,
so greedy output looks like words rather than noise and argmax ties are rare.
Everything runs on the CPU with fixed seeds in a single thread; takes well
under a minute. The output is committed: the engine never runs this script.

    python scripts/make_tiny_model.py [--steps 200] [--out DIR]
"""
import argparse
import json
import os
import time

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "tiny_corpus.txt")
DEFAULT_OUT = os.path.normpath(os.path.join(HERE, os.pardir, "tracengine", "model", "embedded"))
EOS = "<|endoftext|>"
SEED = 0
TARGET_VOCAB_SIZE = 1024


def read_documents() -> list[str]:
    with open(CORPUS, encoding="utf-8") as f:
        return [doc.strip() for doc in f.read().split("\n\n") if doc.strip()]


def train_tokenizer(documents: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=TARGET_VOCAB_SIZE, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(documents, trainer)
    return tokenizer


def model_config(vocab_size: int, eos_id: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "torch_dtype": "float32",
    }


def init_weights(model: torch.nn.Module, generator: torch.Generator):
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)


def train(model: torch.nn.Module, data: torch.Tensor, steps: int, generator: torch.Generator,
          batch_size: int = 8, seq_len: int = 64):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    model.train()
    for step in range(steps):
        lr = 3e-3 * min(1.0, (step + 1) / 20) * (1 - step / steps)   # warmup, then linear decay
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=generator)
        batch = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()])
        loss = _next_token_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}")
    model.eval()


def _next_token_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps (0: random weights only)")
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)            # one thread: the same float sums in the same order every run
    torch.use_deterministic_algorithms(True)
    t0 = time.time()

    documents = read_documents()
    tokenizer = train_tokenizer(documents)
    eos_id = tokenizer.token_to_id(EOS)
    config = model_config(tokenizer.get_vocab_size(), eos_id)

    from transformers import Qwen3Config, Qwen3ForCausalLM
    hf_config = Qwen3Config(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    hf_config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(hf_config)
    generator = torch.Generator().manual_seed(SEED)
    init_weights(model, generator)
    ids = []
    for doc in documents:
        ids += tokenizer.encode(doc).ids + [eos_id]
    if args.steps:
        train(model, torch.tensor(ids), args.steps, generator)

    os.makedirs(args.out, exist_ok=True)
    # A tied checkpoint stores the embedding only, as Hugging Face writes it.
    state = {name: t.detach().contiguous() for name, t in model.state_dict().items() if name != "lm_head.weight"}
    save_file(state, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(os.path.join(args.out, "tokenizer.json"))
    write_json(args.out, "config.json", config)
    write_json(args.out, "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS, "pad_token": EOS, "bos_token": None, "unk_token": None,
        "model_max_length": config["max_position_embeddings"], "clean_up_tokenization_spaces": False,
    })
    write_json(args.out, "special_tokens_map.json", {"eos_token": EOS, "pad_token": EOS})
    write_json(args.out, "generation_config.json", {
        "bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id, "do_sample": False,
    })
    num_params = sum(t.numel() for t in state.values())
    print(f"wrote {args.out}: vocab {config['vocab_size']}, {num_params} parameters, "
          f"{len(ids)} training tokens, {time.time() - t0:.1f}s")


def write_json(out: str, name: str, value: dict):
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
