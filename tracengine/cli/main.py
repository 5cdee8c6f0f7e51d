"""The `tracengine` command line: the parser, and each command's function.

The command modules import nothing heavy at the top (the model, torch and
Textual load inside the command that needs them), so `tracengine events`
starts without a framework."""
import argparse
import os
import sys
from contextlib import nullcontext

from tracengine.cli.analysis import cmd_export, cmd_stats, cmd_tui
from tracengine.cli.generate import cmd_generate
from tracengine.cli.replay import cmd_diff, cmd_replay
from tracengine.cli.serve import cmd_bench_serve, cmd_serve
from tracengine.cli.fleet import add_fleet_arguments
from tracengine.cli.simulate import add_step_time_arguments, add_sweep_arguments, cmd_calibrate, cmd_simulate
from tracengine.cli.trace import cmd_check, cmd_events, cmd_render
from tracengine.collector import collector_paused
from tracengine.errors import TracengineError
from tracengine.workload.sources import add_workload_arguments

EXIT_OK, EXIT_FAILED_CHECK, EXIT_BAD_INPUT, EXIT_NOT_ENDED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_PIPE_CLOSED = 141   # 128 + SIGPIPE, what a shell reports for a writer whose reader left

DESCRIPTION = """\
tracengine runs an LLM inference engine (Qwen3, paged KV cache, prefix caching,
continuous batching, chunked prefill, preemption by recomputation) and records
every scheduling decision, block allocation, preemption and sampled token as a
typed event in a compact trace. A trace replays exactly, runs again under
another config (what-if), and can be listed, checked, compared, summarised,
exported and stepped through."""

EXIT_CODES = """\
exit status:
  0    success (a check holds: the trace is whole, replays exactly, no difference)
  1    a failed check: replay diverges, diff finds a difference, check finds damage
  2    bad input: a missing or corrupt file, an impossible config or request,
       an output file that exists (give --force to overwrite it)
  3    check only: the trace is intact but has no end frame (still being written,
       or its writer was killed)
  130  interrupted (Ctrl-C); a trace being recorded ends at the last finished step
  141  the output pipe closed before the command finished (`| head`): no verdict"""

ENGINE_DEFAULTS = "built-in mix: 16-token blocks, 48 blocks, 256-token budget, 8 seqs"


