"""Fidelity of the time-aware what-if against real runs.

The real engine (the embedded tiny model on the CPU) serves one Poisson
workload twice, recorded: under config A and under config B (by default 48
and 24 KV blocks of 16 tokens). The what-if A -> B in simulated time, with
the step-time model calibrated on A's own trace, is compared with B as
recorded: TTFT p50 and p90, end-to-end p50, total duration and preemptions,
each as a relative error. The self-check is A in simulated time against A
recorded. The noise floor is A recorded a second time against A: how far the
real engine on this machine is from itself, which no model can beat.
Repeated, since this machine is noisy: each figure's median over the repeats,
and the figures of all the repeats' requests pooled (TTFT and end-to-end
percentiles over every request of every repeat, durations and preemptions
summed), which a slow spell in one recording moves less.

    python benchmarks/bench_fidelity.py [--repeats 3] [--requests 40] [--rate 8]
        [--a num_kvcache_blocks=48] [--b num_kvcache_blocks=24] [--traces DIR]

With --traces DIR the recorded runs are kept there, and a run already there is
read instead of recorded again: the step-time model can then be compared on
the same recordings, which this noisy machine would not give twice."""
import argparse
import os
import random
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tracengine.analysis.figures import percentile                             # noqa: E402
from tracengine.analysis.stats import request_figures, stats                  # noqa: E402
from tracengine.analysis.timeline import load                 # noqa: E402
from tracengine.engine.config import parse_override          # noqa: E402
from tracengine.engine.sampling_params import SamplingParams  # noqa: E402
from tracengine.replay.timed import timed_whatif  # noqa: E402
from tracengine.trace.tracelog import TraceReader             # noqa: E402
from tracengine.workload.arrivals import arrival_times       # noqa: E402

BASE = dict(kvcache_block_size=16, max_num_batched_tokens=256, max_num_seqs=8)
FIGURES = [("TTFT p50", ("latency", "ttft", "seconds", "p50")), ("TTFT p90", ("latency", "ttft", "seconds", "p90")),
           ("e2e p50", ("latency", "e2e", "seconds", "p50")), ("duration", ("steps", "total_s")),
           ("preemptions", ("preemption", "num_preemptions"))]


def pick(s, keys):
    for key in keys:
        s = s[key]
    return s


def workload(seed: int, n: int, vocab_size: int):
    """Prompts of 32-264 tokens, a third sharing a 64-token prefix, outputs of 16-96 tokens."""
    rng = random.Random(seed)
    prefix = [rng.randrange(vocab_size) for _ in range(64)]
    prompts, sps = [], []
    for _ in range(n):
        tail = [rng.randrange(vocab_size) for _ in range(rng.randint(32, 200))]
        prompts.append((prefix if rng.random() < 1 / 3 else []) + tail)
        sps.append(SamplingParams(temperature=1.0, max_tokens=rng.randint(16, 96), ignore_eos=True))
    return prompts, sps


def record(path, overrides, prompts, sps, arrivals, seed):
    from tracengine.engine.llm import LLM
    with LLM("", **{**BASE, "seed": seed, **overrides}) as llm:
        llm.generate(prompts, sps, record=path, use_tqdm=False, arrival_ns=[round(t * 1e9) for t in arrivals])


class Pool:
    """One run's requests and totals, over every repeat."""

    def __init__(self):
        self.ttft, self.e2e, self.duration, self.preemptions = [], [], 0.0, 0

    def add(self, trace):
        t = load(trace)
        figures = [request_figures(t, req) for req in t.requests.values()]
        self.ttft += [f["ttft_s"] for f in figures if f["ttft_s"] is not None]
        self.e2e += [f["e2e_s"] for f in figures if f["e2e_s"] is not None]
        s = stats(t)
        self.duration += s["steps"]["total_s"]
        self.preemptions += s["preemption"]["num_preemptions"]

    def figures(self) -> dict:
        ttft, e2e = sorted(self.ttft), sorted(self.e2e)
        return {"TTFT p50": percentile(ttft, 50), "TTFT p90": percentile(ttft, 90), "e2e p50": percentile(e2e, 50),
                "duration": self.duration, "preemptions": self.preemptions}


