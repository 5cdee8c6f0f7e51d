"""Token sampling: greedy at temperature 0, otherwise Gumbel-max.

The noise of a row comes from a generator seeded by (engine seed, seq_id,
num_tokens) alone, so a sequence at a given length samples the same token
whether it runs alone or in any batch, and again after a preemption."""
import struct

import torch
import xxhash


def sample_seed(seed: int, seq_id: int, num_tokens: int) -> int:
    """A 63-bit generator seed from a fixed byte layout (same on every machine)."""
    return xxhash.xxh64_intdigest(struct.pack("<qqq", seed, seq_id, num_tokens)) & ((1 << 63) - 1)


class Sampler:

    def __init__(self, device: torch.device):
        self.generator = torch.Generator(device=device)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, temperatures: list[float], seeds: list[int]) -> torch.Tensor:
        """logits: [num_seqs, vocab]; returns [num_seqs] token ids (int64)."""
        logits = logits.float()
        if not any(t > 0 for t in temperatures):
            return logits.argmax(dim=-1)
        # argmax(logits / T + Gumbel) samples softmax(logits / T) exactly; the
        # Gumbel noise is -log(E) with E ~ Exponential(1). Greedy rows get
        # E = 1 and T = 1, which leaves their argmax alone.
        exp_noise = torch.ones_like(logits)
        for i, (temperature, seed) in enumerate(zip(temperatures, seeds)):
            if temperature > 0:
                exp_noise[i].exponential_(generator=self.generator.manual_seed(seed))
        temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32)
        scaled = logits / temps.to(logits.device, non_blocking=True)[:, None]
        return (scaled - exp_noise.clamp_min_(1e-10).log_()).argmax(dim=-1)
