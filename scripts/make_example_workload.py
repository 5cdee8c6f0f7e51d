"""Writes examples/mooncake.jsonl: a made-up workload in Mooncake's trace format (no line of it
comes from a published trace), shaped as a chat service's: conversations of a few turns, each
turn's prompt the conversation so far (its hash ids those of the turn before, then new ones),
most of them after one of a few shared system prompts, arriving over about a minute. Big enough
that the README's capacity search on it finds a rate the engine cannot keep up with, and that
`--max-requests` and `--length-scale` have something to cut. Fixed seed: the same file each run.

    python scripts/make_example_workload.py [OUT]
"""
import json
import math
import random
import sys
from pathlib import Path

BLOCK = 512                 # tokens per Mooncake hash id
NUM_REQUESTS = 300
RATE = 5.0                  # conversations' turns arrive at about this many per second, Poisson
SYSTEM_PROMPTS = [2, 3, 1]  # hash ids of each shared system prompt
SEED = 0


def main(out: str):
    rng = random.Random(SEED)
    next_hash_id = sum(SYSTEM_PROMPTS)
    systems, first = [], 0
    for n in SYSTEM_PROMPTS:
        systems.append(list(range(first, first + n)))
        first += n
    open_conversations: list[tuple[float, list[int]]] = []    # (when its next turn may come, hash ids so far)
    t_ms, lines = 0.0, []
    for i in range(NUM_REQUESTS):
        t_ms += rng.expovariate(RATE) * 1000 if i else 0.0
        ready = [c for c in open_conversations if c[0] <= t_ms]
        if ready and rng.random() < 0.5:                         # a later turn of a conversation
            conversation = rng.choice(ready)
            open_conversations.remove(conversation)
            history = conversation[1]
        else:
            history = list(rng.choice(systems)) if rng.random() < 0.8 else []
        new_blocks = max(1, round(rng.lognormvariate(math.log(2.5), 0.6)))
        hash_ids = history + list(range(next_hash_id, next_hash_id + new_blocks))
        next_hash_id += new_blocks
        input_length = len(hash_ids) * BLOCK - rng.randrange(BLOCK)   # the last block part filled
        output_length = min(1000, max(8, round(rng.lognormvariate(math.log(180), 0.7))))
        lines.append({"timestamp": round(t_ms), "input_length": input_length, "output_length": output_length,
                      "hash_ids": hash_ids})
        if len(hash_ids) < 24 and rng.random() < 0.7:            # the conversation goes on
            # the answer joins the next prompt, which the user sends after reading it
            open_conversations.append((t_ms + rng.uniform(5_000, 30_000), hash_ids + [next_hash_id]))
            next_hash_id += 1
    Path(out).write_text("".join(json.dumps(line) + "\n" for line in lines))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1] / "examples" / "mooncake.jsonl"))
