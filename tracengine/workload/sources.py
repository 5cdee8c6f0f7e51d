"""Workloads for `tracengine generate` (and the other commands that take one):
given prompts, a prompts file, a synthetic benchmark mix, exact token lengths,
a workload file with arrival times, or the built-in default; arrivals at a
request rate for any of them."""
import json
import math
import random

from tracengine.errors import TracengineError
from tracengine.engine.sampling_params import SamplingParams
from tracengine.workload.arrivals import arrival_times, check_rate
from tracengine.workload.formats import FORMATS, Request, read_workload

CONFIG_FLAGS = ("max_num_seqs", "max_num_batched_tokens", "num_kvcache_blocks", "kvcache_block_size",
                "max_model_len", "gpu_memory_utilization", "tensor_parallel_size", "device", "dtype",
                "enforce_eager", "scheduling_policy")

# The built-in run: a small KV cache and token budget, so that a minute on the
# CPU shows chunked prefill, head-of-line blocking, preemption and prefix hits.
DEFAULT_CONFIG = dict(kvcache_block_size=16, num_kvcache_blocks=48, max_num_batched_tokens=256, max_num_seqs=8)

SYSTEM_PROMPT = ("You are a careful assistant for people who build inference engines. Answer briefly, "
                 "name the trade-off, and say what you would measure before changing anything. ")
QUESTIONS = [
    "Why does a request wait in the queue even when the batch has room?",
    "What does chunked prefill change for a long prompt?",
    "When is preemption by recomputation cheaper than swapping?",
    "How does a prefix cache decide that two prompts share a block?",
    "What is head-of-line blocking in a first-come-first-served scheduler?",
    "Why are prefill and decode steps kept apart in this engine?",
    "What limits the number of sequences in one decode step?",
    "How would you choose the size of a KV cache block?",
    "What does time to first token measure, and what hides inside it?",
    "Why should a trace of scheduling decisions replay deterministically?",
    "What happens to the blocks of a sequence that finishes?",
    "How does a token budget interact with long and short prompts?",
]
LONG_DOCUMENT = ("A scheduler decides, at every step, which sequences run and how many tokens each of them "
                 "computes. The waiting queue holds new requests, chunks that are not finished and sequences "
                 "that were preempted; the running queue holds those that decode one token at a time. ") * 3


def parse_range(text: str, name: str) -> tuple[int, int]:
    try:
        low, _, high = text.partition(":")
        low, high = int(low), int(high or low)
    except ValueError:
        raise TracengineError(f"{name} expects MIN:MAX, got {text!r}") from None
    if not 0 < low <= high:
        raise TracengineError(f"{name} expects 0 < MIN <= MAX, got {text!r}")
    return low, high


