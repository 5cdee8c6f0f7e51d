from dataclasses import dataclass

from tracengine.errors import ConfigError


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0   # 0 means greedy
    max_tokens: int = 64
    ignore_eos: bool = False
    top_k: int = -1            # sample among the k most likely tokens; -1 (or 0): all
    top_p: float = 1.0         # sample among the most likely tokens whose probabilities sum to top_p
    seed: int | None = None    # the request's own seed (None or -1, as a trace writes it: none); the
                               # same seed gives the same tokens in any run and any batch

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not self.temperature >= 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ConfigError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ConfigError(f"top_k must be -1 (all tokens) or a positive integer, got {self.top_k!r}")
        if self.top_k == 0:
            self.top_k = -1
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed == -1:
            self.seed = None
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 1 << 63):
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
