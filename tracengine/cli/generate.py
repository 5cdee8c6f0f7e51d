"""`tracengine generate`: run the engine on a workload, print a summary, optionally record."""
import os
import time

from tracengine.errors import TracengineError
from tracengine.workload.sources import build_workload, config_overrides


def cmd_generate(args) -> int:
    from tracengine.engine.llm import LLM
    if args.record and os.path.isdir(args.record):
        raise TracengineError(f"--record {args.record!r} is a directory")
    llm = LLM(args.model, **config_overrides(args))
    try:
        prompts, sps = build_workload(args, llm.hf_config.vocab_size)
        start = time.perf_counter()
        outputs = llm.generate(prompts, sps, record=args.record, use_tqdm=not args.quiet)
        elapsed = time.perf_counter() - start
    finally:
        llm.close()
    print_summary(llm, outputs, elapsed, args.record)
    return 0


def print_summary(llm, outputs, elapsed: float, record: str | None):
    run = llm.last_run
    num_prompt = run["num_prefill_tokens"]
    num_completion = sum(len(o["token_ids"]) for o in outputs)
    config = llm.config
    lines = [
        f"model        {llm.model_dir if config.model else 'embedded tiny Qwen3'} on {llm.runner.device}"
        f" ({str(llm.runner.dtype).removeprefix('torch.')})",
        f"config       {config.num_kvcache_blocks} KV blocks x {config.kvcache_block_size} tokens, "
        f"budget {config.max_num_batched_tokens} tokens, max {config.max_num_seqs} seqs",
        f"requests     {len(outputs)} ({sum(o['finish_reason'] == 'eos' for o in outputs)} eos, "
        f"{sum(o['finish_reason'] == 'length' for o in outputs)} length)",
        f"tokens       {run['num_prompt_tokens']} prompt, {num_completion} generated, "
        f"{num_prompt} computed in prefill",
        f"steps        {run['num_prefill_steps'] + run['num_decode_steps']} "
        f"({run['num_prefill_steps']} prefill, {run['num_decode_steps']} decode)",
        f"throughput   prefill {run['prefill_throughput']:.0f} tok/s, decode {run['decode_throughput']:.0f} tok/s, "
        f"{elapsed:.2f} s in all",
        f"preemptions  {run['num_preemptions']}",
        f"cache hits   {run['num_cached_blocks']} blocks ({run['num_cached_blocks'] * config.kvcache_block_size} tokens)",
    ]
    if record:
        lines.append(f"trace        {record} ({os.path.getsize(record):,} bytes)")
    print("\n".join(lines))
