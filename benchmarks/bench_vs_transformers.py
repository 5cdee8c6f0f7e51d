"""Throughput of tracengine against Hugging Face transformers' batched generate.

The workload is nano-vllm's benchmark (256 prompts of 100-1024 random
tokens, 100-1024 output tokens each) at half scale by default: 128
random-token prompts of random lengths (--input-len MIN:MAX), each request
with its own random number of output tokens (--output-len MIN:MAX), eos
ignored, greedy. It runs through tracengine and through transformers' padded
`generate` on the same model, in one process, on the same device, with the
same torch thread count. transformers runs the prompts as left-padded
batches (--hf-batch-size, default all of them, as tracengine's
max_num_seqs); a batch decodes until its longest request has its tokens, and
each request's output is cut to its own length. Throughput counts the tokens
the requests asked for, on both sides. Both are built and warmed up first;
then the two alternate for --repeats rounds, and each side's median is
reported: output tokens/s (wall clock), CPU seconds of the process, and the
ratio. One output length (`--output-len 64`) takes the padding of outputs
out of the comparison and leaves only prefill padding and the cost of a step.

    python benchmarks/bench_vs_transformers.py [--num-prompts 128] [--input-len 64:512] [--output-len 64:512]
    python benchmarks/bench_vs_transformers.py --architecture LlamaForCausalLM   # a tiny random checkpoint

`--architecture NAME` runs on a tiny random checkpoint of that architecture
(tracengine/model/tiny.py: hidden 64, 2 layers, 512 positions, written to a
temporary directory) instead of --model; `--architecture all` runs each in turn.

tracengine runs through tracengine.llm.LLM (scheduler, block manager,
runner), with a fresh scheduler each round so no round hits the previous
round's prefix cache. Its KV cache holds the whole workload
(`--num-kvcache-blocks`, default: what the prompts and outputs need), as
transformers' cache does.
"""
import argparse
import copy
import math
import random
import shutil
import statistics
import tempfile
import time

import torch

from tracengine.errors import TracengineError
from tracengine.model.loader import load_hf_config, resolve_model_dir
from tracengine.workload.sources import parse_range


def make_workload(num_prompts: int, min_len: int, max_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids from 1: 0 is the embedded model's eos, harmless here but confusing in a dump.
    return [[rng.randint(1, vocab_size - 1) for _ in range(rng.randint(min_len, max_len))] for _ in range(num_prompts)]


def make_output_lens(num_prompts: int, min_len: int, max_len: int, seed: int) -> list[int]:
    rng = random.Random(seed + 1)   # not the prompts' stream: a fixed length leaves the prompts as they were
    return [rng.randint(min_len, max_len) for _ in range(num_prompts)]


def workload_blocks(prompts: list[list[int]], output_lens: list[int], block_size: int) -> int:
    return sum(math.ceil((len(p) + n) / block_size) for p, n in zip(prompts, output_lens))


class LLMSide:
    name = "tracengine"

    def __init__(self, args, prompts: list[list[int]], output_lens: list[int]):
        from tracengine.engine.llm import LLM
        from tracengine.engine.sampling_params import SamplingParams
        self.llm = LLM(args.model, device=args.device, kvcache_block_size=args.block_size,
                       enforce_eager=args.enforce_eager,
                       max_model_len=max(len(p) + n for p, n in zip(prompts, output_lens)),
                       max_num_seqs=len(prompts), num_kvcache_blocks=args.num_kvcache_blocks)
        self.device = self.llm.runner.device
        self.prompts = prompts
        self.params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in output_lens]
        self.warmup_params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    def warmup(self):
        self.llm.generate(self.prompts[:2], self.warmup_params, use_tqdm=False)

    def generate(self) -> list[list[int]]:
        self.llm.reset()   # empty prefix cache: every round computes every prompt token
        return [out["token_ids"] for out in self.llm.generate(self.prompts, self.params, use_tqdm=False)]

    def close(self):
        self.llm.close()