def add_parser(sub, name: str, summary: str, description: str, **kwargs):
    """A subcommand whose --help has a description and the exit codes."""
    return sub.add_parser(name, help=summary, description=description, epilog=EXIT_CODES,
                          formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def add_engine_arguments(parser, title: str = "engine config (defaults are the engine's)"):
    """The engine flags (Config fields), shared by every command that builds an engine."""
    cfg = parser.add_argument_group(title)
    cfg.add_argument("--max-num-seqs", type=int, metavar="N", help="sequences in one step (default 512)")
    cfg.add_argument("--max-num-batched-tokens", type=int, metavar="N",
                     help="token budget of one prefill step (default 16384)")
    cfg.add_argument("--num-kvcache-blocks", type=int, metavar="N",
                     help="KV cache blocks (default: as many as --gpu-memory-utilization allows)")
    cfg.add_argument("--block-size", "--kvcache-block-size", type=int, dest="kvcache_block_size", metavar="N",
                     help="tokens per KV cache block; replay --set takes block_size or kvcache_block_size "
                     "(default 16)")
    cfg.add_argument("--max-model-len", type=int, metavar="N",
                     help="longest prompt plus completion (default 4096, at most the model's own)")
    cfg.add_argument("--gpu-memory-utilization", type=float, metavar="F",
                     help="share of device memory for weights and KV cache, in (0, 1] (default 0.9)")
    cfg.add_argument("--tensor-parallel-size", type=int, metavar="N", help="ranks to shard the model over (default 1)")
    cfg.add_argument("--device", help="auto, cpu, cuda or cuda:N (default auto: cuda if there is one)")
    cfg.add_argument("--dtype", help="auto, float32, bfloat16 or float16 (default auto: the checkpoint's on cuda, "
                     "float32 on cpu)")
    cfg.add_argument("--enforce-eager", action="store_true", default=None,
                     help="no CUDA graphs for decode (default: graphs on cuda)")
    cfg.add_argument("--scheduling-policy", metavar="POLICY",
                     help="prefill_first (nano-vllm's), mixed (vLLM V1's: decode tokens and prefill chunks in one "
                     "batch) or a Scheduler subclass as module:Class (docs/policies.md; default prefill_first)")


def add_workload_sources(parser):
    """Where a workload's prompts come from (generate and bench-serve)."""
    src = parser.add_argument_group("workload (default: a built-in mix that shows chunking, blocking, preemption and cache hits)")
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--prompts-file", help="one prompt per line, or JSONL with a 'prompt' field")
    src.add_argument("--num-prompts", type=int, help="synthetic workload: number of requests")
    src.add_argument("--input-len", help="synthetic prompt lengths MIN:MAX, with --num-prompts (default 64:256)")
    src.add_argument("--output-len", help="synthetic output lengths MIN:MAX, with --num-prompts (default 32:128)")
    src.add_argument("--prompt-lens", help="exact prompt token lengths, e.g. 25,8,6 (random token ids)")
    src.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload and of sampling (default 0)")


def add_sampling_arguments(parser):
    """Sampling flags that apply to every request of a workload."""
    smp = parser.add_argument_group("sampling")
    smp.add_argument("--max-tokens", type=int, help="maximum completion tokens per request "
                     "(default 64 for prompts, 16 for --prompt-lens, --output-len for --num-prompts)")
    smp.add_argument("--temperature", type=float, help="0 is greedy (default 1.0)")
    smp.add_argument("--ignore-eos", action="store_true", default=None,
                     help="generate max-tokens even past EOS (default: stop at EOS; on for synthetic and built-in)")


def add_generate(sub):
    p = add_parser(sub, "generate", "run the engine on a workload, optionally recording a trace",
                   "Run the engine on a workload (given prompts, a prompts file, a synthetic mix, exact\n"
                   "prompt lengths, or a built-in mix that shows chunked prefill, head-of-line blocking,\n"
                   "preemption and prefix-cache hits, or a --workload file of timed requests) and print a\n"
                   "summary; --record writes the trace. --request-rate makes any workload's requests arrive\n"
                   "over time (the engine sleeps while nothing is runnable).")
    p.add_argument("--model", default="", help="a Hugging Face Qwen3 checkpoint directory "
                   "(default: the embedded tiny model)")
    p.add_argument("--record", metavar="PATH", help="write the trace of the run to PATH")
    p.add_argument("--output", metavar="PATH", help="write every request's result to PATH as JSONL: prompt, text, "
                   "token ids, finish reason, TTFT and latency in seconds")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object (no completions)")
    p.add_argument("--force", action="store_true", help="overwrite the --record and --output files if they exist")
    add_workload_sources(p)
    add_workload_arguments(p.add_argument_group("arrivals and workload files (docs/workloads.md)"))
    add_engine_arguments(p, f"engine config (defaults are the engine's; {ENGINE_DEFAULTS})")
    add_sampling_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar (it goes to stderr)")
    p.set_defaults(run=cmd_generate)


def add_trace_commands(sub):
    p = add_parser(sub, "events", "list a trace's events",
                   "List a trace's events, one per line (the TraceHeader first), filtered by step,\n"
                   "sequence or type; --json prints one JSON object per event.")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--json", action="store_true", help="one JSON object per line: \"type\" and the event's fields")
    p.add_argument("--step", help="a step or a range A:B (B exclusive; either side may be empty)")
    p.add_argument("--seq", type=int, help="only events of this sequence")
    p.add_argument("--type", action="append", help="only events of this type (repeatable)")
    p.set_defaults(run=cmd_events)

    p = add_parser(sub, "render", "print a trace's step table, one line per step",
                   "Print a trace's step table: a config line, a legend, then one line per step (phase,\n"
                   "scheduled sequences as seq:tokens@cached, stop reason, arrivals, blocks, preemptions,\n"
                   "finishes, free blocks). The snapshot fixtures of tracengine.testing store this table.")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--steps", help="a step or a range A:B (B exclusive; either side may be empty)")
    p.add_argument("--seq", type=int, help="only the steps with an event of this sequence")
    p.set_defaults(run=cmd_render)

    p = add_parser(sub, "check", "integrity of a trace: frames, checksums, torn tail, events that follow",
                   "Check a trace: every frame's length and checksum, a torn last frame, the end frame,\n"
                   "and that each event follows from the ones before it (folded as replay would).\n"
                   "Exit 0 for a whole trace, 1 for damage, 3 for an intact trace without end frame.")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--fast", action="store_true", help="frames and checksums only: do not fold the events")
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.set_defaults(run=cmd_check)