def read_prompts_file(path: str) -> list:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as exc:
        raise TracengineError(f"{path}: not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x})") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if "\0" in line:
            raise TracengineError(f"{path}:{number}: a NUL byte; a prompts file is text")
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TracengineError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if "prompt" not in record:
                raise TracengineError(f"{path}:{number}: a JSONL line needs a 'prompt' field")
            prompt = record["prompt"]
            if not (isinstance(prompt, str) and prompt or isinstance(prompt, list) and prompt
                    and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
                raise TracengineError(f"{path}:{number}: 'prompt' must be a non-empty string or list of "
                                      f"token ids, got {json.dumps(prompt)[:40]}")
            prompts.append(prompt)
        else:
            prompts.append(line)
    if not prompts:
        raise TracengineError(f"{path}: no prompts")
    return prompts


def build_workload(args, vocab_size: int) -> tuple[list, list[SamplingParams]]:
    """(prompts, sampling params) from the generate arguments."""
    def params(max_tokens, default_ignore_eos=False):
        return SamplingParams(temperature=1.0 if args.temperature is None else args.temperature,
                              max_tokens=max_tokens if args.max_tokens is None else args.max_tokens,
                              ignore_eos=default_ignore_eos if args.ignore_eos is None else args.ignore_eos)

    rng = random.Random(args.seed)
    if num_sources(args) > 1:
        raise TracengineError("choose one of --prompt, --prompts-file, --num-prompts, --prompt-lens, --workload")
    if args.num_prompts is None:
        for flag, value in (("--input-len", args.input_len), ("--output-len", args.output_len)):
            if value is not None:
                raise TracengineError(f"{flag} shapes the synthetic workload; give --num-prompts with it")
    if args.prompt:
        return args.prompt, [params(64)] * len(args.prompt)
    if args.prompts_file:
        prompts = read_prompts_file(args.prompts_file)
        return prompts, [params(64)] * len(prompts)
    if args.num_prompts is not None:
        if args.num_prompts <= 0:
            raise TracengineError(f"--num-prompts must be positive, got {args.num_prompts}")
        in_low, in_high = parse_range(args.input_len or "64:256", "--input-len")
        out_low, out_high = parse_range(args.output_len or "32:128", "--output-len")
        prompts = [[rng.randrange(vocab_size) for _ in range(rng.randint(in_low, in_high))]
                   for _ in range(args.num_prompts)]
        return prompts, [params(rng.randint(out_low, out_high), True) for _ in prompts]
    if args.prompt_lens:
        try:
            lengths = [int(n) for n in args.prompt_lens.split(",")]
        except ValueError:
            raise TracengineError(f"--prompt-lens expects comma-separated integers, got {args.prompt_lens!r}") from None
        if any(n <= 0 for n in lengths):
            raise TracengineError(f"--prompt-lens expects positive lengths, got {args.prompt_lens!r}")
        prompts = [[rng.randrange(vocab_size) for _ in range(n)] for n in lengths]
        return prompts, [params(16)] * len(prompts)
    return default_workload(rng, params)


def default_workload(rng, params):
    prompts, sps = [], []
    for i, question in enumerate(QUESTIONS):
        prompts.append(SYSTEM_PROMPT + question)           # a shared prefix: cache hits
        sps.append(params(rng.randint(24, 96), True))
        if i in (2, 7):                                     # long prompts: chunked prefill, blocking
            prompts.append(LONG_DOCUMENT + question)
            sps.append(params(rng.randint(24, 48), True))
    return prompts, sps


def num_sources(args) -> int:
    given = [getattr(args, name, None) for name in ("prompt", "prompts_file", "num_prompts", "prompt_lens", "workload")]
    return sum(value is not None and value != [] and value != "" for value in given)


def add_workload_arguments(group):
    """The flags of a workload file and of arrivals (generate and the other commands that run one)."""
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


def workload_requests(args, vocab_size: int, max_model_len: int | None = None) -> list[Request]:
    """The requests of a run, with their arrival times, from the workload arguments."""
    workload = getattr(args, "workload", None)
    time_scale, length_scale = getattr(args, "time_scale", 1.0), getattr(args, "length_scale", 1.0)
    rate, burstiness = check_rate(getattr(args, "request_rate", math.inf)), getattr(args, "burstiness", 1.0)
    max_requests = getattr(args, "max_requests", None)
    if max_requests is not None and max_requests <= 0:
        raise TracengineError(f"--max-requests must be positive, got {max_requests}")
    if burstiness != 1.0 and math.isinf(rate):
        raise TracengineError("--burstiness shapes the gaps of --request-rate; give a rate")
    if workload:
        if num_sources(args) > 1:
            raise TracengineError("choose one of --prompt, --prompts-file, --num-prompts, --prompt-lens, --workload")
        if time_scale != 1.0 and not math.isinf(rate):
            raise TracengineError("--time-scale scales the file's arrival times; with --request-rate they come "
                                  "from the rate")
        requests = read_workload(workload, getattr(args, "workload_format", None), vocab_size=vocab_size,
                                 max_requests=max_requests, time_scale=time_scale, length_scale=length_scale,
                                 max_model_len=max_model_len, seed=getattr(args, "seed", 0))
        max_tokens, temperature = getattr(args, "max_tokens", None), getattr(args, "temperature", None)
        ignore_eos = getattr(args, "ignore_eos", None)
        for r in requests:       # flags given on the command line win over the file
            if max_tokens is not None:
                r.max_tokens = max_tokens
            if temperature is not None:
                r.temperature = temperature
            if ignore_eos is not None:
                r.ignore_eos = ignore_eos
    else:
        if time_scale != 1.0 or length_scale != 1.0 or getattr(args, "workload_format", None):
            raise TracengineError("--time-scale, --length-scale and --workload-format apply to a --workload file")
        prompts, sps = build_workload(args, vocab_size)
        requests = [Request(p, sp.max_tokens, 0.0, sp.temperature, sp.ignore_eos) for p, sp in zip(prompts, sps)]
        requests = requests[:max_requests]
    if not math.isinf(rate):
        for r, t in zip(requests, arrival_times(len(requests), rate, burstiness, getattr(args, "seed", 0))):
            r.arrival_s = t
    return requests


def sampling_params(request: Request) -> SamplingParams:
    """The engine's sampling parameters of a workload request."""
    known = SamplingParams.__dataclass_fields__
    values = dict(temperature=request.temperature, max_tokens=request.max_tokens, ignore_eos=request.ignore_eos)
    for name, unset in (("top_k", -1), ("top_p", 1.0), ("seed", -1)):
        value = getattr(request, name)
        if name in known:
            values[name] = value
        elif value != unset:
            raise TracengineError(f"{request.source or 'a request'}: {name} is not supported by the engine's sampler")
    return SamplingParams(**values)


def config_overrides(args) -> dict:
    values = {name: getattr(args, name) for name in CONFIG_FLAGS if getattr(args, name, None) is not None}
    builtin = num_sources(args) == 0
    if builtin:
        values = {**DEFAULT_CONFIG, **values}
    values["seed"] = args.seed
    return values
