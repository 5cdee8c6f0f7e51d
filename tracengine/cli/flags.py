"""Flags that several commands share, turned into plain values before anything runs: the
config (one flag per Config field that is an engine flag, from the field's own help, and
`--set NAME=VALUE` for every field), the workload's sources, arrivals and sampling (a
`WorkloadSpec`). Nothing below cli/ sees argparse."""
import math
from dataclasses import fields

from tracengine.engine.config import Config, field_help, flag_fields, parse_override
from tracengine.errors import ConfigError, TracengineError
from tracengine.workload.formats import FORMATS
from tracengine.workload.sources import WorkloadSpec

# The engine flags' names where they are not the field's (nano-vllm's and vLLM's --block-size).
FLAG_NAMES = {"kvcache_block_size": ("--block-size", "--kvcache-block-size")}
METAVARS = {int: "N", float: "X", str: "VALUE"}


def add_config_arguments(parser, title: str = "engine config (defaults are the engine's)", flags: bool = True):
    """The config of the run: `--set NAME=VALUE` (any field, repeatable) and, with `flags`,
    a flag per engine field (`--max-num-seqs N`); both land in config_overrides."""
    group = parser.add_argument_group(title)
    if flags:
        for name in flag_fields():
            kind = type(Config.__dataclass_fields__[name].default)
            default = Config.__dataclass_fields__[name].default
            shown = f" (default {default})" if name != "model" else ""
            names = FLAG_NAMES.get(name, ("--" + name.replace("_", "-"),))
            if kind is bool:
                group.add_argument(*names, dest=name, action="store_true", default=None,
                                   help=field_help(name) + shown)
            else:
                group.add_argument(*names, dest=name, type=kind, metavar=METAVARS[kind],
                                   help=field_help(name) + shown)
    group.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       help="a config field (repeatable), e.g. num_kvcache_blocks=64: every field of the header's "
                       "config (`tracengine events --type TraceHeader`), block_size for kvcache_block_size")


def config_overrides(args) -> dict:
    """The config fields the user gave, by flag or by --set; a field given twice is an error
    (one of the two would silently win)."""
    given = {name: getattr(args, name) for name in flag_fields() if getattr(args, name, None) is not None}
    for text in args.set:
        name, value = parse_override(text)
        if name in given:
            raise ConfigError(f"{name} is given twice (as a flag and in --set, or twice in --set)")
        given[name] = value
    return given


def add_workload_sources(parser):
    """Where a workload's prompts come from (generate and bench-serve)."""
    src = parser.add_argument_group("workload (default: a built-in mix that shows chunking, blocking, preemption "
                                    "and cache hits)")
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--prompts-file", help="one prompt per line, or JSONL with a 'prompt' field")
    add_synthetic_arguments(src)


def add_synthetic_arguments(group):
    group.add_argument("--num-prompts", type=int, help="synthetic workload: number of requests")
    group.add_argument("--input-len", help="synthetic prompt lengths MIN:MAX, with --num-prompts (default 64:256)")
    group.add_argument("--output-len", help="synthetic output lengths MIN:MAX, with --num-prompts (default 32:128)")
    group.add_argument("--prompt-lens", help="exact prompt token lengths, e.g. 25,8,6 (random token ids)")
    group.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload, its arrivals and of "
                       "sampling (default 0)")


def add_sampling_arguments(parser):
    """Sampling flags that apply to every request of a workload."""
    smp = parser.add_argument_group("sampling")
    smp.add_argument("--max-tokens", type=int, help="maximum completion tokens per request "
                     "(default 64 for prompts, 16 for --prompt-lens, --output-len for --num-prompts)")
    smp.add_argument("--temperature", type=float, help="0 is greedy (default 1.0)")
    smp.add_argument("--ignore-eos", action="store_true", default=None,
                     help="generate max-tokens even past EOS (default: stop at EOS; on for synthetic and built-in)")


def add_workload_arguments(parser):
    """The flags of a workload file and of arrivals."""
    group = parser.add_argument_group("arrivals and workload files (docs/workloads.md)")
    group.add_argument("--workload", metavar="FILE", help="requests with arrival times: Mooncake JSONL, Azure CSV "
                       "or tracengine JSONL (docs/workloads.md)")
    group.add_argument("--workload-format", choices=FORMATS, help="the --workload format (default: detected)")
    group.add_argument("--max-requests", type=int, metavar="N", help="only the first N requests of the workload")
    group.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                       help="a workload file's arrivals X times faster (default 1)")
    group.add_argument("--length-scale", type=float, default=1.0, metavar="X",
                       help="a workload file's prompt and output lengths times X, at least 1 token (default 1)")
    group.add_argument("--request-rate", type=float, default=math.inf, metavar="R",
                       help="requests arrive at R per second (gamma gaps, as vLLM's serving benchmark); "
                       "default inf: all at the start")
    group.add_argument("--burstiness", type=float, default=1.0, metavar="B",
                       help="gamma shape of the gaps between arrivals: 1 is Poisson, below 1 burstier")


def workload_spec(args, **given) -> WorkloadSpec:
    """The WorkloadSpec of the flags a command has (those it lacks keep the spec's defaults);
    `given` replaces some (simulate: no text prompts, no temperature)."""
    values = {f.name: getattr(args, f.name) for f in fields(WorkloadSpec) if hasattr(args, f.name)}
    return WorkloadSpec(**{**values, **given})


DEFAULT_VOCAB_SIZE = 151_936     # Qwen3's: the made-up token ids of a length-only workload stay below it


def workload_for_simulation(args, workload: str | None, vocab_size: int, lazy: bool = False):
    """The requests; `lazy`: a workload file read as the run takes them (workload_requests)."""
    from tracengine.workload.sources import workload_requests
    if not workload and args.num_prompts is None and not args.prompt_lens:
        raise TracengineError("simulate needs a WORKLOAD file, --num-prompts or --prompt-lens")
    # text prompts need a tokenizer, and there is no model to sample with a temperature
    return workload_requests(workload_spec(args, workload=workload), vocab_size, hash_id_prompts=True, lazy=lazy)
