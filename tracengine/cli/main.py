"""The `tracengine` command line: one module per command (its parser in `add_to`, its work
in `run`), assembled here; errors become one line and an exit code (cli/common.py).

The command modules import nothing heavy at the top (the model, torch and Textual load
inside the command that needs them), so `tracengine events` starts without a framework."""
import argparse
import gc
import importlib
import os
import sys
from contextlib import nullcontext

from tracengine.cli.common import (EXIT_BAD_INPUT, EXIT_CODES, EXIT_INTERRUPTED, EXIT_NOT_INSTALLED, EXIT_OK,
                                   EXIT_PIPE_CLOSED, EXIT_TERMINATED)
from tracengine.errors import NotInstalledError, TracengineError
from tracengine.process.collector import collector_paused
from tracengine.process.signals import interrupt_signal_name, sigterm_as_interrupt

DESCRIPTION = """\
tracengine runs an LLM inference engine (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE;
paged KV cache, prefix caching, continuous batching, chunked prefill, preemption
by recomputation) and records every scheduling decision, block allocation,
preemption and sampled token as a typed event in a compact trace. A trace
replays exactly, runs again under another config (what-if), and can be listed,
checked, compared, summarised, exported and stepped through."""

# In the order `tracengine --help` lists them.
COMMANDS = ["generate", "events", "render", "check", "replay", "diff", "calibrate", "simulate", "stats", "export",
            "tui", "serve", "bench_serve"]

# A trace or workload in, figures or a trace out: millions of events and tokens in no reference
# cycle, which the collector's passes would walk and not free. The server, the TUI and generate
# (its model) keep the collector running.
BATCH_COMMANDS = frozenset({"check", "replay", "diff", "calibrate", "simulate", "stats", "export"})
# These close on SIGTERM themselves (the server drains and closes its trace; Textual restores the
# terminal); every other command takes SIGTERM as it takes Ctrl-C.
OWN_SIGTERM = frozenset({"serve", "tui"})
# Packages that may hold resources behind finalizers (worker processes, shared memory, GPU state):
# a batch command that loaded one (simulate --scheduler vllm, a sweep on Ray) leaves its objects
# to the exit's collector passes, which run those finalizers.
FINALIZED_AT_EXIT = ("torch", "vllm", "sglang", "ray")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or only `command`'s: a command line that names its command
    first imports no other command's module (a command's own work starts sooner)."""
    parser = argparse.ArgumentParser(prog="tracengine", description=DESCRIPTION, epilog=EXIT_CODES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from tracengine.version import __version__
    import tracengine.compiled as compiled
    parser.add_argument("--version", action="version", version=f"tracengine {__version__}\ncompiled core: {compiled.CORE}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS if command is None else [command]:
        importlib.import_module(f"tracengine.cli.{name}").add_to(sub)
    return parser


def main(argv=None) -> int:
    """The exit code of a command line: `argv`, or without it this process's own, the process
    then ending when main returns (the `tracengine` script, `python -m tracengine.cli`)."""
    own = argv is None
    argv = sys.argv[1:] if own else list(argv)
    named = argv[0] if argv and argv[0] in COMMANDS else None
    # A batch command that is this process's own: its modules' objects and its run's live until
    # the process exits (no object of tracengine's has a finalizer; a file is closed by its
    # `with`), so a pass of the collector over them frees nothing: the collector is paused from
    # before the modules load, and what is left at the end is frozen, out of the exit's passes
    # (unless a package in FINALIZED_AT_EXIT was loaded).
    whole_process = own and named in BATCH_COMMANDS
    if whole_process:
        gc.disable()
    args = build_parser(named).parse_args(argv)

    def run() -> int:
        with collector_paused() if args.command in BATCH_COMMANDS else nullcontext(), \
                nullcontext() if args.command in OWN_SIGTERM else sigterm_as_interrupt():
            return args.run(args) or EXIT_OK
    code = exit_code_of(run)
    if whole_process and not any(name in sys.modules for name in FINALIZED_AT_EXIT):
        gc.freeze()
    return code


def exit_code_of(run) -> int:
    """`run()`'s exit code, what a user can cause printed in one line with its own code: the
    command line's, and any command of tracengine's run as a module of its own."""
    try:
        return run()
    except BrokenPipeError:   # `tracengine diff a b | head -1`: no error to print, but no verdict either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # so the exit's flush is quiet too
        return EXIT_PIPE_CLOSED
    except NotInstalledError as exc:
        print(f"tracengine: error: {exc}", file=sys.stderr)
        return EXIT_NOT_INSTALLED
    except (TracengineError, OSError) as exc:
        print(f"tracengine: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError:    # a config this machine cannot hold (num_kvcache_blocks=10000000000): no traceback
        print("tracengine: error: out of memory: the config or input is too large for this machine",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        name = interrupt_signal_name(exc)
        print(f"tracengine: interrupted ({name})", file=sys.stderr)
        return EXIT_INTERRUPTED if name == "SIGINT" else EXIT_TERMINATED


if __name__ == "__main__":
    sys.exit(main())
