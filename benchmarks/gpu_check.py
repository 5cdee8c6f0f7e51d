"""GPU check: tracengine on CUDA, eager and with CUDA graphs, on the embedded
tiny model and on a random-weight model of Qwen3-0.6B's shape (written to a
temporary directory), with a throughput table and agreement checks
(CUDA graphs vs eager; tracengine vs transformers on the tiny model; the
mixed scheduling policy, whose mixed batches take flash-attn's varlen path
and whose pure decode steps the graphs, vs prefill-first; its row builds the
run's events to count its mixed steps, so its throughput is not comparable).
With more than one GPU, a tensor-parallel case runs the same workloads on
2 ranks (NCCL) and compares tokens and logits with 1 rank; with one GPU it
is skipped with a note. Then each architecture of the registry (Llama,
Mistral, Qwen2, Qwen3, Qwen3-MoE) on its tiny random checkpoint
(tracengine/model/tiny.py): float32 on the torch backend, eager and with
CUDA graphs (Qwen3-MoE's routing keeps it eager), greedy tokens against
transformers generate; with flash-attn, a bfloat16 row on it too; and the
two-rank case. Runs in a few minutes on one H200; exits 1 with a message
without CUDA.

    python benchmarks/gpu_check.py            # on a CUDA machine
    python benchmarks/gpu_check.py --smoke    # the same code paths on the CPU, small shapes (TP over gloo)
"""
import argparse
import os
import shutil
import sys
import tempfile
import time
from types import SimpleNamespace

import torch

from bench_vs_transformers import TransformersSide, make_workload  # a sibling script: python puts its folder on the path
from tracengine.model import EMBEDDED_MODEL_DIR

