"""Runners without a model, for replay, what-if and tests. They answer
`run(seqs, is_prefill)` like the model runner, from a script instead of
logits."""
import xxhash


class SyntheticRunner:
    """A stand-in model: each token is a hash of (seed, seq_id, position), so
    like the real model it does not depend on batching, chunking or preemption.
    `eos_at` maps a seq_id to the completion index at which it emits `eos`."""

    def __init__(self, vocab_size: int = 1000, seed: int = 0, eos: int = -1, eos_at: dict[int, int] | None = None):
        self.vocab_size = vocab_size
        self.seed = seed
        self.eos = eos
        self.eos_at = eos_at or {}

    def token_for(self, seq) -> int:
        position = seq.num_cached_tokens + seq.num_scheduled_tokens
        if position == seq.num_tokens and self.eos_at.get(seq.seq_id) == seq.num_completion_tokens:
            return self.eos
        h = xxhash.xxh64_intdigest(f"{self.seed}:{seq.seq_id}:{position}".encode())
        token = h % self.vocab_size
        return token if token != self.eos else (token + 1) % self.vocab_size

    def run(self, seqs, is_prefill: bool) -> list[int]:
        return [self.token_for(seq) for seq in seqs]

    def exit(self):
        pass
