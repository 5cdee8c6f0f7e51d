"""Token sampling: greedy at temperature 0, otherwise by inverse CDF.

A sampled row draws one uniform number, taken from the bits of its seed,
which comes from (engine seed, seq_id, num_tokens) alone, or from (the
request's own seed, num_tokens) when it has one: a sequence at a given
length samples the same token whether it runs alone or in any batch, and
again after a preemption; a request with a seed samples the same tokens in
any run. One number per row instead of noise over the
vocabulary: no generator per row, and a few batch-wide operations."""
import struct

import torch
import xxhash

# The CDF is searched in two levels: sums of chunks of this many tokens, then
# the tokens of the chosen chunk; no running sum over the whole vocabulary.
CDF_CHUNK = 1024


def sample_seed(seed: int, seq_id: int, num_tokens: int) -> int:
    """A 63-bit row seed from a fixed byte layout (same on every machine)."""
    return xxhash.xxh64_intdigest(struct.pack("<qqq", seed, seq_id, num_tokens)) & ((1 << 63) - 1)


def row_seed(engine_seed: int, seq, offset: int = 0) -> int:
    """The row seed of `seq` at its current length plus `offset` (a verify step samples each draft's
    position as a run without drafts samples it there; seq_id -1 never names a sequence)."""
    if seq.seed is not None:
        return sample_seed(seq.seed, -1, seq.num_tokens + offset)
    return sample_seed(engine_seed, seq.seq_id, seq.num_tokens + offset)


def seed_uniform(seed: int) -> float:
    """A number in [0, 1) from a row seed's top 52 bits: exact in float64."""
    return (seed >> 11) * 2.0 ** -52


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights: [num_seqs, vocab], >= 0, not normalised; u: [num_seqs] float64
    in [0, 1). The first index per row whose running sum of weights passes
    u * total: index i with probability weights[i] / total. Sums in float64."""
    num_seqs, vocab = weights.shape
    num_full, tail = divmod(vocab, CDF_CHUNK)
    sums = [weights[:, :num_full * CDF_CHUNK].view(num_seqs, num_full, CDF_CHUNK).sum(-1, dtype=torch.float64)]
    if tail:
        sums.append(weights[:, num_full * CDF_CHUNK:].sum(-1, keepdim=True, dtype=torch.float64))
    cum = torch.cat(sums, dim=1).cumsum_(dim=1)                                  # [num_seqs, num_chunks]
    target = (u * cum[:, -1])[:, None]
    chunk = torch.searchsorted(cum, target, right=True).clamp_max_(cum.size(1) - 1)
    before = torch.where(chunk > 0, cum.gather(1, (chunk - 1).clamp_min(0)), 0.0)
    cols = chunk * CDF_CHUNK + torch.arange(CDF_CHUNK, device=weights.device)     # [num_seqs, CDF_CHUNK]
    inner = weights.gather(1, cols.clamp_max(vocab - 1)).masked_fill_(cols >= vocab, 0.0)
    inner = inner.cumsum(dim=1, dtype=torch.float64)
    # Rounding can leave the target past the chunk's own sum: then its last token.
    last = (vocab - 1 - chunk * CDF_CHUNK).clamp_max_(CDF_CHUNK - 1)
    offset = torch.minimum(torch.searchsorted(inner, target - before, right=True), last)
    return (chunk * CDF_CHUNK + offset).squeeze(1)


def keep_top_k_top_p(weights: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """Zeroes, in place, the weights outside each row's top k tokens and outside
    the smallest set of most likely tokens whose probabilities reach top_p (the
    most likely token always stays). Ties with the last kept weight stay too."""
    vocab = weights.size(1)
    device = weights.device
    if any(0 < k < vocab for k in top_ks):
        ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks], device=device)
        kth = weights.topk(int(ks.max()), dim=-1).values.gather(1, (ks - 1)[:, None])
        weights.masked_fill_(weights < kth, 0.0)
    if any(p < 1.0 for p in top_ps):
        ps = torch.tensor(top_ps, dtype=torch.float64, device=device)
        ordered = weights.sort(dim=-1, descending=True).values
        cum = ordered.cumsum(dim=-1, dtype=torch.float64)
        # a token stays while the probability of the tokens before it is under top_p
        before = (cum - ordered) / cum[:, -1:]
        num_kept = (before < ps[:, None]).sum(dim=-1).clamp_min_(1)
        last_kept = ordered.gather(1, (num_kept - 1)[:, None])
        weights.masked_fill_(weights < last_kept, 0.0)
    return weights


class Sampler:

    def __init__(self, device: torch.device):
        self.device = device

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, temperatures: list[float], seeds: list[int],
                 top_ks: list[int] | None = None, top_ps: list[float] | None = None) -> torch.Tensor:
        """logits: [num_seqs, vocab]; returns [num_seqs] token ids (int64).
        `top_ks`/`top_ps` (None: no row filters) narrow each sampled row's choice."""
        logits = logits.float()
        if not any(t > 0 for t in temperatures):
            return logits.argmax(dim=-1)
        device = logits.device
        temps = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32, device=device)
        u = torch.tensor([seed_uniform(s) for s in seeds], dtype=torch.float64, device=device)
        # softmax(logits / T) up to its normaliser, which inverse_cdf divides out.
        scaled = logits / temps[:, None]
        weights = scaled.sub_(scaled.amax(dim=-1, keepdim=True)).exp_()
        if top_ks is not None and top_ps is not None:
            keep_top_k_top_p(weights, top_ks, top_ps)
        drawn = inverse_cdf(weights, u)
        if all(t > 0 for t in temperatures):
            return drawn
        greedy = torch.tensor([t <= 0 for t in temperatures], device=device)
        return torch.where(greedy, logits.argmax(dim=-1), drawn)
