"""`tracengine serve`: an OpenAI-compatible server on the engine, recording what it serves."""
import os
import sys

from tracengine.cli.common import EXIT_OK, add_parser
from tracengine.cli.flags import add_config_arguments, config_overrides
from tracengine.cli.outputs import check_outputs
from tracengine.errors import TracengineError


def add_to(sub):
    p = add_parser(sub, "serve", "an OpenAI-compatible server on the engine, recording what it serves",
                   "Serve the engine over HTTP with OpenAI's API (POST /v1/completions, /v1/chat/completions,\n"
                   "streamed or not; GET /v1/models, /health, /metrics), recording the traffic with --record.\n"
                   "SIGINT or SIGTERM aborts the requests in flight, closes the trace and exits 0 (docs/serve.md).")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="the name clients send as `model` (default: --model as given, or 'embedded')")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default 8000)")
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1 "
                   "(default: $TRACENGINE_API_KEY if set, else no key)")
    p.add_argument("--record", metavar="PATH", help="write the trace of everything served to PATH")
    p.add_argument("--force", action="store_true", help="overwrite --record PATH if it exists")
    p.add_argument("--seed", type=int, default=0, help="seed of sampling (default 0)")
    add_config_arguments(p)
    p.set_defaults(run=run)


def api_key_of(args) -> str | None:
    return args.api_key or os.environ.get("TRACENGINE_API_KEY") or None


def run(args) -> int:
    from tracengine.engine.llm import LLM
    from tracengine.serve.server import ServeApp, bind
    check_outputs({"--record": args.record}, force=args.force)
    if not 0 <= args.port <= 65535:
        raise TracengineError(f"--port must be in 0..65535, got {args.port}")
    bind(args.host, args.port).close()     # a port in use fails before the model loads
    overrides = {"seed": args.seed, **config_overrides(args)}
    llm = LLM(**overrides)
    try:
        if args.record:
            llm.start_recording(args.record)
        app = ServeApp(llm, args.host, args.port, args.served_model_name or overrides.get("model") or "embedded",
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
    return EXIT_OK