def add_replay_commands(sub):
    p = add_parser(sub, "replay", "re-execute a trace and prove it reproduces; --set for what-if",
                   "Re-execute a trace with the real scheduler and block manager, feeding the recorded\n"
                   "tokens, and compare every event (exit 1 at the first divergence). With --set, run the\n"
                   "recorded workload under another config (what-if) and compare the two side by side.")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="what-if: override a config field (repeatable), e.g. num_kvcache_blocks=64 or block_size=8 "
                   "(the names of the header's config, as `events --type TraceHeader` shows them)")
    p.add_argument("--record", metavar="PATH", help="what-if: write the new run's trace")
    p.add_argument("--force", action="store_true", help="overwrite the --record file if it exists")
    p.add_argument("--state", type=int, metavar="STEP", help="print the folded state after STEP")
    p.add_argument("--arrivals", choices=("time", "steps"),
                   help="what-if: requests at their recorded arrival times in simulated time, or at their "
                   "recorded steps (default: time when the trace has arrival times)")
    add_step_time_arguments(p)
    add_sweep_arguments(p)
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.add_argument("--policy", metavar="MODULE:CLASS",
                   help="the scheduling policy to run: needed for a trace of a policy of one's own (a trace never "
                   "makes tracengine import code); with a built-in trace, checks the given policy against it")
    p.add_argument("--router", metavar="MODULE:CLASS",
                   help="a fleet trace: the router to replay every pool with (needed for a router of one's own)")
    p.set_defaults(run=cmd_replay)

    p = add_parser(sub, "diff", "first scheduling divergence between two traces",
                   "Compare two traces' scheduling events step by step: print the first difference and\n"
                   "the two runs side by side (exit 1 when they differ).")
    p.add_argument("a", help="the first trace")
    p.add_argument("b", help="the second trace")
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.set_defaults(run=cmd_diff)


def add_simulation_commands(sub):
    p = add_parser(sub, "calibrate", "fit a step-time model to a recorded trace",
                   "Fit each step's duration (schedule + model + postprocess, and each part) to its shape\n"
                   "per phase: tokens computed, sequences, context tokens read, (query, key) pairs scored.\n"
                   "Prints the error per step and on the total, on held-out steps (docs/simulation.md).")
    p.add_argument("trace", help="the recorded trace")
    p.add_argument("-o", "--output", metavar="FILE", help="write the model as JSON (for --step-time)")
    p.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    p.set_defaults(run=cmd_calibrate)

    p = add_parser(sub, "simulate", "run a workload through the real scheduler in simulated time, no model",
                   "Run a workload file (or a synthetic workload) through the real Scheduler and BlockManager\n"
                   "with no model and no torch: requests enter at their arrival times, each step lasts what\n"
                   "the step-time model says, tokens come from the synthetic runner. The --record trace is an\n"
                   "ordinary trace: stats, tui, diff, export and replay read it (docs/simulation.md).")
    p.add_argument("workload_file", nargs="?", metavar="WORKLOAD",
                   help="Mooncake JSONL, Azure CSV or tracengine JSONL (docs/workloads.md)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a config field (repeatable); num_kvcache_blocks is required, e.g. num_kvcache_blocks=100000")
    p.add_argument("--record", metavar="PATH", help="write the simulated run's trace to PATH")
    p.add_argument("--force", action="store_true", help="overwrite --record if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar (it goes to stderr)")
    p.add_argument("--vocab-size", type=int, metavar="N",
                   help="token ids of a length-only workload stay below N (default: the roofline model's, else 151936)")
    src = p.add_argument_group("synthetic workload (instead of a WORKLOAD file)")
    src.add_argument("--num-prompts", type=int, help="number of requests")
    src.add_argument("--input-len", help="prompt lengths MIN:MAX (default 64:256)")
    src.add_argument("--output-len", help="output lengths MIN:MAX (default 32:128)")
    src.add_argument("--prompt-lens", help="exact prompt token lengths, e.g. 25,8,6")
    src.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload and arrivals (default 0)")
    src.add_argument("--max-tokens", type=int, help="completion tokens per request, over the workload's")
    src.add_argument("--ignore-eos", action="store_true", default=None, help="run every request to its max tokens")
    add_workload_arguments(p.add_argument_group("arrivals and workload files (docs/workloads.md)"))
    add_step_time_arguments(p)
    add_sweep_arguments(p)
    add_fleet_arguments(p)
    p.set_defaults(run=cmd_simulate)


