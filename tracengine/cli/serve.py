"""`tracengine serve` and `tracengine bench-serve`."""
import asyncio
import json
import os
import sys

from tracengine.cli.outputs import check_outputs
from tracengine.errors import TracengineError
from tracengine.workload.sources import CONFIG_FLAGS, workload_requests


def api_key_of(args) -> str | None:
    return args.api_key or os.environ.get("TRACENGINE_API_KEY") or None


def cmd_serve(args) -> int:
    from tracengine.engine.llm import LLM
    from tracengine.serve.server import ServeApp, bind
    check_outputs({"--record": args.record}, force=args.force)
    if not 0 <= args.port <= 65535:
        raise TracengineError(f"--port must be in 0..65535, got {args.port}")
    bind(args.host, args.port).close()     # a port in use fails before the model loads
    overrides = {name: getattr(args, name) for name in CONFIG_FLAGS if getattr(args, name, None) is not None}
    llm = LLM(args.model, seed=args.seed, **overrides)
    try:
        if args.record:
            llm.start_recording(args.record)
        app = ServeApp(llm, args.host, args.port, args.served_model_name or args.model or "embedded",
                       api_key_of(args))
        print(f"tracengine serve: {app.server.model_name} on {app.url} ({llm.config.num_kvcache_blocks} KV blocks "
              f"of {llm.config.kvcache_block_size} tokens){', recording ' + args.record if args.record else ''}",
              flush=True)
        app.run()
    finally:
        llm.close()                        # the trace's end frame
    scheduler = llm.scheduler
    print(f"tracengine serve: stopped after {llm.num_steps} steps, {llm.next_seq_id} requests; "
          f"{len(scheduler.waiting) + len(scheduler.running)} unfinished"
          f"{'; trace ' + args.record + f' ({os.path.getsize(args.record):,} bytes)' if args.record else ''}",
          file=sys.stderr)
    return 0


def cmd_bench_serve(args) -> int:
    from tracengine.serve.bench import figures, render, run_benchmark, server_model
    url = args.url.rstrip("/")
    api_key = api_key_of(args)
    entry = server_model(url, api_key)
    model = args.model or entry["id"]
    vocab_size = entry.get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise TracengineError(f"{url} does not say its vocabulary size in /v1/models; "
                              "give text prompts (--prompt, --prompts-file) or a workload of text")
    requests = workload_requests(args, vocab_size, entry.get("max_model_len"))
    if args.max_concurrency is not None and args.max_concurrency <= 0:
        raise TracengineError(f"--max-concurrency must be positive, got {args.max_concurrency}")
    results, duration = asyncio.run(run_benchmark(url, requests, model, api_key, args.endpoint == "chat",
                                                  args.max_concurrency, args.timeout))
    f = figures(results, duration)
    print(json.dumps(f, indent=2) if args.json else render(f))
    return 0 if f["num_failed"] == 0 else 1
