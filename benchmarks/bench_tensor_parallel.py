"""Tensor parallelism against one rank on the same workload: start-up time,
prefill and decode throughput, the time rank 0 spends handing each step to
the workers (pipe header + one broadcast), and whether the greedy tokens
agree. On a CPU the ranks share the cores, so this measures the overhead of
the machinery, not a speed-up.

    python benchmarks/bench_tensor_parallel.py [--sizes 1,2] [--num-prompts 8] [--model DIR] [--device cpu]
"""
import argparse
import time

from bench_vs_transformers import make_workload


def run(args, size: int, prompts) -> dict:
    from tracengine.engine.llm import LLM
    from tracengine.engine.sampling_params import SamplingParams
    t = time.perf_counter()
    llm = LLM(args.model, device=args.device, tensor_parallel_size=size, kvcache_block_size=16,
              max_model_len=args.max_len + args.output_len, max_num_seqs=args.num_prompts)
    init_s = time.perf_counter() - t
    sp = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    send = {"n": 0, "s": 0.0}
    if llm.runner.tp is not None:   # time rank 0's hand-off of each forward
        tp, send_step = llm.runner.tp, llm.runner.tp.send_step

        def timed_send(*a):
            t0 = time.perf_counter()
            send_step(*a)
            send["n"], send["s"] = send["n"] + 1, send["s"] + time.perf_counter() - t0
        tp.send_step = timed_send
    llm.reset()
    outputs = llm.generate(prompts, sp, use_tqdm=False, summary=True)
    throughput = llm.last_run["throughput"]
    llm.close()
    return dict(size=size, init_s=init_s, prefill_tps=throughput["prefill_tokens_per_s"],
                decode_tps=throughput["decode_tokens_per_s"], send_us=send["s"] / max(send["n"], 1) * 1e6,
                tokens=[o["token_ids"] for o in outputs])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", default="1,2")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--min-len", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args()
    from tracengine.model.loader import load_hf_config, resolve_model_dir
    vocab_size = load_hf_config(resolve_model_dir(args.model)).vocab_size
    prompts = make_workload(args.num_prompts, args.min_len, args.max_len, vocab_size, seed=0)
    rows = [run(args, int(size), prompts) for size in args.sizes.split(",")]
    base = rows[0]
    print(f"{'ranks':>5} {'init s':>7} {'prefill tok/s':>14} {'ratio':>6} {'decode tok/s':>13} {'ratio':>6} "
          f"{'send us/step':>13} {'same tokens':>12}")
    for row in rows:
        same = sum(a == b for a, b in zip(row["tokens"], base["tokens"]))
        print(f"{row['size']:5d} {row['init_s']:7.1f} {row['prefill_tps']:14.0f} "
              f"{row['prefill_tps'] / base['prefill_tps']:6.2f} {row['decode_tps']:13.0f} "
              f"{row['decode_tps'] / base['decode_tps']:6.2f} {row['send_us']:13.0f} "
              f"{same:>6}/{len(prompts)}")


if __name__ == "__main__":
    main()
