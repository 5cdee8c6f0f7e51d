from dataclasses import dataclass

from tracengine.errors import ConfigError


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0   # 0 means greedy
    max_tokens: int = 64
    ignore_eos: bool = False

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ConfigError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
