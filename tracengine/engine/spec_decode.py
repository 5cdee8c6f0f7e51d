"""Speculative decoding, as vLLM 0.33 does it: what drafts a request gets after a step, and
which of them its next step keeps.

- Drafts are proposed after a step for each request that sampled a token in it and goes on
  (vLLM's `propose_draft_token_ids`, then `update_draft_token_ids`, which drops drafts of a
  request still in prefill); its next step schedules them as tokens (engine/scheduler.py) and
  the runner computes the model's token after each prefix in one forward pass.
- `ngram`: vLLM's NgramProposer (vllm/v1/spec_decode/ngram_proposer.py): the longest n-gram of
  prompt_lookup_min..prompt_lookup_max tokens that ends the request's tokens and occurs earlier
  in them (the earliest such occurrence), and the tokens that followed it there.
- `synthetic`: a draft model whose drafts are the target's own tokens, kept by vLLM's synthetic
  rejection rule (vllm/v1/sample/rejection_sampler.py, `SYNTHETIC_MODE`): draft position i is kept
  when a uniform draw is below its conditional rate c_i = p_i / p_(i-1) (p: the unconditional
  rates, utils.unconditional_to_conditional_rates) and every draft before it was kept. The draws
  are a hash of (seed, seq_id, position), so a run is reproducible and a what-if that drafts
  fewer sees the same draws at the same positions.
- A request never drafts past its max_tokens or max_model_len: at most `max_tokens - 1` minus
  its completion tokens (one token comes from the step itself) and `max_model_len - 1` minus its
  tokens (vLLM's scheduler keeps the computed tokens below max_model_len).
- Verification (`kept_tokens`): the drafts that agree with the model's tokens, each draft i
  against the model's token after drafts 0..i-1, then the model's next token: at temperature 0
  exactly the tokens of a run without drafts. A target sampled at temperature > 0 is kept on the
  same rule, which is vLLM's rejection sampling for a draft that is one token with probability 1
  (kept with the target's probability of it; otherwise the target's distribution without it).

No torch: the core, the simulator and the what-if import it."""
from array import array

import xxhash

from tracengine.engine.config import Config, acceptance_rates
from tracengine.engine.sequence import Sequence

SYNTHETIC_DRAFT = -1     # a synthetic draft's token id: the target's own token, whatever it is
# A placeholder draft, never kept: vLLM's scheduler pads a request it admits with one token left
# to the 1 + K tokens of a verify step (engine/policies.py), with drafts its rejection sampler refuses
PADDING_DRAFT = -2


def conditional_rates(rates: list[float]) -> list[float]:
    """vLLM's unconditional_to_conditional_rates: c_i = p_i / p_(i-1), 0 after a rate of 0."""
    return [p / q if q > 0.0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]])]


def synthetic_num_accepted(seed: int, seq_key: int, num_tokens: int, rates: list[float], num_drafts: int) -> int:
    """vLLM's synthetic rejection rule, seeded: of `num_drafts` drafts of a sequence (`seq_key`) of
    `num_tokens` tokens, the leading ones kept; draft i (at position num_tokens + i) is kept when a
    uniform draw, a hash of (seed, seq_key, its position), is below its conditional rate rates[i].
    The one definition: tracengine's engine and vLLM's scheduler in simulated time (vllm/synthetic.py)."""
    prefix = b"%d:%d:" % (seed, seq_key)
    for i in range(num_drafts):
        if xxhash.xxh64_intdigest(prefix + b"%d" % (num_tokens + i)) / 2.0 ** 64 >= rates[i]:
            return i
    return num_drafts


def max_num_drafts(seq: Sequence, k: int, max_model_len: int) -> int:
    """The drafts `seq` may be given after this step: k, or fewer near its max_tokens or max_model_len."""
    return max(0, min(k, seq.max_tokens - seq.num_completion_tokens - 1, max_model_len - seq.num_tokens - 1))


def ngram_drafts(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM's _find_longest_matched_ngram_and_propose_tokens: the tokens (at most k) after the
    earliest occurrence of the longest n-gram (min_n <= n <= max_n) that is a suffix of `tokens`
    and occurs before it (ending before the last token); none when there is none. vLLM scans the
    reversed tokens with KMP in numba; the same answer here is a search of the suffix in the
    tokens' bytes, longest n first (C's search, not a Python loop over a long prompt)."""
    total = len(tokens)
    if total < min_n or k <= 0:
        return []
    data = array("q", tokens).tobytes()
    limit = (total - 1) * 8       # an occurrence ends before the last token
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = data[(total - n) * 8:]
        position = data.find(suffix, 0, limit)
        while position != -1 and position % 8:          # only whole tokens
            position = data.find(suffix, position + 1, limit)
        if position != -1:
            start = position // 8 + n
            return tokens[start:start + k]
    return []


class SpecDecoding:
    """A config's speculative decoding: `propose` the drafts of a sequence after its step, and
    `kept_tokens` of a step that verified them."""

    def __init__(self, config: Config):
        self.k = config.num_speculative_tokens
        self.method = config.speculative_method
        self.max_model_len = config.max_model_len
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max
        self.seed = config.seed
        self.rates = conditional_rates(acceptance_rates(config)) if self.method == "synthetic" else []

    def propose(self, seq: Sequence) -> list[int]:
        n = max_num_drafts(seq, self.k, self.max_model_len)
        if not n:
            return []
        if self.method == "synthetic":
            return [SYNTHETIC_DRAFT] * n
        if not seq.has_tokens:          # a prompt known by its hash ids: only its completion is known
            return ngram_drafts(seq.completion, self.min_n, self.max_n, n)
        return ngram_drafts(seq.token_ids, self.min_n, self.max_n, n)

    def num_accepted(self, seq: Sequence, targets: list[int]) -> int:
        """How many of seq's scheduled drafts (`seq.spec_token_ids`) the step keeps, given the
        model's token at each of its positions (`targets`, one more than the drafts)."""
        drafts = seq.spec_token_ids
        if self.method == "synthetic":      # placeholders (all of a padded step's) are never kept
            num_drafts = 0 if drafts and drafts[0] == PADDING_DRAFT else len(drafts)
            return synthetic_num_accepted(self.seed, seq.seq_id, seq.num_tokens, self.rates, num_drafts)
        for i, draft in enumerate(drafts):
            if draft != targets[i]:
                return i
        return len(drafts)

    def kept_tokens(self, seq: Sequence, targets: list[int]) -> list[int]:
        """The tokens a verify step appends: the kept drafts, then the model's next token (the
        synthetic method's drafts are the target's tokens, so those are the targets too)."""
        return targets[:self.num_accepted(seq, targets) + 1]


def spec_decoding(config: Config) -> SpecDecoding | None:
    """The config's speculative decoding; None when it drafts nothing."""
    return SpecDecoding(config) if config.num_speculative_tokens else None
