"""Throughput of ngram speculative decoding on the CPU against the same run without drafts.

The embedded tiny model generates, greedy and ignoring EOS, from prompts that repeat themselves
(a line of text said over and over, as in a document being edited or code being refactored),
the workload prompt lookup is for: drafts come from earlier in the request. Each run is the same
`LLM.generate` under `num_speculative_tokens=K` (`speculative_method=ngram`), a fresh engine per
round, the runs alternating for --repeats rounds; each K's median output tokens/s is reported with
its acceptance (`tracengine stats`' spec decode figures), and every run's tokens are checked to be
those of the run without drafts.

    python benchmarks/bench_spec_decode.py [--num-prompts 16] [--max-tokens 128] [--ks 0,2,4] [--repeats 3]

`--write-prompts FILE` writes the prompts as JSONL for `tracengine generate --prompts-file`, to time
whole processes against each other (BENCHMARKS.md).
"""
import argparse
import statistics
import time

LINES = ["the scheduler decides which sequences run at every step of the engine, ",
         "def forward(self, x):\n    return self.proj(self.act(self.norm(x)))\n",
         "SELECT id, name FROM users WHERE id = 1;\n",
         "a prefix cache shares blocks between prompts that start the same way. "]


def prompts(num_prompts: int) -> list[str]:
    return [LINES[i % len(LINES)] * (2 + i % 5) for i in range(num_prompts)]


def run(k: int, args) -> tuple[float, list, object]:
    from tracengine import LLM, SamplingParams
    spec = dict(num_speculative_tokens=k, speculative_method="ngram", prompt_lookup_min=args.lookup_min,
                prompt_lookup_max=args.lookup_max) if k else {}
    llm = LLM("", scheduling_policy="mixed", max_num_seqs=args.num_prompts, **spec)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    try:
        llm.generate(prompts(2), sp, use_tqdm=False)        # warm up
        llm.reset()
        start = time.perf_counter()
        outputs = llm.generate(prompts(args.num_prompts), sp, use_tqdm=False, summary=True)
        seconds = time.perf_counter() - start
        return sum(len(o["token_ids"]) for o in outputs) / seconds, [o["token_ids"] for o in outputs], llm.last_run
    finally:
        llm.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ks", default="0,2,4")
    parser.add_argument("--lookup-min", type=int, default=2)
    parser.add_argument("--lookup-max", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--write-prompts", metavar="FILE", help="write the prompts as JSONL and exit")
    args = parser.parse_args()
    if args.write_prompts:
        import json
        with open(args.write_prompts, "x") as f:
            f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts(args.num_prompts))
        return
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]
    rates, tokens, figures = {k: [] for k in ks}, {}, {}
    for _ in range(args.repeats):
        for k in ks:
            rate, out, summary = run(k, args)
            rates[k].append(rate)
            tokens.setdefault(k, out)
            figures[k] = summary.spec_decoding
            assert out == tokens[ks[0]], f"num_speculative_tokens={k} gave other tokens"
    base = statistics.median(rates[ks[0]])
    print(f"{args.num_prompts} repetitive prompts, {args.max_tokens} tokens each, greedy; medians of {args.repeats}")
    print("| num_speculative_tokens | tok/s | vs K=0 | drafts kept | by position | tokens per verify |")
    print("|---|---|---|---|---|---|")
    for k in ks:
        sd, rate = figures[k], statistics.median(rates[k])
        kept = (f"{sd.acceptance_rate:.1%}", " ".join(f"{r:.0%}" for r in sd.acceptance_rate_per_position),
                f"{sd.mean_acceptance_length:.2f}") if sd else ("-", "-", "1.00")
        print(f"| {k} | {rate:,.0f} | {rate / base:.2f}x | {' | '.join(kept)} |")
    print("the same tokens with and without drafts: yes")


if __name__ == "__main__":
    main()
