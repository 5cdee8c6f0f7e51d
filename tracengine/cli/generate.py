"""`tracengine generate`: run the engine on a workload, print a summary (and
the completions of given prompts), optionally record the trace and write
every request's result as JSONL."""
import json
import math
import os
import time

from tracengine.cli.common import EXIT_OK, add_parser
from tracengine.cli.flags import (add_config_arguments, add_sampling_arguments, add_workload_arguments,
                                  add_workload_sources, config_overrides, workload_spec)
from tracengine.cli.outputs import check_outputs
from tracengine.errors import RequestError
from tracengine.workload.sessions import has_sessions
from tracengine.workload.sources import DEFAULT_CONFIG, sampling_params, workload_config, workload_requests
from tracengine.analysis.figures import Stats, to_json_object

BUILTIN_DEFAULTS = (f"built-in mix: {DEFAULT_CONFIG['kvcache_block_size']}-token blocks, "
                    f"{DEFAULT_CONFIG['num_kvcache_blocks']} blocks, {DEFAULT_CONFIG['max_num_batched_tokens']}-token "
                    f"budget, {DEFAULT_CONFIG['max_num_seqs']} seqs")


def add_to(sub):
    p = add_parser(sub, "generate", "run the engine on a workload, optionally recording a trace",
                   "Run the engine on a workload (given prompts, a prompts file, a synthetic mix, exact\n"
                   "prompt lengths, or a built-in mix that shows chunked prefill, head-of-line blocking,\n"
                   "preemption and prefix-cache hits, or a --workload file of timed requests) and print a\n"
                   "summary; --record writes the trace. --request-rate makes any workload's requests arrive\n"
                   "over time (the engine sleeps while nothing is runnable).")
    p.add_argument("--record", metavar="PATH", help="write the trace of the run to PATH")
    p.add_argument("--output", metavar="PATH", help="write every request's result to PATH as JSONL: prompt, text, "
                   "token ids, finish reason, TTFT and latency in seconds")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object (no completions)")
    p.add_argument("--force", action="store_true", help="overwrite the --record and --output files if they exist")
    add_workload_sources(p)
    add_workload_arguments(p)
    add_config_arguments(p, f"engine config (defaults are the engine's; {BUILTIN_DEFAULTS})")
    add_sampling_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar (it goes to stderr)")
    p.set_defaults(run=run)


def run(args) -> int:
    from tracengine.cli.results import FinishedResults
    from tracengine.engine.llm import LLM
    check_outputs({"--record": args.record, "--output": args.output},
                  {"prompts file": args.prompts_file, "workload file": args.workload}, args.force)
    spec = workload_spec(args)
    llm = LLM(**{**workload_config(spec), **config_overrides(args)})
    results = None      # what an interrupted run still writes to --output
    try:
        requests = workload_requests(spec, llm.hf_config.vocab_size, llm.config.max_model_len)
        prompts = [check_fits(llm, r) for r in requests]
        turns = session_turns(llm, requests, prompts) if has_sessions(requests) else None
        params = [sampling_params(r) for r in requests]
        timed = not (math.isinf(args.request_rate) and args.workload is None)
        # Recorded here, not by generate(record=): a run that fails or is interrupted ends its
        # trace saying why (TraceWriter.end_with), and the summary is folded as the events come.
        if args.record:
            llm.start_recording(args.record)
        results = FinishedResults(llm.sink)
        first_seq_id = llm.next_seq_id
        llm.set_sink(results)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=not args.quiet,
                               arrival_ns=[r.arrival_ns for r in requests] if timed and turns is None else None,
                               summary=True, sessions=turns)
        elapsed = time.perf_counter() - start
    except BaseException as exc:
        if llm.writer is not None:
            llm.writer.end_with(exc)
        if args.output and isinstance(exc, KeyboardInterrupt) and results is not None:
            finished = results.results(llm.tokenizer)
            write_outputs(args.output, [dict(finished[first_seq_id + i], prompt=r.prompt, prompt_token_ids=p)
                                        for i, (r, p) in enumerate(zip(requests, prompts))
                                        if first_seq_id + i in finished])
        raise
    finally:
        llm.close()
    if args.output:
        write_outputs(args.output, [dict(o, prompt=r.prompt) for o, r in zip(outputs, requests)])
    if args.json:
        print(json.dumps(run_summary(llm, elapsed, args.record, args.output), indent=2, default=to_json_object))
        return EXIT_OK
    if args.prompt or args.prompts_file:
        print_completions([dict(o, prompt=r.prompt) for o, r in zip(outputs, requests)])
    print_summary(llm, outputs, elapsed, args.record, args.output)
    return EXIT_OK


