"""Workloads for `tracengine generate` (and the other commands that take one):
given prompts, a prompts file, a synthetic benchmark mix, exact token lengths,
a workload file with arrival times, or the built-in default; arrivals at a
request rate for any of them."""
import json
import math
import random
from dataclasses import dataclass
from itertools import chain

from tracengine.errors import TracengineError
from tracengine.engine.config import check_seed
from tracengine.engine.sampling_params import SamplingParams
from tracengine.workload.arrivals import arrival_times, check_rate
from tracengine.engine.request import Request
from tracengine.workload.formats import iter_workload
from tracengine.workload.sessions import has_sessions, set_history_bounds



@dataclass
class WorkloadSpec:
    """Where a run's requests come from and when they arrive: the workload flags, as plain data
    (the command line makes one; nothing here reads a parser). At most one source is given:
    `prompt`, `prompts_file`, `num_prompts` (synthetic, `input_len`/`output_len` ranges),
    `prompt_lens` or `workload` (a file); none is the built-in mix. The sampling fields left
    None keep each source's own."""
    prompt: list[str] | None = None
    prompts_file: str | None = None
    num_prompts: int | None = None
    input_len: str | None = None
    output_len: str | None = None
    prompt_lens: str | None = None
    workload: str | None = None
    workload_format: str | None = None
    max_requests: int | None = None
    time_scale: float = 1.0
    length_scale: float = 1.0
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    max_tokens: int | None = None
    temperature: float | None = None
    ignore_eos: bool | None = None

MAX_ARRIVAL_NS = 1 << 63      # a trace's int64 ns

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
        with open(path, encoding="utf-8-sig") as f:
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


def build_workload(spec: WorkloadSpec, vocab_size: int) -> tuple[list, list[SamplingParams]]:
    """(prompts, sampling params) from the generate arguments."""
    def params(max_tokens, default_ignore_eos=False):
        return SamplingParams(temperature=1.0 if spec.temperature is None else spec.temperature,
                              max_tokens=max_tokens if spec.max_tokens is None else spec.max_tokens,
                              ignore_eos=default_ignore_eos if spec.ignore_eos is None else spec.ignore_eos)

    rng = random.Random(spec.seed)
    if num_sources(spec) > 1:
        raise TracengineError("choose one of --prompt, --prompts-file, --num-prompts, --prompt-lens, --workload")
    if spec.num_prompts is None:
        for flag, value in (("--input-len", spec.input_len), ("--output-len", spec.output_len)):
            if value is not None:
                raise TracengineError(f"{flag} shapes the synthetic workload; give --num-prompts with it")
    if spec.prompt:
        return spec.prompt, [params(64)] * len(spec.prompt)
    if spec.prompts_file:
        prompts = read_prompts_file(spec.prompts_file)
        return prompts, [params(64)] * len(prompts)
    if spec.num_prompts is not None:
        if spec.num_prompts <= 0:
            raise TracengineError(f"--num-prompts must be positive, got {spec.num_prompts}")
        in_low, in_high = parse_range(spec.input_len or "64:256", "--input-len")
        out_low, out_high = parse_range(spec.output_len or "32:128", "--output-len")
        prompts = [[rng.randrange(vocab_size) for _ in range(rng.randint(in_low, in_high))]
                   for _ in range(spec.num_prompts)]
        return prompts, [params(rng.randint(out_low, out_high), True) for _ in prompts]
    if spec.prompt_lens:
        try:
            lengths = [int(n) for n in spec.prompt_lens.split(",")]
        except ValueError:
            raise TracengineError(f"--prompt-lens expects comma-separated integers, got {spec.prompt_lens!r}") from None
        if any(n <= 0 for n in lengths):
            raise TracengineError(f"--prompt-lens expects positive lengths, got {spec.prompt_lens!r}")
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


def num_sources(spec: WorkloadSpec) -> int:
    given = [getattr(spec, name) for name in ("prompt", "prompts_file", "num_prompts", "prompt_lens", "workload")]
    return sum(value is not None and value != [] and value != "" for value in given)