def add_analysis_commands(sub):
    p = add_parser(sub, "stats", "serving figures of a trace",
                   "Serving figures of a trace: queueing, TTFT, ITL, TPOT and end-to-end latency from each\n"
                   "request's arrival, in steps and ms; request and token throughput over the run; goodput\n"
                   "under --slo objectives; preemptions, prefix-cache hits, KV use (docs/stats.md).")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--json", action="store_true", help="the figures as one JSON object")
    p.add_argument("--slo", action="append", default=[], metavar="NAME=VALUE",
                   help="a service-level objective for goodput, e.g. ttft=200ms, tpot=50ms, e2e=2s (repeatable; "
                   "a request is good when it meets every one)")
    p.set_defaults(run=cmd_stats)

    p = add_parser(sub, "export", "export a trace for other tools",
                   "Export a trace as Chrome/Perfetto trace-event JSON (open it in ui.perfetto.dev).")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--perfetto", metavar="OUT", required=True, help="write Chrome/Perfetto trace-event JSON to OUT")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(run=cmd_export)

    p = add_parser(sub, "tui", "step through a trace in the terminal",
                   "Step through a trace in the terminal: queues, block map and events at each step.")
    p.add_argument("trace", help="the trace file")
    p.add_argument("--follow", action="store_true", help="follow a trace that is still being recorded")
    p.set_defaults(run=cmd_tui)


def add_serve_commands(sub):
    p = add_parser(sub, "serve", "an OpenAI-compatible server on the engine, recording what it serves",
                   "Serve the engine over HTTP with OpenAI's API (POST /v1/completions, /v1/chat/completions,\n"
                   "streamed or not; GET /v1/models, /health, /metrics), recording the traffic with --record.\n"
                   "SIGINT or SIGTERM aborts the requests in flight, closes the trace and exits 0 (docs/serve.md).")
    p.add_argument("--model", default="", help="a Hugging Face Qwen3 checkpoint directory "
                   "(default: the embedded tiny model)")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="the name clients send as `model` (default: --model as given, or 'embedded')")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default 8000)")
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1 "
                   "(default: $TRACENGINE_API_KEY if set, else no key)")
    p.add_argument("--record", metavar="PATH", help="write the trace of everything served to PATH")
    p.add_argument("--force", action="store_true", help="overwrite --record PATH if it exists")
    p.add_argument("--seed", type=int, default=0, help="seed of sampling (default 0)")
    add_engine_arguments(p)
    p.set_defaults(run=cmd_serve)

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
    add_workload_sources(p)
    add_workload_arguments(p.add_argument_group("arrivals and workload files (docs/workloads.md)"))
    add_sampling_arguments(p)
    p.set_defaults(run=cmd_bench_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracengine", description=DESCRIPTION, epilog=EXIT_CODES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from tracengine import __version__
    parser.add_argument("--version", action="version", version=f"tracengine {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_generate(sub)
    add_trace_commands(sub)
    add_replay_commands(sub)
    add_simulation_commands(sub)
    add_analysis_commands(sub)
    add_serve_commands(sub)
    return parser


# A trace or workload in, figures or a trace out: millions of events and tokens in no reference
# cycle, which the collector's passes would walk and not free (a fourth of a what-if's time, a
# third of an export's). The server, the TUI and generate (its model) keep the collector running.
BATCH_COMMANDS = frozenset({cmd_check, cmd_replay, cmd_diff, cmd_calibrate, cmd_simulate, cmd_stats, cmd_export})


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with collector_paused() if args.run in BATCH_COMMANDS else nullcontext():
            return args.run(args) or EXIT_OK
    except BrokenPipeError:   # `tracengine diff a b | head -1`: no error to print, but no verdict either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # so the exit's flush is quiet too
        return EXIT_PIPE_CLOSED
    except (TracengineError, OSError) as exc:
        print(f"tracengine: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError:    # a config this machine cannot hold (num_kvcache_blocks=10000000000): no traceback
        print("tracengine: error: out of memory: the config or input is too large for this machine",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tracengine: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