def write_outputs(path: str, outputs: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for o in outputs:
            f.write(json.dumps({"prompt": o["prompt"], "text": o["text"], "prompt_token_ids": o["prompt_token_ids"],
                                "token_ids": o["token_ids"], "finish_reason": o["finish_reason"],
                                "ttft_s": o["ttft_s"], "latency_s": o["latency_s"]}) + "\n")


def print_completions(outputs: list[dict]) -> None:
    for i, o in enumerate(outputs):
        print(f"[{i}] {o['prompt']!r}")
        print(f"    -> {o['text']!r} ({len(o['token_ids'])} tokens, {o['finish_reason']})")
    print()


def run_summary(llm, elapsed: float, record: str | None, output: str | None) -> dict:
    """What --json prints: the run's model, device and config, `tracengine stats`'
    figures (llm.last_run) under "stats", the wall time and the files written."""
    config = llm.config
    return {"model": llm.model_dir if config.model else "embedded tiny Qwen3", "device": str(llm.runner.device),
            "dtype": str(llm.runner.dtype).removeprefix("torch."), "config": config.to_dict(),
            "elapsed_s": elapsed, "trace": record, "trace_bytes": os.path.getsize(record) if record else None,
            "output": output, "stats": llm.last_run}


def check_fits(llm, request):
    """The prompt of a request as token ids, refused before the run (and before a recording
    on a device or a pipe has written anything) if it could never be served; one read from
    a file names its line."""
    prompt = llm.tokenizer.encode(request.prompt) if isinstance(request.prompt, str) else request.prompt
    try:
        llm.scheduler.check_request(len(prompt), request.max_tokens)
    except RequestError as exc:
        raise RequestError(f"{request.source}: {exc}" if request.source else str(exc)) from None
    return prompt


def session_turns(llm, requests, prompts) -> list:
    """A sessions workload's turns with their prompts as token ids, each refused before the run if
    the history it may be sent after could outgrow what the engine serves (workload/sessions.py)."""
    from dataclasses import replace

    from tracengine.workload.sessions import set_history_bounds
    turns = [replace(r, prompt=p) for r, p in zip(requests, prompts)]
    set_history_bounds(turns)       # in tokens, now that text prompts are
    for turn in turns:
        if turn.num_history_tokens:
            try:
                llm.scheduler.check_request(len(turn.prompt) + turn.num_history_tokens, turn.max_tokens)
            except RequestError as exc:
                raise RequestError(f"{turn.source}: with the history of its session before it: {exc}") from None
    return turns


def latency_line(s: Stats) -> str:
    """TTFT and TPOT from each request's arrival, and requests per second of the run."""
    def ms(name, p):
        value = getattr(getattr(s.latency, name).seconds, p)
        return "-" if value is None else f"{value * 1e3:,.1f}"
    idle = s.steps.idle_s
    return (f"TTFT p50 {ms('ttft', 'p50')} ms, p99 {ms('ttft', 'p99')} ms; TPOT p50 {ms('tpot', 'p50')} ms; "
            f"{s.throughput.requests_per_s or 0:.2f} req/s" + (f" ({idle:.2f} s idle)" if idle else ""))


def print_summary(llm, outputs, elapsed: float, record: str | None, output: str | None = None):
    """The run's figures are `tracengine stats`' (llm.last_run)."""
    s = llm.last_run
    tok, st, tp, pc = s.tokens, s.steps, s.throughput, s.prefix_cache
    reasons = s.requests.finish_reasons
    config = llm.config
    lines = [
        f"model        {llm.model_dir if config.model else 'embedded tiny Qwen3'} on {llm.runner.device}"
        f" ({str(llm.runner.dtype).removeprefix('torch.')})",
        f"config       {config.num_kvcache_blocks} KV blocks x {config.kvcache_block_size} tokens, "
        f"budget {config.max_num_batched_tokens} tokens, max {config.max_num_seqs} seqs",
        f"requests     {s.requests.num_requests} ({reasons.get('eos', 0)} eos, {reasons.get('length', 0)} length)",
        f"tokens       {tok.num_prompt_tokens} prompt, {tok.num_completion_tokens} generated, "
        f"{tok.num_prefill_tokens} computed in prefill",
        f"steps        {st.num_steps} ({st.num_prefill_steps} prefill, {st.num_decode_steps} decode"
        f"{', {} mixed'.format(st.num_mixed_steps) if st.num_mixed_steps else ''})",
        f"throughput   prefill {tp.prefill_tokens_per_s or 0:.0f} tok/s, decode {tp.decode_tokens_per_s or 0:.0f} "
        f"tok/s, {elapsed:.2f} s in all",
        f"latency      {latency_line(s)}",
        f"preemptions  {s.preemption.num_preemptions}",
        f"cache hits   {pc.num_hit_blocks} blocks ({pc.num_hit_tokens} tokens)",
    ]
    if record:
        lines.append(f"trace        {record} ({os.path.getsize(record):,} bytes)")
    if output:
        lines.append(f"outputs      {output} ({len(outputs)} lines)")
    print("\n".join(lines))