def rel(a, b):
    if b == 0:
        return 0.0 if a == 0 else float("inf")
    return (a - b) / b


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second (Poisson)")
    parser.add_argument("--a", action="append", default=None, metavar="NAME=VALUE")
    parser.add_argument("--b", action="append", default=None, metavar="NAME=VALUE")
    parser.add_argument("--traces", metavar="DIR", help="keep the recorded runs here; reuse those already there")
    args = parser.parse_args()
    a = dict(parse_override(t) for t in (args.a or ["num_kvcache_blocks=48"]))
    b = dict(parse_override(t) for t in (args.b or ["num_kvcache_blocks=24"]))
    from tracengine.model.loader import load_hf_config, resolve_model_dir
    vocab_size = load_hf_config(resolve_model_dir("")).vocab_size
    errors = {label: {name: [] for name, _ in FIGURES}
              for label in ("what-if A->B vs B", "self-check A vs A", "noise floor: A again vs A")}
    pools = {name: Pool() for name in ("A", "B", "A again", "self-check", "what-if")}
    with tempfile.TemporaryDirectory() as tmp:
        if args.traces:
            os.makedirs(args.traces, exist_ok=True)
        where = args.traces or tmp
        tag = "-".join(f"{k}={v}" for k, v in sorted({**a, **{f"b.{k}": v for k, v in b.items()}}.items()))
        tag += f"-n{args.requests}-r{args.rate:g}"
        for r in range(args.repeats):
            prompts, sps = workload(r, args.requests, vocab_size)
            arrivals = arrival_times(args.requests, args.rate, 1.0, seed=r)
            path_a = os.path.join(where, f"{tag}-a{r}.trace")
            path_b = os.path.join(where, f"{tag}-b{r}.trace")
            path_again = os.path.join(where, f"{tag}-a{r}-again.trace")
            for path, overrides in ((path_a, a), (path_b, b), (path_again, a)):
                if not os.path.exists(path):
                    record(path, overrides, prompts, sps, arrivals, r)
            with TraceReader(path_a) as reader:
                result = timed_whatif(reader.events(), b, None, os.path.basename(path_a))
            s_a, s_b, s_again = stats(path_a), stats(path_b), stats(path_again)
            s_self, s_new = stats(result.self_check), stats(result.new)
            for name, trace in (("A", path_a), ("B", path_b), ("A again", path_again),
                                ("self-check", result.self_check), ("what-if", result.new)):
                pools[name].add(trace)
            held = result.step_time.error["held_out"]["total"]
            print(f"repeat {r}: A {s_a['steps']['num_steps']} steps {s_a['steps']['total_s']:.2f} s "
                  f"{s_a['preemption']['num_preemptions']} preemptions; B {s_b['steps']['num_steps']} steps "
                  f"{s_b['steps']['total_s']:.2f} s {s_b['preemption']['num_preemptions']} preemptions; "
                  f"what-if B {s_new['steps']['num_steps']} steps {s_new['steps']['total_s']:.2f} s "
                  f"{s_new['preemption']['num_preemptions']} preemptions; step model held-out median error "
                  f"{held['median_rel']:.1%}, total {held['total_rel']:+.1%}")
            for name, keys in FIGURES:
                errors["what-if A->B vs B"][name].append(rel(pick(s_new, keys), pick(s_b, keys)))
                errors["self-check A vs A"][name].append(rel(pick(s_self, keys), pick(s_a, keys)))
                errors["noise floor: A again vs A"][name].append(rel(pick(s_again, keys), pick(s_a, keys)))
    print(f"\nrelative error, median over {args.repeats} repeats (each repeat's value in brackets); "
          f"A = {a}, B = {b}, {args.requests} requests at {args.rate:g}/s")
    for label, table in errors.items():
        print(f"{label}:")
        for name, values in table.items():
            print(f"  {name:<12} {statistics.median(values):+7.1%}   [{', '.join(f'{v:+.1%}' for v in values)}]")
    print(f"\nrelative error of the figures pooled over the {args.repeats} repeats "
          f"({len(pools['A'].ttft)} requests a run):")
    fig = {name: pool.figures() for name, pool in pools.items()}
    print(f"  {'':<12} {'what-if vs B':>13} {'self-check':>11} {'noise floor':>12}")
    for name, _ in FIGURES:
        print(f"  {name:<12} {rel(fig['what-if'][name], fig['B'][name]):+13.1%} "
              f"{rel(fig['self-check'][name], fig['A'][name]):+11.1%} {rel(fig['A again'][name], fig['A'][name]):+12.1%}")


if __name__ == "__main__":
    main()