class TransformersSide:
    """Left-padded batches of `batch_size` prompts (0: all in one); each batch
    generates as many tokens as its longest request asks for."""
    name = "transformers generate"

    def __init__(self, model: str, prompts: list[list[int]], output_lens: list[int], device: torch.device,
                 dtype: torch.dtype, pad_id: int, batch_size: int = 0):
        import transformers
        self.model = transformers.AutoModelForCausalLM.from_pretrained(resolve_model_dir(model), dtype=dtype)
        self.model = self.model.to(device).eval()
        batch_size = batch_size or len(prompts)
        self.batches = [self._pad(prompts[i:i + batch_size], output_lens[i:i + batch_size], pad_id, device)
                        for i in range(0, len(prompts), batch_size)]
        # Like ignore_eos: the real eos stays an ordinary token and generation runs
        # to max_new_tokens. Masking eos (min_new_tokens) would change the argmax,
        # and eos_token_id=None falls back to the model config's; an id past the
        # vocabulary is never generated.
        self.generation_config = copy.deepcopy(self.model.generation_config)
        self.generation_config.update(eos_token_id=self.model.config.vocab_size, pad_token_id=pad_id,
                                      do_sample=False)

    @staticmethod
    def _pad(prompts: list[list[int]], output_lens: list[int], pad_id: int, device: torch.device) -> dict:
        # Left padding: every prompt ends at the same column, where generation starts.
        width = max(len(p) for p in prompts)
        return dict(input_ids=torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device),
                    attention_mask=torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                                                device=device),
                    width=width, output_lens=output_lens)

    def _config(self, max_new_tokens: int):
        config = copy.deepcopy(self.generation_config)
        config.update(max_new_tokens=max_new_tokens)
        return config

    @property
    def num_generated(self) -> int:
        """Tokens computed per round, past each request's own length included."""
        return sum(len(b["output_lens"]) * max(b["output_lens"]) for b in self.batches)

    @torch.inference_mode()
    def warmup(self):
        batch = self.batches[0]
        self.model.generate(batch["input_ids"][:2], attention_mask=batch["attention_mask"][:2],
                            generation_config=self._config(4))

    @torch.inference_mode()
    def generate(self) -> list[list[int]]:
        outputs = []
        for batch in self.batches:
            out = self.model.generate(batch["input_ids"], attention_mask=batch["attention_mask"],
                                      generation_config=self._config(max(batch["output_lens"])))
            outputs += [row[:n] for row, n in zip(out[:, batch["width"]:].tolist(), batch["output_lens"])]
        return outputs

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
    parser.add_argument("--architecture", metavar="NAME",
                        help="a tiny random checkpoint of this architecture instead of --model (all: each in turn)")
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--input-len", default="64:512", help="prompt tokens, MIN:MAX or one length")
    parser.add_argument("--output-len", default="64:512", help="output tokens per request, MIN:MAX or one length")
    parser.add_argument("--hf-batch-size", type=int, default=0,
                        help="prompts per transformers batch (default: all, like tracengine's max_num_seqs)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-kvcache-blocks", type=int, default=0,
                        help="tracengine's KV cache (default: the blocks the whole workload needs)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed rounds of each side")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    try:
        in_low, in_high = parse_range(args.input_len, "--input-len")
        out_low, out_high = parse_range(args.output_len, "--output-len")
    except TracengineError as e:
        parser.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.architecture is None:
        run(args, (in_low, in_high), (out_low, out_high))
        return
    from tracengine.model.tiny import TINY, write_tiny_checkpoint
    architectures = list(TINY) if args.architecture == "all" else [args.architecture]
    if not set(architectures) <= set(TINY):
        parser.error(f"--architecture is one of {', '.join(TINY)} or all")
    for architecture in architectures:
        args.model = tempfile.mkdtemp(prefix="tracengine-bench-")
        try:
            write_tiny_checkpoint(args.model, architecture)
            print(f"--- {architecture} (tiny random checkpoint)")
            run(copy.copy(args), (in_low, in_high), (out_low, out_high))
        finally:
            shutil.rmtree(args.model, ignore_errors=True)


def run(args, input_len: tuple[int, int], output_len: tuple[int, int]):
    (in_low, in_high), (out_low, out_high) = input_len, output_len
    hf_config = load_hf_config(resolve_model_dir(args.model))
    prompts = make_workload(args.num_prompts, in_low, in_high, hf_config.vocab_size, args.seed)
    output_lens = make_output_lens(args.num_prompts, out_low, out_high, args.seed)
    if not args.num_kvcache_blocks:
        args.num_kvcache_blocks = workload_blocks(prompts, output_lens, args.block_size)

    from tracengine.runner.device import resolve_device, resolve_dtype
    device = resolve_device(args.device)
    pad_id = hf_config.pad_token_id if hf_config.pad_token_id is not None else 0
    ours = LLMSide(args, prompts, output_lens)
    theirs = TransformersSide(args.model, prompts, output_lens, device, resolve_dtype("auto", device, hf_config),
                              pad_id, args.hf_batch_size)
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

    num_output = sum(output_lens)
    ours_out, theirs_out = outputs[ours.name], outputs[theirs.name]
    for name, outs in outputs.items():
        assert [len(o) for o in outs] == output_lens, f"{name} gave the wrong number of tokens"
    agree = sum(a == b for a, b in zip(ours_out, theirs_out))
    median = {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
              for name, r in rounds.items()}
    print(f"workload: {args.num_prompts} prompts of {args.input_len} tokens, {args.output_len} output tokens each "
          f"({num_output} in all; transformers computes {theirs.num_generated} in {len(theirs.batches)} "
          f"batch(es)), greedy, device {device}, torch threads {torch.get_num_threads()}, {args.repeats} "
          f"alternating rounds (median); tracengine KV cache {args.num_kvcache_blocks} blocks of {args.block_size}")
    for side in sides:
        wall, cpu = median[side.name]
        walls = " ".join(f"{w:.2f}" for w, _ in rounds[side.name])
        print(f"{side.name:22s} {num_output / wall:10.1f} tok/s  ({wall:.3f} s wall, {cpu:.3f} s CPU; rounds {walls})")
    (ours_wall, ours_cpu), (theirs_wall, theirs_cpu) = median[ours.name], median[theirs.name]
    print(f"ratio: {theirs_wall / ours_wall:.2f}x wall, {theirs_cpu / ours_cpu:.2f}x CPU   "
          f"identical outputs: {agree}/{args.num_prompts}")


if __name__ == "__main__":
    main()
