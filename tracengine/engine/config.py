"""Engine configuration: flat data, so a trace header carries every field
and `replay --set` can override any of them."""
from dataclasses import dataclass, field, fields

from tracengine.errors import ConfigError

BUILTIN_POLICY_NAMES = ("prefill_first", "mixed")
BLOCK_RULES = ("auto", "vllm", "nano-vllm")
SPECULATIVE_METHODS = ("ngram", "synthetic")


def check_seed(seed) -> None:
    """The one rule for a run's seed (the engine's, a synthetic workload's): the sampler hashes it
    as a signed 64-bit integer, so it is checked before a run starts."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 1 << 63:
        raise ConfigError(f"seed must be an integer in [0, 2**63), got {seed!r}")


def _field(default, help: str, flag: bool = True):
    """A Config field whose `help` the command line shows; `flag`: whether it is an engine flag
    (`--max-num-seqs`) besides `--set max_num_seqs=` (which takes every field)."""
    return field(default=default, metadata={"help": help, "flag": flag})


@dataclass(slots=True, frozen=True)
class Config:
    """Built once, resolved values included (the engine fills in what the model decides:
    `LLM` builds it after the runner has sized the KV cache), and never changed afterwards:
    a variant is `replace(**changes)`."""
    model: str = _field("", "a Hugging Face checkpoint directory (default: the embedded tiny model)")
    max_num_batched_tokens: int = _field(16384, "token budget of one prefill step")
    max_num_seqs: int = _field(512, "sequences in one step")
    max_model_len: int = _field(4096, "longest prompt plus completion (at most the model's own)")
    gpu_memory_utilization: float = _field(0.9, "share of device memory for weights and KV cache, in (0, 1]")
    tensor_parallel_size: int = _field(1, "ranks to shard the model over")
    enforce_eager: bool = _field(False, "no CUDA graphs for decode")
    eos: int = _field(-1, "end-of-sequence token id (-1: the tokenizer's)", flag=False)
    kvcache_block_size: int = _field(16, "tokens per KV cache block")
    num_kvcache_blocks: int = _field(-1, "KV cache blocks (-1: as many as --gpu-memory-utilization allows; "
                                     "a simulation has no device and needs a count)")
    device: str = _field("auto", "auto, cpu, cuda or cuda:N (auto: cuda if there is one)")
    dtype: str = _field("auto", "auto, float32, bfloat16 or float16 (auto: the checkpoint's on cuda, float32 on cpu)")
    seed: int = _field(0, "seed of sampling", flag=False)
    scheduling_policy: str = _field("prefill_first", "prefill_first (nano-vllm's), mixed (vLLM V1's: decode tokens "
                                    "and prefill chunks in one batch) or a Scheduler subclass as module:Class "
                                    "(docs/policies.md)")
    enable_prefix_caching: bool = _field(True, "prefix caching (vLLM's enable_prefix_caching): when off, no "
                                         "prompt hits the cache and no block is registered in it", flag=False)
    block_rules: str = _field("auto", "the KV block rules: vllm (vLLM 0.33's: slots per chunk, a block's hash "
                              "registered when it is allocated, vLLM's free-queue order; the mixed policy only), "
                              "nano-vllm (a prompt's blocks at admission, hashes after the step) or auto (the "
                              "policy's own: vllm for mixed, nano-vllm for prefill_first)", flag=False)
    # Speculative decoding, with vLLM's names (docs/simulation.md): drafts proposed after a step are
    # verified in the request's next one, in one forward pass.
    num_speculative_tokens: int = _field(0, "draft tokens per request a step verifies (0: no speculative "
                                         "decoding)", flag=False)
    speculative_method: str = _field("ngram", "ngram (prompt lookup over the request's own tokens, vLLM's "
                                     "NgramProposer) or synthetic (drafts kept at synthetic_acceptance_rates, "
                                     "as vLLM's synthetic rejection sampler; simulation and what-if only)", flag=False)
    prompt_lookup_min: int = _field(5, "shortest n-gram the ngram proposer matches", flag=False)
    prompt_lookup_max: int = _field(5, "longest n-gram the ngram proposer matches", flag=False)
    synthetic_acceptance_rates: str = _field("", "the synthetic method's unconditional acceptance rate of each "
                                             "draft position, comma-separated, non-increasing in [0, 1] "
                                             "(vLLM's: position i's is the chance that drafts 0..i are all kept)",
                                             flag=False)
    synthetic_acceptance_length: float = _field(0.0, "the synthetic method's mean tokens per verify step, in "
                                                "[1, num_speculative_tokens + 1], instead of the rates "
                                                "(0: the rates are given)", flag=False)
    kv_offloading_size: float = _field(0.0, "GiB of CPU memory per replica for a second KV tier (vLLM's "
                                       "--kv-offloading-size, its native CPU offloading; 0: no tier)")
    kv_bytes_per_token: int = _field(0, "bytes one token's K and V take in every layer of a replica (0: the "
                                     "--roofline model's, where one is named); sizes the CPU tier's blocks "
                                     "and its transfers")
    kv_offloading_bandwidth_gbps: float = _field(0.0, "decimal GB/s between the GPU and the CPU tier, each "
                                                 "direction (0: transfers take no time)")

    def __post_init__(self):
        self.validate()

    def validate(self):
        def positive(name):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")

        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len",
                     "tensor_parallel_size", "kvcache_block_size"):
            positive(name)
        blocks = self.num_kvcache_blocks
        if blocks != -1 and (not isinstance(blocks, int) or isinstance(blocks, bool) or blocks <= 0):
            raise ConfigError(f"num_kvcache_blocks must be a positive integer or -1 (as many as fit), got {blocks!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        policy = self.scheduling_policy
        module, sep, name = policy.partition(":") if isinstance(policy, str) else ("", "", "")
        if policy not in BUILTIN_POLICY_NAMES and not (sep and module and name):
            raise ConfigError(f"scheduling_policy must be {', '.join(BUILTIN_POLICY_NAMES)} or a Scheduler "
                              f"subclass as module:Class, got {policy!r}")
        check_seed(self.seed)
        if self.block_rules not in BLOCK_RULES:
            raise ConfigError(f"block_rules must be {', '.join(BLOCK_RULES)}, got {self.block_rules!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        self.check_speculative()

    def check_speculative(self):
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ConfigError(f"num_speculative_tokens must be an integer >= 0, got {k!r}")
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ConfigError(f"speculative_method must be {' or '.join(SPECULATIVE_METHODS)}, "
                              f"got {self.speculative_method!r}")
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(f"prompt_lookup_min={self.prompt_lookup_min} must be <= "
                              f"prompt_lookup_max={self.prompt_lookup_max}")
        given = self.synthetic_acceptance_rates != "" or self.synthetic_acceptance_length != 0
        if given and self.speculative_method != "synthetic":
            raise ConfigError("synthetic_acceptance_rates and synthetic_acceptance_length need "
                              "speculative_method=synthetic")
        if k and self.speculative_method == "synthetic":
            acceptance_rates(self)      # exactly one of them, and valid
        self.validate_cpu_tier()

    def validate_cpu_tier(self):
        """The CPU tier's fields: none negative, and a tier that is on holds at least one block."""
        for name in ("kv_offloading_size", "kv_bytes_per_token", "kv_offloading_bandwidth_gbps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
                    or value == float("inf"):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if not isinstance(self.kv_bytes_per_token, int):
            raise ConfigError(f"kv_bytes_per_token must be an integer, got {self.kv_bytes_per_token!r}")
        if self.kv_offloading_size and self.kv_bytes_per_token and not self.num_cpu_blocks:
            raise ConfigError(f"kv_offloading_size={self.kv_offloading_size} GiB holds no KV block of "
                              f"{self.kvcache_block_size} tokens at {self.kv_bytes_per_token} bytes a token")

    @property
    def num_cpu_blocks(self) -> int:
        """KV blocks the CPU tier holds: its bytes over a block's, the block's rounded up to a
        4 KiB page, as vLLM's CPUOffloadingSpec sizes its chunks (0: no tier, or no bytes per token yet)."""
        return cpu_tier_num_blocks(self.kv_offloading_size, self.kv_bytes_per_token, self.kvcache_block_size)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def replace(self, **changes) -> "Config":
        """A variant. Another scheduling policy comes with its own block rules unless
        `block_rules` is given too (a what-if to `mixed` runs `mixed` as it is)."""
        unknown = sorted(set(changes) - set(field_names()))
        if unknown:
            raise ConfigError(f"unknown config field {unknown[0]!r}; known: {', '.join(field_names())}")
        if changes.get("scheduling_policy", self.scheduling_policy) != self.scheduling_policy:
            changes.setdefault("block_rules", "auto")
        return Config(**{**self.to_dict(), **changes})

    @classmethod
    def from_dict(cls, values: dict) -> "Config":
        """A recorded config (a trace header's), with the block rules its run used."""
        known = set(field_names())
        return cls(**{**{k: v for k, v in values.items() if k in known}, "block_rules": recorded_block_rules(values)})


def recorded_block_rules(values: dict) -> str:
    """The block rules of the run a recorded config `values` (a trace header's) describes: its
    field. A header without it was written before vLLM's rules existed: nano-vllm's, whatever the
    policy. "auto" (a header written before the engine resolved it) is a built-in policy's own as
    format 6 defines them: vllm for mixed, nano-vllm for prefill_first; a policy of one's own
    keeps "auto" (its class decides; tracengine's engine records what it resolved)."""
    rules = values.get("block_rules", "nano-vllm")
    policy = values.get("scheduling_policy", "prefill_first")
    if rules == "auto" and policy in BUILTIN_POLICY_NAMES:
        return "vllm" if policy == "mixed" else "nano-vllm"
    return rules


def acceptance_rates(config: Config) -> list[float]:
    """The synthetic method's unconditional acceptance rate of each of the num_speculative_tokens
    draft positions, by vLLM's rules (SpeculativeConfig._resolve_synthetic_acceptance_rates):
    exactly one of synthetic_acceptance_rates (each in [0, 1], non-increasing) or
    synthetic_acceptance_length (in [1, k + 1], made into rates by vLLM's minimum-variance
    schedule). Unlike vLLM, rates may name more positions than are drafted and the leading ones
    are used: a what-if that drafts fewer keeps the recorded rates."""
    k, text, length = config.num_speculative_tokens, config.synthetic_acceptance_rates, config.synthetic_acceptance_length
    if (text == "") == (length == 0):
        raise ConfigError("speculative_method=synthetic needs exactly one of synthetic_acceptance_rates "
                          "or synthetic_acceptance_length")
    if text:
        try:
            rates = [float(r) for r in text.replace(" ", "").split(",")]
        except ValueError:
            raise ConfigError(f"synthetic_acceptance_rates is numbers separated by commas, got {text!r}") from None
        if len(rates) < k:
            raise ConfigError(f"synthetic_acceptance_rates needs a rate for each of the {k} draft positions, "
                              f"got {text!r}")
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ConfigError(f"synthetic_acceptance_rates must each be in [0, 1], got {text!r}")
        if any(later > earlier for earlier, later in zip(rates, rates[1:])):
            raise ConfigError(f"synthetic_acceptance_rates must be non-increasing, got {text!r}")
        return rates[:k]
    if not (isinstance(length, (int, float)) and 1.0 <= length <= k + 1):
        raise ConfigError(f"synthetic_acceptance_length must be in [1, {k + 1}], got {length!r}")
    num_drafts = length - 1       # the drafts kept on average
    num_full = int(num_drafts)
    return ([1.0] * num_full + [num_drafts - num_full] + [0.0] * (k - num_full - 1))[:k]


def field_names() -> list[str]:
    return [f.name for f in fields(Config)]


def field_help(name: str) -> str:
    return Config.__dataclass_fields__[name].metadata["help"]


def flag_fields() -> list[str]:
    """The fields that are engine flags on the command line (every field takes `--set`)."""
    return [f.name for f in fields(Config) if f.metadata["flag"]]


# Names a user may give for a field: the generate flag's own (--block-size), with - or _.
FIELD_ALIASES = {"block_size": "kvcache_block_size"}


def parse_override(text: str) -> tuple[str, object]:
    """`name=value` from the command line, typed by the field's default."""
    defaults = {name: f.default for name, f in Config.__dataclass_fields__.items()}
    return parse_field(text, defaults, field_names(), "config field", FIELD_ALIASES, none=False)


def parse_field(text: str, values: dict, known: list[str], what: str, aliases: dict | None = None,
                none: bool = True) -> tuple[str, object]:
    """`NAME=VALUE` (--set, --sweep's values) as one of the `known` fields (`what` they are; `aliases`:
    a name's other names) and its value, typed as `values` has it (`none`: "none" sets None)."""
    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    name = (aliases or {}).get(name, name)
    if not sep:
        raise ConfigError(f"expected NAME=VALUE, got {text!r}")
    if name not in known:
        raise ConfigError(f"unknown {what} {name!r}; known: {', '.join(known)}")
    return name, typed_value(name, raw.strip(), values.get(name), none)


def typed_value(name: str, raw: str, like: object, none: bool = True) -> object:
    """`raw` as the type of `like` (a number, a bool, a string; any of them where `like` is None;
    `none`: "none" is None)."""
    if none and raw.lower() == "none":
        return None
    kinds = [type(like)] if like is not None else [int, float, str]
    for kind in kinds:
        try:
            if kind is bool:
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                return raw.lower() in ("true", "1", "yes")
            return kind(raw)
        except ValueError:
            continue
    kind_name = type(like).__name__
    article = "an" if kind_name[0] in "aeiou" else "a"
    raise ConfigError(f"{name} expects {article} {kind_name}, got {raw!r}")


def cpu_tier_num_blocks(kv_offloading_size: float, kv_bytes_per_token: int, block_size: int) -> int:
    """KV blocks a CPU tier of `kv_offloading_size` GiB holds (Config.num_cpu_blocks; 0: no tier, or
    no bytes per token yet): its bytes over a block's, the block's rounded up to a 4 KiB page."""
    if not kv_offloading_size or not kv_bytes_per_token:
        return 0
    page = 4096
    block_bytes = -(-kv_bytes_per_token * block_size // page) * page
    return int(kv_offloading_size * (1 << 30)) // block_bytes
