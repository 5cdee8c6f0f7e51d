"""tracengine's `mixed` policy against vLLM 0.33's real V1 scheduler, step by
step (tracengine/vllm/compare.py): the same workloads through both, a step
agreeing when both schedule the same requests with the same numbers of
tokens. Printed per workload: steps of each, preemptions of each, the share of
steps that agree (over the shorter run) and the first step that does not.

    python benchmarks/bench_mixed_vs_vllm.py
"""
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import vllm.v1.core.sched.scheduler  # noqa: E402,F401

from tracengine.vllm.compare import agreement, run_mixed, run_vllm  # noqa: E402

PREFIX = list(range(1000, 1064))     # 4 blocks of 16, shared


def requests(num: int, shared: bool) -> list[tuple[list[int], int, int]]:
    """(prompt, max_tokens, arrival step): prompts of 40..276 own tokens, 8..64 output tokens, one
    arrival every other step; with `shared`, every prompt starts with the same 64 tokens."""
    out = []
    for i in range(num):
        own = [2000 + i * 7 + j % 5 for j in range(40 + (i * 61) % 237)]
        out.append(((PREFIX if shared else []) + own, 8 + (i * 29) % 57, 2 * i))
    return out


def compare(name: str, mixed_events, vllm_events) -> str:
    a = agreement(mixed_events, vllm_events)
    first = a["first_difference"]
    return (f"| {name} | {a['num_steps'][0]} / {a['num_steps'][1]} | {a['num_preemptions'][0]} / "
            f"{a['num_preemptions'][1]} | {100 * a['agree']:.1f}% | {'-' if first is None else first} |")


WORKLOADS = [
    # name, requests, shared prefix, blocks, budget, max_num_seqs
    ("light, prefix cache", 24, True, 512, 256, 16),
    ("moderate, prefix cache", 24, True, 96, 256, 16),
    ("heavy, preemption", 24, True, 40, 128, 16),
    ("moderate, no shared prefix", 24, False, 96, 256, 16),
    ("heavy, no shared prefix", 24, False, 40, 128, 16),
]


def main() -> None:
    print("| workload | steps mixed / vLLM | preemptions mixed / vLLM | steps that agree | first difference |")
    print("|---|---|---|---|---|")
    for name, num, shared, num_blocks, budget, max_num_seqs in WORKLOADS:
        work = requests(num, shared)
        print(compare(name, run_mixed(work, num_blocks, budget, max_num_seqs),
                      run_vllm(work, num_blocks, budget, max_num_seqs)))
    work = requests(24, True)    # vLLM with prefix caching off; tracengine cannot turn it off
    print(compare("moderate, vLLM's prefix cache off", run_mixed(work, 96, 256, 16),
                  run_vllm(work, 96, 256, 16, prefix_caching=False)))


if __name__ == "__main__":
    main()
