"""Throughput of tracengine against Hugging Face transformers' batched generate.

The same synthetic workload (random token prompts, fixed output length, eos
ignored, greedy) runs through tracengine and through transformers' padded
`generate` on the same model, in one process, on the same device. Prints
output tokens/s for each and the ratio, and how many outputs agree.

    python benchmarks/bench_vs_transformers.py [--num-prompts 32] [--engine auto|llm|runner]

--engine llm drives tracengine.llm.LLM (scheduler, block manager, runner);
--engine runner drives the ModelRunner directly with a minimal static-batch
loop (no scheduler); auto picks llm when it can be imported.
"""
import argparse
import copy
import math
import random
import time

import torch

from tracengine.config import Config
from tracengine.model.loader import load_hf_config, resolve_model_dir


def make_workload(num_prompts: int, min_len: int, max_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids from 1: 0 is the embedded model's eos, harmless here but confusing in a dump.
    return [[rng.randint(1, vocab_size - 1) for _ in range(rng.randint(min_len, max_len))] for _ in range(num_prompts)]


def run_llm(args, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
    from tracengine.llm import LLM
    from tracengine.sampling_params import SamplingParams
    llm = LLM(args.model, device=args.device, kvcache_block_size=args.block_size, enforce_eager=args.enforce_eager,
              max_model_len=args.max_len + args.output_len, max_num_seqs=max(args.num_prompts, 1))
    sp = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    t = time.perf_counter()
    outputs = llm.generate(prompts, sp, use_tqdm=False)
    _sync(llm.runner.device)
    elapsed = time.perf_counter() - t
    llm.close()
    return [out["token_ids"] for out in outputs], elapsed


def generate_with_runner(runner, prompts: list[list[int]], output_len: int, max_num_batched_tokens: int,
                         max_num_seqs: int) -> list[list[int]]:
    """Static batching: prefill everything under the token budget, then
    decode all sequences together. Blocks are handed out in order."""
    from tracengine.sampling_params import SamplingParams
    from tracengine.sequence import Sequence
    bs, next_block, seqs = runner.block_size, 0, []
    for seq_id, prompt in enumerate(prompts):
        seq = Sequence(seq_id, prompt, bs, SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True))
        num_blocks = math.ceil((len(prompt) + output_len) / bs)
        seq.block_table, next_block = list(range(next_block, next_block + num_blocks)), next_block + num_blocks
        seqs.append(seq)
    assert next_block <= runner.num_kvcache_blocks, "KV cache too small for the workload"

    def step(batch, is_prefill):
        for seq in batch:
            seq.num_scheduled_tokens = seq.num_tokens - seq.num_cached_tokens if is_prefill else 1
        for seq, token_id in zip(batch, runner.run(batch, is_prefill)):
            seq.num_cached_tokens = seq.num_tokens
            seq.append_token(token_id)

    batch, num_batched = [], 0
    for seq in seqs:
        if batch and (num_batched + seq.num_tokens > max_num_batched_tokens or len(batch) == max_num_seqs):
            step(batch, True)
            batch, num_batched = [], 0
        batch.append(seq)
        num_batched += seq.num_tokens
    step(batch, True)
    for _ in range(output_len - 1):
        for i in range(0, len(seqs), max_num_seqs):
            step(seqs[i:i + max_num_seqs], False)
    return [seq.completion_token_ids for seq in seqs]


def run_runner(args, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
    from tracengine.runner.model_runner import ModelRunner
    max_model_len = args.max_len + args.output_len
    num_blocks = sum(math.ceil((len(p) + args.output_len) / args.block_size) for p in prompts)
    config = Config(model=args.model, device=args.device, kvcache_block_size=args.block_size,
                    num_kvcache_blocks=num_blocks, max_model_len=max_model_len, enforce_eager=args.enforce_eager,
                    max_num_seqs=max(args.num_prompts, 1), max_num_batched_tokens=max(8192, max_model_len))
    runner = ModelRunner(config)
    generate_with_runner(runner, prompts[:2], 4, config.max_num_batched_tokens, config.max_num_seqs)   # warmup
    t = time.perf_counter()
    outputs = generate_with_runner(runner, prompts, args.output_len, config.max_num_batched_tokens,
                                   config.max_num_seqs)
    _sync(runner.device)
    elapsed = time.perf_counter() - t
    runner.exit()
    return outputs, elapsed


@torch.inference_mode()
def run_transformers(args, prompts: list[list[int]], device: torch.device, dtype: torch.dtype, pad_id: int):
    import transformers
    model = transformers.Qwen3ForCausalLM.from_pretrained(resolve_model_dir(args.model), dtype=dtype).to(device).eval()
    width = max(len(p) for p in prompts)
    # Left padding: every prompt ends at the same column, where generation starts.
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)

    # Like ignore_eos: the real eos stays an ordinary token and generation runs
    # to max_new_tokens. Masking eos (min_new_tokens) would change the argmax,
    # and eos_token_id=None falls back to the model config's; an id past the
    # vocabulary is never generated.
    def generate(ids, mask, num_tokens):
        generation_config = copy.deepcopy(model.generation_config)
        generation_config.update(eos_token_id=model.config.vocab_size, pad_token_id=pad_id, do_sample=False,
                                 max_new_tokens=num_tokens)
        return model.generate(ids, attention_mask=mask, generation_config=generation_config)

    generate(input_ids[:2], attention_mask[:2], 4)   # warmup
    t = time.perf_counter()
    out = generate(input_ids, attention_mask, args.output_len)
    _sync(device)
    elapsed = time.perf_counter() - t
    return out[:, width:].tolist(), elapsed


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="model directory (default: the embedded tiny model)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--engine", choices=["auto", "llm", "runner"], default="auto")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    hf_config = load_hf_config(resolve_model_dir(args.model))
    prompts = make_workload(args.num_prompts, args.min_len, args.max_len, hf_config.vocab_size, args.seed)
    engine = args.engine
    if engine == "auto":
        try:
            import tracengine.llm  # noqa: F401
            engine = "llm"
        except ImportError:
            engine = "runner"
    ours, ours_s = (run_llm if engine == "llm" else run_runner)(args, prompts)

    from tracengine.runner.model_runner import resolve_device, resolve_dtype
    device = resolve_device(args.device)
    pad_id = hf_config.pad_token_id if hf_config.pad_token_id is not None else 0
    theirs, theirs_s = run_transformers(args, prompts, device, resolve_dtype("auto", device, hf_config), pad_id)

    num_output = args.num_prompts * args.output_len
    assert all(len(o) == args.output_len for o in ours) and all(len(o) == args.output_len for o in theirs)
    agree = sum(a == b for a, b in zip(ours, theirs))
    print(f"workload: {args.num_prompts} prompts of {args.min_len}-{args.max_len} tokens, "
          f"{args.output_len} output tokens each, greedy, device {device}, torch threads {torch.get_num_threads()}")
    print(f"tracengine ({engine}):   {num_output / ours_s:10.1f} tok/s  ({ours_s:.2f} s)")
    print(f"transformers generate: {num_output / theirs_s:10.1f} tok/s  ({theirs_s:.2f} s)")
    print(f"ratio: {theirs_s / ours_s:.2f}x   identical outputs: {agree}/{args.num_prompts}")


if __name__ == "__main__":
    main()
