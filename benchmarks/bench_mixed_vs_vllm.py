"""tracengine's `mixed` policy against vLLM 0.33's real V1 scheduler, step by
step (tracengine/vllm/compare.py): the same workloads through both, a step
agreeing when both schedule the same requests with the same numbers of
tokens, and its block events agreeing when both allocate, append and free the
same blocks (vLLM's ids less one: its block 0 is the null block). `mixed` runs
twice, under nano-vllm's block rules (`block_rules=nano-vllm`, the rules it had
before vLLM's) and under vLLM's (the default); the row with vLLM's prefix cache
off has it off in `mixed` too, except under nano-vllm's rules (which could not
turn it off). Printed per workload: steps of each, preemptions of each, the
share of steps that agree and of steps whose block events agree (over the
shorter run), before -> after, and the first step that differs after.

    python benchmarks/bench_mixed_vs_vllm.py [--random 150]

`--random N` also runs N seeded random workloads (shared prefixes, twin prompts,
2-16 sequences, budgets of 32-256, from just enough blocks to 30 more, prefix
caching on in 80%) and prints how many agree on every step and block event.

`--spec K,...` then runs the workloads with ngram speculative decoding of K drafts (both
schedulers given the same drafts and the same model tokens, compare.run_vllm_spec) and prints,
per workload, steps, preemptions, drafts kept of those verified, and the share of steps and of
block events that agree; with `--random N`, N random workloads with budgets of 16-64 too.
"""
import argparse
import random
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import vllm.v1.core.sched.scheduler  # noqa: E402,F401

from tracengine.vllm.compare import agreement, run_mixed, run_mixed_spec, run_vllm, run_vllm_spec  # noqa: E402
from tracengine.trace.events import DraftVerified  # noqa: E402

PREFIX = list(range(1000, 1064))     # 4 blocks of 16, shared


def requests(num: int, shared: bool, twins: bool = False) -> list[tuple[list[int], int, int]]:
    """(prompt, max_tokens, arrival step): prompts of 40..276 own tokens, 8..64 output tokens, one
    arrival every other step; with `shared`, every prompt starts with the same 64 tokens; with
    `twins`, each prompt arrives twice in its step (two blocks come to hold one hash)."""
    out = []
    for i in range(num):
        own = [2000 + i * 7 + j % 5 for j in range(40 + (i * 61) % 237)]
        out += [((PREFIX if shared else []) + own, 8 + (i * 29) % 57, 2 * i)] * (2 if twins else 1)
    return out


def percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def compare(name: str, before, after, vllm_events) -> str:
    a, b = agreement(before, vllm_events), agreement(after, vllm_events)
    first = b["first_difference"] if b["first_difference"] is not None else b["first_block_difference"]
    return (f"| {name} | {b['num_steps'][0]} / {b['num_steps'][1]} | {b['num_preemptions'][0]} / "
            f"{b['num_preemptions'][1]} | {percent(a['agree'])} -> {percent(b['agree'])} | "
            f"{percent(a['agree_blocks'])} -> {percent(b['agree_blocks'])} | {'-' if first is None else first} |")


WORKLOADS = [
    # name, requests, shared prefix, twins, blocks, budget, max_num_seqs, vLLM's prefix caching
    ("light, prefix cache", 24, True, False, 512, 256, 16, True),
    ("moderate, prefix cache", 24, True, False, 96, 256, 16, True),
    ("heavy, preemption", 24, True, False, 40, 128, 16, True),
    ("moderate, no shared prefix", 24, False, False, 96, 256, 16, True),
    ("heavy, no shared prefix", 24, False, False, 40, 128, 16, True),
    ("moderate, twin prompts", 12, True, True, 96, 256, 16, True),
    ("moderate, prefix cache off", 24, True, False, 96, 256, 16, False),
]


