"""Throughput of tracengine against Hugging Face transformers' batched generate.

The same synthetic workload (random token prompts, fixed output length, eos
ignored, greedy) runs through tracengine and through transformers' padded
`generate` on the same model, in one process, on the same device, with the
same torch thread count. Both are built and warmed up first; then the two
alternate for --repeats rounds, and each side's median is reported: output
tokens/s (wall clock), CPU seconds of the process, and the ratio.

    python benchmarks/bench_vs_transformers.py [--num-prompts 32] [--engine auto|llm|runner]

--engine llm drives tracengine.llm.LLM (scheduler, block manager, runner),
with a fresh scheduler each round so no round hits the previous round's
prefix cache; --engine runner drives the ModelRunner directly with a minimal
static-batch loop (no scheduler); auto picks llm when it can be imported.
Either way the KV cache holds the whole workload (`--num-kvcache-blocks`,
default: what the prompts and outputs need), as transformers' cache does.
"""
import argparse
import copy
import math
import random
import statistics
import time

import torch

from tracengine.config import Config
from tracengine.model.loader import load_hf_config, resolve_model_dir


def make_workload(num_prompts: int, min_len: int, max_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids from 1: 0 is the embedded model's eos, harmless here but confusing in a dump.
    return [[rng.randint(1, vocab_size - 1) for _ in range(rng.randint(min_len, max_len))] for _ in range(num_prompts)]


def workload_blocks(prompts: list[list[int]], output_len: int, block_size: int) -> int:
    return sum(math.ceil((len(p) + output_len) / block_size) for p in prompts)


class LLMSide:
    name = "tracengine (llm)"

    def __init__(self, args, prompts: list[list[int]]):
        from tracengine.llm import LLM
        from tracengine.sampling_params import SamplingParams
        self.llm = LLM(args.model, device=args.device, kvcache_block_size=args.block_size,
                       enforce_eager=args.enforce_eager, max_model_len=args.max_len + args.output_len,
                       max_num_seqs=max(args.num_prompts, 1), num_kvcache_blocks=args.num_kvcache_blocks)
        self.device = self.llm.runner.device
        self.prompts = prompts
        self.sp = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
        self.warmup_sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    def warmup(self):
        self.llm.generate(self.prompts[:2], self.warmup_sp, use_tqdm=False)

    def generate(self) -> list[list[int]]:
        self.llm.reset()   # empty prefix cache: every round computes every prompt token
        return [out["token_ids"] for out in self.llm.generate(self.prompts, self.sp, use_tqdm=False)]

    def close(self):
        self.llm.close()


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


class RunnerSide:
    name = "tracengine (runner)"

    def __init__(self, args, prompts: list[list[int]]):
        from tracengine.runner.model_runner import ModelRunner
        max_model_len = args.max_len + args.output_len
        self.config = Config(model=args.model, device=args.device, kvcache_block_size=args.block_size,
                             num_kvcache_blocks=args.num_kvcache_blocks, max_model_len=max_model_len,
                             enforce_eager=args.enforce_eager, max_num_seqs=max(args.num_prompts, 1),
                             max_num_batched_tokens=max(8192, max_model_len))
        self.runner = ModelRunner(self.config)
        self.device = self.runner.device
        self.prompts, self.output_len = prompts, args.output_len

    def _generate(self, prompts, output_len):
        return generate_with_runner(self.runner, prompts, output_len, self.config.max_num_batched_tokens,
                                    self.config.max_num_seqs)

    def warmup(self):
        self._generate(self.prompts[:2], 4)

    def generate(self) -> list[list[int]]:
        return self._generate(self.prompts, self.output_len)

    def close(self):
        self.runner.exit()


class TransformersSide:
    name = "transformers generate"

    def __init__(self, args, prompts: list[list[int]], device: torch.device, dtype: torch.dtype, pad_id: int):
        import transformers
        self.model = transformers.Qwen3ForCausalLM.from_pretrained(resolve_model_dir(args.model), dtype=dtype)
        self.model = self.model.to(device).eval()
        self.width = max(len(p) for p in prompts)
        # Left padding: every prompt ends at the same column, where generation starts.
        self.input_ids = torch.tensor([[pad_id] * (self.width - len(p)) + p for p in prompts], device=device)
        self.attention_mask = torch.tensor([[0] * (self.width - len(p)) + [1] * len(p) for p in prompts],
                                           device=device)
        # Like ignore_eos: the real eos stays an ordinary token and generation runs
        # to max_new_tokens. Masking eos (min_new_tokens) would change the argmax,
        # and eos_token_id=None falls back to the model config's; an id past the
        # vocabulary is never generated.
        self.generation_config = copy.deepcopy(self.model.generation_config)
        self.generation_config.update(eos_token_id=self.model.config.vocab_size, pad_token_id=pad_id,
                                      do_sample=False, max_new_tokens=args.output_len)
        self.warmup_config = copy.deepcopy(self.generation_config)
        self.warmup_config.update(max_new_tokens=4)

    @torch.inference_mode()
    def warmup(self):
        self.model.generate(self.input_ids[:2], attention_mask=self.attention_mask[:2],
                            generation_config=self.warmup_config)

    @torch.inference_mode()
    def generate(self) -> list[list[int]]:
        out = self.model.generate(self.input_ids, attention_mask=self.attention_mask,
                                  generation_config=self.generation_config)
        return out[:, self.width:].tolist()

    def close(self):
        pass


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(side, device: torch.device) -> tuple[list[list[int]], float, float]:
    """(outputs, wall seconds, process CPU seconds) of one round."""
    _sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    outputs = side.generate()
    _sync(device)
    return outputs, time.perf_counter() - wall, time.process_time() - cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="model directory (default: the embedded tiny model)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-kvcache-blocks", type=int, default=0,
                        help="tracengine's KV cache (default: the blocks the whole workload needs)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--engine", choices=["auto", "llm", "runner"], default="auto")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="alternating timed rounds of each side")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    hf_config = load_hf_config(resolve_model_dir(args.model))
    prompts = make_workload(args.num_prompts, args.min_len, args.max_len, hf_config.vocab_size, args.seed)
    if not args.num_kvcache_blocks:
        args.num_kvcache_blocks = workload_blocks(prompts, args.output_len, args.block_size)
    engine = args.engine
    if engine == "auto":
        try:
            import tracengine.llm  # noqa: F401
            engine = "llm"
        except ImportError:
            engine = "runner"

    from tracengine.runner.model_runner import resolve_device, resolve_dtype
    device = resolve_device(args.device)
    pad_id = hf_config.pad_token_id if hf_config.pad_token_id is not None else 0
    ours = (LLMSide if engine == "llm" else RunnerSide)(args, prompts)
    theirs = TransformersSide(args, prompts, device, resolve_dtype("auto", device, hf_config), pad_id)
    sides = [ours, theirs]
    for side in sides:
        side.warmup()
    rounds = {side.name: [] for side in sides}
    outputs = {}
    for r in range(args.repeats):
        for side in (sides if r % 2 == 0 else sides[::-1]):   # alternate who goes first
            outputs[side.name], wall, cpu = timed(side, device)
            rounds[side.name].append((wall, cpu))
    for side in sides:
        side.close()

    num_output = args.num_prompts * args.output_len
    ours_out, theirs_out = outputs[ours.name], outputs[theirs.name]
    assert all(len(o) == args.output_len for o in ours_out) and all(len(o) == args.output_len for o in theirs_out)
    agree = sum(a == b for a, b in zip(ours_out, theirs_out))
    median = {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
              for name, r in rounds.items()}
    print(f"workload: {args.num_prompts} prompts of {args.min_len}-{args.max_len} tokens, "
          f"{args.output_len} output tokens each, greedy, device {device}, torch threads {torch.get_num_threads()}, "
          f"{args.repeats} alternating rounds (median); tracengine KV cache {args.num_kvcache_blocks} blocks "
          f"of {args.block_size}")
    for side in sides:
        wall, cpu = median[side.name]
        walls = " ".join(f"{w:.2f}" for w, _ in rounds[side.name])
        print(f"{side.name:22s} {num_output / wall:10.1f} tok/s  ({wall:.3f} s wall, {cpu:.3f} s CPU; rounds {walls})")
    (ours_wall, ours_cpu), (theirs_wall, theirs_cpu) = median[ours.name], median[theirs.name]
    print(f"ratio: {theirs_wall / ours_wall:.2f}x wall, {theirs_cpu / ours_cpu:.2f}x CPU   "
          f"identical outputs: {agree}/{args.num_prompts}")


if __name__ == "__main__":
    main()
