"""`tracengine bench-serve`: send a workload to a server and measure it from the client."""
import asyncio
import json

from tracengine.cli.common import EXIT_FAILED_CHECK, EXIT_OK, add_parser
from tracengine.cli.flags import add_sampling_arguments, add_workload_arguments, add_workload_sources, workload_spec
from tracengine.cli.serve import api_key_of
from tracengine.errors import TracengineError
from tracengine.process.progress import RequestProgress
from tracengine.workload.sources import workload_requests


def add_to(sub):
    p = add_parser(sub, "bench-serve", "send a workload to a server and measure TTFT, TPOT, latency",
                   "Send a workload to an OpenAI-compatible server with its arrival process, streaming,\n"
                   "and print client-side TTFT, TPOT, ITL and end-to-end percentiles and throughput,\n"
                   "as vLLM's serving benchmark does.")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    p.add_argument("--model", help="the model name to send (default: the server's first in /v1/models)")
    p.add_argument("--api-key", metavar="KEY", help="sent as a Bearer token (default: $TRACENGINE_API_KEY)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions (default completions)")
    p.add_argument("--max-concurrency", type=int, metavar="N", help="at most N requests in flight (default: no bound)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="give up on one request after S seconds (default 600)")
    p.add_argument("--json", action="store_true", help="the figures as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar (it goes to stderr)")
    p.add_argument("--sessions", metavar="FILE",
                   help="a sessions file (docs/workloads.md) sent closed-loop: a later turn once the turns it "
                   "depends on came back and its think time passed, after their tokens (completions endpoint)")
    add_workload_sources(p)
    add_workload_arguments(p)
    add_sampling_arguments(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from tracengine.serve.bench import figures, render, run_benchmark, run_sessions, server_model, session_figures
    from tracengine.workload.sessions import has_sessions
    url = args.url.rstrip("/")
    api_key = api_key_of(args)
    entry = server_model(url, api_key)
    model = args.model or entry["id"]
    vocab_size = entry.get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise TracengineError(f"{url} does not say its vocabulary size in /v1/models; "
                              "give text prompts (--prompt, --prompts-file) or a workload of text")
    if args.sessions:
        if getattr(args, "workload", None) or args.endpoint == "chat":
            raise TracengineError("--sessions is the workload, sent to the completions endpoint: "
                                  "give no other workload and no --endpoint chat")
        args.workload = args.sessions
    requests = workload_requests(workload_spec(args), vocab_size, entry.get("max_model_len"))
    if args.sessions and not has_sessions(requests):
        raise TracengineError(f"{args.sessions} is not a sessions file: its rows carry no session_id")
    if args.max_concurrency is not None and args.max_concurrency <= 0:
        raise TracengineError(f"--max-concurrency must be positive, got {args.max_concurrency}")
    num_failed = 0

    def on_result(result):
        nonlocal num_failed
        num_failed += not result.ok
        progress.update(advance=1, num_failed=num_failed)
    with benchmark_progress(len(requests), enabled=not args.quiet) as progress:
        if args.sessions:
            results, duration = asyncio.run(run_sessions(url, requests, model, api_key, args.timeout, on_result))
        else:
            results, duration = asyncio.run(run_benchmark(url, requests, model, api_key, args.endpoint == "chat",
                                                          args.max_concurrency, args.timeout, on_result))
    f = figures([r for r in results if r is not None], duration)
    if args.sessions:
        f["sessions"] = session_figures(requests, results)
    print(json.dumps(f, indent=2) if args.json else render(f))
    return EXIT_OK if f["num_failed"] == 0 else EXIT_FAILED_CHECK



def benchmark_progress(num_requests: int, enabled: bool = True) -> RequestProgress:
    """Requests answered out of all, and how many of them failed (on stderr, as generate's and
    simulate's: a run of minutes shows it is running)."""
    return RequestProgress("Benchmarking", num_requests, "{task.fields[num_failed]} failed", enabled, num_failed=0)