QWEN3_06B_SHAPE = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960)
SMOKE_SHAPE = dict(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_random_checkpoint(path: str, shape: dict, device: str):
    """A Qwen3 checkpoint in Hugging Face's layout with random bfloat16 weights
    (std 0.02, norms 1). Only the shape matters here: throughput, not text."""
    import transformers
    from safetensors.torch import save_file
    config = transformers.Qwen3Config(**shape, tie_word_embeddings=True, rms_norm_eps=1e-6,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    config.architectures = ["Qwen3ForCausalLM"]
    config.dtype = torch.bfloat16
    config.save_pretrained(path)
    with torch.device("meta"):
        names_shapes = [(n, p.shape) for n, p in transformers.Qwen3ForCausalLM(config).named_parameters()]
    generator = torch.Generator(device=device).manual_seed(0)
    state = {}
    for name, param_shape in names_shapes:
        if name.endswith("norm.weight"):
            tensor = torch.ones(param_shape)
        else:
            tensor = torch.empty(param_shape, device=device).normal_(0.0, 0.02, generator=generator)
        state[name] = tensor.to(torch.bfloat16).cpu()
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:   # the engine loads a tokenizer; prompts here are token ids
        shutil.copy(os.path.join(EMBEDDED_MODEL_DIR, name), path)


def run_case(model: str, eager: bool, workload: SimpleNamespace, prompts, temperature: float, engine_args: dict):
    from tracengine.engine.llm import LLM
    from tracengine.engine.sampling_params import SamplingParams
    t0 = time.perf_counter()
    llm = LLM(model, enforce_eager=eager, **engine_args)
    init_s = time.perf_counter() - t0
    llm.generate(prompts[:2], SamplingParams(temperature=temperature, max_tokens=4, ignore_eos=True), use_tqdm=False)
    sp = SamplingParams(temperature=temperature, max_tokens=workload.output_len, ignore_eos=True)
    _sync(llm.runner.device)
    t = time.perf_counter()
    mixed = engine_args.get("scheduling_policy") == "mixed"     # its run counts its mixed steps
    if mixed:
        llm.reset()      # a run's summary folds it from step 0
    outputs = llm.generate(prompts, sp, use_tqdm=False, summary=mixed)
    _sync(llm.runner.device)
    elapsed = time.perf_counter() - t
    runner = llm.runner
    row = dict(mode="cuda graphs" if runner.graph_runner is not None else "eager", temperature=temperature, dtype=str(runner.dtype)[6:],
               backend=runner.attention_backend, blocks=runner.num_kvcache_blocks, init_s=init_s, run_s=elapsed,
               out_tps=len(prompts) * workload.output_len / elapsed,
               total_tps=(sum(map(len, prompts)) + len(prompts) * workload.output_len) / elapsed,
               num_mixed_steps=llm.last_run["steps"]["num_mixed_steps"] if mixed else 0)
    llm.close()
    del llm, runner
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row, [out["token_ids"] for out in outputs]


def prefill_logits(model: str, engine_args: dict, prompts, tensor_parallel_size: int) -> torch.Tensor:
    """Rank 0's next-token logits of one prefill over `prompts`, each in its own blocks."""
    from tracengine.engine.llm import LLM
    from tracengine.engine.sequence import Sequence
    llm = LLM(model, enforce_eager=True, tensor_parallel_size=tensor_parallel_size, **engine_args)
    block_size, next_block, seqs = llm.config.kvcache_block_size, 0, []
    for seq_id, prompt in enumerate(prompts):
        seq = Sequence(seq_id, prompt, block_size)
        num_blocks = -(-len(prompt) // block_size)
        seq.block_table = list(range(next_block, next_block + num_blocks))
        seq.num_scheduled_tokens = len(prompt)
        next_block += num_blocks
        seqs.append(seq)
    logits = llm.runner.compute_logits(seqs, True).float().cpu()
    llm.close()
    return logits


def architecture_cases(tmp: str, device: str, smoke: bool, flash: bool, run_tp: bool, rows: list,
                       agreements: list):
    """Each architecture's tiny checkpoint: greedy tokens against transformers (float32), eager and graphs."""
    from tracengine.model.tiny import SHAPE, TINY, write_tiny_checkpoint
    workload = SimpleNamespace(num_prompts=64, min_len=32, max_len=192, output_len=64)
    if smoke:
        workload = SimpleNamespace(num_prompts=4, min_len=8, max_len=24, output_len=6)
    for architecture in TINY:
        path = write_tiny_checkpoint(os.path.join(tmp, architecture), architecture)
        label = f"{architecture} (tiny)"
        prompts = make_workload(workload.num_prompts, workload.min_len, workload.max_len, SHAPE["vocab_size"], seed=0)
        engine_args = dict(device=device, dtype="float32", max_model_len=workload.max_len + workload.output_len,
                           max_num_seqs=workload.num_prompts, max_num_batched_tokens=4096,
                           gpu_memory_utilization=0.3, kvcache_block_size=16)
        outputs = {}
        for eager in (True, False):
            row, outputs[eager] = run_case(path, eager, workload, prompts, 0.0, engine_args)
            rows.append(dict(model=label, **row))
            print(_format(rows[-1]), flush=True)
        side = TransformersSide(path, prompts, [workload.output_len] * len(prompts), torch.device(device),
                                torch.float32, pad_id=0)
        theirs = side.generate()
        for eager, mode in ((True, rows[-2]["mode"]), (False, rows[-1]["mode"])):
            same = sum(a == b for a, b in zip(outputs[eager], theirs))
            agreements.append(f"{label}: greedy outputs identical to transformers generate, {mode}: "
                              f"{same}/{len(prompts)}")
        if flash:   # bfloat16 on flash-attn's paged kernels: its rounding differs, so agreement is a count
            row, bf16 = run_case(path, False, workload, prompts, 0.0,
                                 dict(engine_args, dtype="bfloat16", kvcache_block_size=256))
            rows.append(dict(model=label, **row))
            print(_format(rows[-1]), flush=True)
            same = sum(a == b for a, b in zip(bf16, theirs))
            agreements.append(f"{label}: bfloat16 on flash-attn, greedy outputs as float32 transformers': "
                              f"{same}/{len(prompts)}")
        if run_tp:
            tensor_parallel_case(label, path, workload, prompts, engine_args, outputs, rows, agreements)


def tensor_parallel_case(label: str, model: str, workload, prompts, engine_args: dict, one_rank: dict,
                         rows: list, agreements: list):
    """Two ranks against one: greedy tokens (eager and CUDA graphs) and prefill logits.
    `one_rank` holds the one-rank greedy outputs by eager flag."""
    size = 2
    for eager in (True, False):
        row, outputs = run_case(model, eager, workload, prompts, 0.0, dict(engine_args, tensor_parallel_size=size))
        rows.append(dict(model=label, **{**row, "mode": f"tp{size} {row['mode']}"}))
        print(_format(rows[-1]), flush=True)
        same = sum(a == b for a, b in zip(outputs, one_rank[eager]))
        agreements.append(f"{label}: greedy outputs identical with {size} ranks and 1 ({rows[-1]['mode']}): "
                          f"{same}/{len(prompts)}")
    sample = prompts[:8]
    diff = (prefill_logits(model, engine_args, sample, size) - prefill_logits(model, engine_args, sample, 1)).abs()
    agreements.append(f"{label}: prefill logits, {size} ranks vs 1, max abs diff {diff.max().item():.2e} "
                      f"(mean {diff.mean().item():.2e}) over {len(sample)} prompts")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="run on the CPU with small shapes and workloads")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available; run it on a machine with an NVIDIA GPU (or --smoke on the CPU)",
              file=sys.stderr)
        sys.exit(1)
    device = "cpu" if args.smoke else "cuda"
    flash = False
    if not args.smoke:
        try:
            import flash_attn  # noqa: F401
            flash = True
        except ImportError:
            pass
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, "
          f"flash-attn {'installed' if flash else 'not installed'}")

    tiny = SimpleNamespace(num_prompts=256, min_len=64, max_len=256, output_len=256)
    big = SimpleNamespace(num_prompts=128, min_len=128, max_len=512, output_len=128)
    if args.smoke:
        tiny = SimpleNamespace(num_prompts=6, min_len=8, max_len=24, output_len=8)
        big = SimpleNamespace(num_prompts=4, min_len=8, max_len=24, output_len=6)
    # The CPU smoke runs the tensor-parallel case over gloo; CUDA needs two devices.
    run_tp = args.smoke or torch.cuda.device_count() > 1
    tmp = tempfile.mkdtemp(prefix="tracengine-gpu-check-")
    try:
        t = time.perf_counter()
        shape = SMOKE_SHAPE if args.smoke else QWEN3_06B_SHAPE
        write_random_checkpoint(tmp, shape, device)
        print(f"wrote the random Qwen3-0.6B-shaped checkpoint in {time.perf_counter() - t:.1f}s")
        models = [("tiny (embedded)", "", tiny, 1024), ("qwen3-0.6b shape, random bf16", tmp, big, shape["vocab_size"])]
        rows, agreements = [], []
        for label, model, workload, vocab in models:
            prompts = make_workload(workload.num_prompts, workload.min_len, workload.max_len, vocab, seed=0)
            engine_args = dict(device=device, max_model_len=workload.max_len + workload.output_len,
                               max_num_seqs=workload.num_prompts, max_num_batched_tokens=8192,
                               gpu_memory_utilization=0.5, kvcache_block_size=256 if flash else 16)
            outputs = {}
            for eager, temperature in ((True, 0.0), (False, 0.0), (False, 0.8)):
                row, outputs[eager, temperature] = run_case(model, eager, workload, prompts, temperature, engine_args)
                rows.append(dict(model=label, **row))
                print(_format(rows[-1]), flush=True)
            same = sum(a == b for a, b in zip(outputs[True, 0.0], outputs[False, 0.0]))
            # The modes the two runs really had: on the CPU (--smoke) both are eager.
            agreements.append(f"{label}: greedy outputs identical, {rows[-3]['mode']} and {rows[-2]['mode']}: "
                              f"{same}/{len(prompts)}")
            # The mixed policy (vLLM V1's): a budget of a quarter of the prompts' tokens chunks them beside
            # decodes, so mixed batches take flash-attn's varlen path with the block table and pure decode
            # steps the CUDA graphs; greedy tokens must be those of prefill-first's schedule.
            budget = max(workload.max_len, sum(map(len, prompts)) // 4)
            row, mixed = run_case(model, False, workload, prompts, 0.0,
                                  dict(engine_args, scheduling_policy="mixed", max_num_batched_tokens=budget))
            rows.append(dict(model=label, **{**row, "mode": row["mode"] + ", mixed"}))
            print(_format(rows[-1]), flush=True)
            same = sum(a == b for a, b in zip(mixed, outputs[False, 0.0]))
            agreements.append(f"{label}: greedy outputs identical, mixed policy (budget {budget}, "
                              f"{row['num_mixed_steps']} mixed steps) and prefill-first, {rows[-1]['mode']}: "
                              f"{same}/{len(prompts)}")
            if run_tp:
                one_rank = {eager: outputs[eager, 0.0] for eager in (True, False)}
                tensor_parallel_case(label, model, workload, prompts, engine_args, one_rank, rows, agreements)
            if model == "":
                side = TransformersSide("", prompts, [workload.output_len] * len(prompts), torch.device(device),
                                        torch.float32, pad_id=0)
                theirs = side.generate()
                side.close()
                same = sum(a == b for a, b in zip(outputs[False, 0.0], theirs))
                agreements.append(f"{label}: greedy outputs identical to transformers generate: "
                                  f"{same}/{len(prompts)}")
        architecture_cases(tmp, device, args.smoke, flash, run_tp, rows, agreements)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"{'model':32} {'mode':12} {'T':>4} {'dtype':9} {'attn':6} {'blocks':>7} {'init s':>7} {'run s':>7} "
          f"{'out tok/s':>10} {'all tok/s':>10}")
    for row in rows:
        print(_format(row))
    print()
    for line in agreements:
        print(line)
    if not run_tp:
        print(f"tensor parallel: skipped, it needs more than one CUDA device and this machine has "
              f"{torch.cuda.device_count()}")


def _format(row: dict) -> str:
    return (f"{row['model']:32} {row['mode']:12} {row['temperature']:4.1f} {row['dtype']:9} {row['backend']:6} "
            f"{row['blocks']:7d} {row['init_s']:7.1f} {row['run_s']:7.2f} {row['out_tps']:10.1f} "
            f"{row['total_tps']:10.1f}")


if __name__ == "__main__":
    main()
