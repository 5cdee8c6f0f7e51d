"""The `tracengine` command line: the parser, and each command's function.

The command modules import nothing heavy at the top (the model, torch and
Textual load inside the command that needs them), so `tracengine events`
starts without a framework."""
import argparse
import sys

from tracengine.cli.analysis import cmd_export, cmd_stats, cmd_tui
from tracengine.cli.generate import cmd_generate
from tracengine.cli.replay import cmd_diff, cmd_replay
from tracengine.cli.trace import cmd_check, cmd_events
from tracengine.errors import TracengineError

EXIT_OK, EXIT_FAILED_CHECK, EXIT_BAD_INPUT = 0, 1, 2


def add_generate(sub):
    p = sub.add_parser("generate", help="run the engine on a workload, optionally recording a trace")
    p.add_argument("--model", default="", help="Hugging Face Qwen3 checkpoint directory (default: the embedded tiny model)")
    p.add_argument("--record", metavar="PATH", help="write the trace of the run to PATH")
    src = p.add_argument_group("workload (default: a built-in mix that shows chunking, blocking, preemption and cache hits)")
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--prompts-file", help="one prompt per line, or JSONL with a 'prompt' field")
    src.add_argument("--num-prompts", type=int, help="synthetic workload: number of requests")
    src.add_argument("--input-len", default="64:256", help="synthetic prompt lengths MIN:MAX (default 64:256)")
    src.add_argument("--output-len", default="32:128", help="synthetic output lengths MIN:MAX (default 32:128)")
    src.add_argument("--prompt-lens", help="exact prompt token lengths, e.g. 25,8,6 (random token ids)")
    src.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload and of sampling")
    cfg = p.add_argument_group("engine config")
    cfg.add_argument("--max-num-seqs", type=int)
    cfg.add_argument("--max-num-batched-tokens", type=int)
    cfg.add_argument("--num-kvcache-blocks", type=int)
    cfg.add_argument("--block-size", type=int, dest="kvcache_block_size")
    cfg.add_argument("--max-model-len", type=int)
    cfg.add_argument("--gpu-memory-utilization", type=float)
    cfg.add_argument("--tensor-parallel-size", type=int)
    cfg.add_argument("--device")
    cfg.add_argument("--dtype")
    cfg.add_argument("--enforce-eager", action="store_true", default=None)
    smp = p.add_argument_group("sampling")
    smp.add_argument("--max-tokens", type=int, help="maximum completion tokens per request")
    smp.add_argument("--temperature", type=float, help="0 is greedy (default 1.0)")
    smp.add_argument("--ignore-eos", action="store_true", default=None)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=cmd_generate)


def add_trace_commands(sub):
    p = sub.add_parser("events", help="list a trace's events")
    p.add_argument("trace")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--step", help="a step or a range A:B (B exclusive)")
    p.add_argument("--seq", type=int, help="only events of this sequence")
    p.add_argument("--type", action="append", help="only events of this type (repeatable)")
    p.set_defaults(run=cmd_events)

    p = sub.add_parser("check", help="integrity of a trace: frames, checksums, torn tail")
    p.add_argument("trace")
    p.set_defaults(run=cmd_check)


def add_replay_commands(sub):
    p = sub.add_parser("replay", help="re-execute a trace and prove it reproduces; --set for what-if")
    p.add_argument("trace")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="what-if: override a config field")
    p.add_argument("--record", metavar="PATH", help="what-if: write the new run's trace")
    p.add_argument("--state", type=int, metavar="STEP", help="print the folded state after STEP")
    p.set_defaults(run=cmd_replay)

    p = sub.add_parser("diff", help="first scheduling divergence between two traces")
    p.add_argument("a")
    p.add_argument("b")
    p.set_defaults(run=cmd_diff)


def add_analysis_commands(sub):
    p = sub.add_parser("stats", help="serving figures of a trace")
    p.add_argument("trace")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_stats)

    p = sub.add_parser("export", help="export a trace for other tools")
    p.add_argument("trace")
    p.add_argument("--perfetto", metavar="OUT", required=True, help="Chrome/Perfetto trace-event JSON")
    p.set_defaults(run=cmd_export)

    p = sub.add_parser("tui", help="step through a trace in the terminal")
    p.add_argument("trace")
    p.add_argument("--follow", action="store_true", help="follow a trace that is still being recorded")
    p.set_defaults(run=cmd_tui)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracengine", description="tracengine: record, replay and study the scheduling of an LLM inference engine.")
    from tracengine import __version__
    parser.add_argument("--version", action="version", version=f"tracengine {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate(sub)
    add_trace_commands(sub)
    add_replay_commands(sub)
    add_analysis_commands(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or EXIT_OK
    except (TracengineError, OSError) as exc:
        print(f"tracengine: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tracengine: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