def workload_requests(spec: WorkloadSpec, vocab_size: int, max_model_len: int | None = None,
                      hash_id_prompts: bool = False, lazy: bool = False) -> list[Request]:
    """The requests of a run, with their arrival times, from the workload arguments.
    `hash_id_prompts`: see read_workload (a run with no model). `lazy`: a workload file whose
    own times are the arrivals is read as the run takes its requests (an iterator, in arrival
    order: sim.engine.run_timed); any other source is a list."""
    workload = spec.workload
    time_scale, length_scale = spec.time_scale, spec.length_scale
    rate, burstiness = check_rate(spec.request_rate), spec.burstiness
    check_seed(spec.seed)         # simulate's and bench-serve's too, as generate's engine checks it
    max_requests = spec.max_requests
    if max_requests is not None and max_requests <= 0:
        raise TracengineError(f"--max-requests must be positive, got {max_requests}")
    if burstiness != 1.0 and math.isinf(rate):
        raise TracengineError("--burstiness shapes the gaps of --request-rate; give a rate")
    if workload:
        if num_sources(spec) > 1:
            raise TracengineError("choose one of --prompt, --prompts-file, --num-prompts, --prompt-lens, --workload")
        if time_scale != 1.0 and not math.isinf(rate):
            raise TracengineError("--time-scale scales the file's arrival times; with --request-rate they come "
                                  "from the rate")
        requests = _with_flags(iter_workload(workload, spec.workload_format, vocab_size=vocab_size,
                                             max_requests=max_requests, time_scale=time_scale,
                                             length_scale=length_scale, max_model_len=max_model_len, seed=spec.seed,
                                             hash_id_prompts=hash_id_prompts), spec)
        if lazy and math.isinf(rate):
            first = next(requests, None)     # a sessions file is read whole: its turns wait on each other
            if first is None or not first.session_id:
                return chain([first] if first is not None else [], requests)
            requests = chain([first], requests)
        requests = list(requests)
        if has_sessions(requests):       # the history bounds under the flags' max_tokens
            set_history_bounds(requests)
    else:
        if time_scale != 1.0 or length_scale != 1.0 or spec.workload_format:
            raise TracengineError("--time-scale, --length-scale and --workload-format apply to a --workload file")
        prompts, sps = build_workload(spec, vocab_size)
        requests = [Request(p, sp.max_tokens, 0, sp.temperature, sp.ignore_eos) for p, sp in zip(prompts, sps)]
        requests = requests[:max_requests]
    if not math.isinf(rate):     # the requests' arrivals (a sessions file's: its sessions' first turns')
        starting = [r for r in requests if not r.depends_on]
        for r, t in zip(starting, arrival_times(len(starting), rate, burstiness, spec.seed)):
            r.arrival_ns = round(t * 1e9)
    # a trace records arrivals as 64-bit ns: a later one is refused here, before a run waits for it
    late = next((r for r in requests if r.arrival_ns >= MAX_ARRIVAL_NS), None)
    if late is not None:
        raise TracengineError(f"{late.source or 'a request'} arrives {late.arrival_s:.4g} s into the run, past "
                              f"the {MAX_ARRIVAL_NS / 1e9 / 86400 / 365.25:.0f} years a trace's clock (ns, 64-bit) holds")
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


def workload_config(spec: WorkloadSpec) -> dict:
    """The config fields a workload brings, under the user's own: the built-in mix's small KV
    cache and token budget (when no source is given), and its seed, which seeds sampling too."""
    return {**(DEFAULT_CONFIG if num_sources(spec) == 0 else {}), "seed": spec.seed}


def _with_flags(requests, spec: WorkloadSpec):
    """`requests`, the sampling flags given on the command line winning over the file's."""
    for r in requests:
        if spec.max_tokens is not None:
            r.max_tokens = spec.max_tokens
        if spec.temperature is not None:
            r.temperature = spec.temperature
        if spec.ignore_eos is not None:
            r.ignore_eos = spec.ignore_eos
        yield r