def random_workload(seed: int):
    """(work, num_blocks, budget, max_num_seqs, prefix_caching) of seed `seed`. A long first
    request keeps the engine busy: an idle vLLM engine core runs one empty step more."""
    rng = random.Random(seed)
    prefixes = [[rng.randint(0, 50) for _ in range(rng.choice([16, 20, 32, 48]))] for _ in range(3)]
    work, step = [], 0
    for _ in range(rng.randint(4, 20)):
        prompt = rng.choice(prefixes + [[]]) + [rng.randint(0, 50) for _ in range(rng.randint(1, 120))]
        work.append((prompt, rng.randint(1, 40), step))
        if rng.random() < 0.3:
            work.append((list(prompt), rng.randint(1, 40), step))
        step += rng.randint(0, 2)
    work.insert(0, ([7] * 5, step + 60, 0))
    most = max(-(-(len(prompt) + max_tokens) // 16) for prompt, max_tokens, _ in work)
    return (work, most + 1 + rng.randint(0, 30), rng.choice([32, 64, 128, 256]), rng.randint(2, 16),
            rng.random() < 0.8)


def spec_workload(seed: int):
    """random_workload(seed) with a budget of 16-64 tokens (max_num_seqs at most that), which cuts
    drafts; prefix caching on (admissions with one token left to compute: vLLM pads them)."""
    work, num_blocks, _, max_num_seqs, _ = random_workload(seed)
    budget = random.Random(seed).choice([16, 24, 32, 64])
    return work, num_blocks, budget, min(max_num_seqs, budget), True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--random", type=int, default=0, metavar="N", help="also N seeded random workloads")
    parser.add_argument("--spec", default="", metavar="K,...", help="also with K ngram drafts a step")
    args = parser.parse_args()
    print("| workload | steps mixed / vLLM | preemptions mixed / vLLM | steps that agree | "
          "block events that agree | first difference |")
    print("|---|---|---|---|---|---|")
    for name, num, shared, twins, num_blocks, budget, max_num_seqs, caching in WORKLOADS:
        work = requests(num, shared, twins)
        before = run_mixed(work, num_blocks, budget, max_num_seqs, block_rules="nano-vllm")
        after = run_mixed(work, num_blocks, budget, max_num_seqs, prefix_caching=caching)
        print(compare(name, before, after, run_vllm(work, num_blocks, budget, max_num_seqs, prefix_caching=caching)))
    if args.random:
        num_agree = num_preempting = 0
        for seed in range(args.random):
            work, num_blocks, budget, max_num_seqs, caching = random_workload(seed)
            a = agreement(run_mixed(work, num_blocks, budget, max_num_seqs, prefix_caching=caching),
                          run_vllm(work, num_blocks, budget, max_num_seqs, prefix_caching=caching))
            num_agree += a["agree"] == a["agree_blocks"] == 1.0 and a["num_steps"][0] + 1 == a["num_steps"][1]
            num_preempting += a["num_preemptions"][1] > 0
        print(f"random workloads: {num_agree} of {args.random} agree on every step and block event "
              f"({num_preempting} of them preempt)")
    if args.spec:
        print("\n| workload | drafts | steps mixed / vLLM | preemptions mixed / vLLM | drafts kept | "
              "steps that agree | block events that agree |")
        print("|---|---|---|---|---|---|---|")
        for k in (int(k) for k in args.spec.split(",")):
            for name, num, shared, twins, num_blocks, budget, max_num_seqs, caching in WORKLOADS:
                if not caching:
                    continue
                work = requests(num, shared, twins)
                mixed = run_mixed_spec(work, num_blocks, budget, max_num_seqs, k)
                a = agreement(mixed, run_vllm_spec(work, num_blocks, budget, max_num_seqs, k, mixed))
                verified = [e for e in mixed if type(e) is DraftVerified]
                print(f"| {name} | {k} | {a['num_steps'][0]} / {a['num_steps'][1]} | {a['num_preemptions'][0]} / "
                      f"{a['num_preemptions'][1]} | {sum(e.num_accepted_tokens for e in verified)} / "
                      f"{sum(e.num_draft_tokens for e in verified)} | {percent(a['agree'])} | "
                      f"{percent(a['agree_blocks'])} |")
            if args.random:
                num_agree = 0
                for seed in range(args.random):
                    work, num_blocks, budget, max_num_seqs, _ = spec_workload(seed)
                    mixed = run_mixed_spec(work, num_blocks, budget, max_num_seqs, k)
                    a = agreement(mixed, run_vllm_spec(work, num_blocks, budget, max_num_seqs, k, mixed))
                    num_agree += a["agree"] == a["agree_blocks"] == 1.0 and a["num_steps"][0] + 1 == a["num_steps"][1]
                print(f"| random workloads, budgets of 16-64 | {k} | | | | {num_agree} of {args.random} agree "
                      f"on every step and block event | |")


if __name__ == "__main__":
    main()
