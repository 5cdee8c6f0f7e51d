"""vLLM's synthetic acceptance (SpeculativeConfig's `rejection_sample_method="synthetic"`, with
`synthetic_acceptance_rates` or `synthetic_acceptance_length`) where vLLM's scheduler is driven
without a model (drive.py; in simulated time, timed.py): `simulate --scheduler vllm` with drafts,
and the what-if of a vLLM trace in simulated time to another draft length.

- A request's drafts are its own next tokens (a drafter that is always right), and the leading
  ones are kept by vLLM's synthetic rule, seeded as tracengine's engine keeps them
  (engine/spec_decode.synthetic_num_accepted, the one definition: the draw of a draft is a hash of
  the seed, the request's index in the workload and the draft's position), so a run is
  reproducible and one that drafts fewer sees the same draws at the same positions.
- A header's flat config holds `rejection_sample_method` and `synthetic_acceptance_rates` (the
  rates vLLM resolved, as text "0.8,0.6,0.4", as tracengine's Config holds them) where they are
  synthetic. Rates may name more positions than are drafted: the leading ones are used (vLLM asks
  for exactly one a position), so rates for 3 drafts serve a run of 2.
- The what-if of a trace in simulated time (`whatif_config`) keeps the recorded drafts where it
  drafts as the recording did; to another draft length, or naming an acceptance field, its drafts
  are kept by the synthetic rule at the rates given, else at the recording's: a synthetic
  recording's rates, or those measured per position in a recording's verifications."""
from tracengine.engine.spec_decode import conditional_rates, synthetic_num_accepted
from tracengine.errors import ConfigError

SYNTHETIC_FIELDS = ("rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length")
RATES, LENGTH = "synthetic_acceptance_rates", "synthetic_acceptance_length"


def parse_rates(value) -> list[float]:
    """synthetic_acceptance_rates as given (text "0.8,0.6,0.4", one number, or a list)."""
    try:
        if isinstance(value, str):
            return [float(r) for r in value.replace(" ", "").split(",")]
        return [float(r) for r in value] if isinstance(value, (list, tuple)) else [float(value)]
    except ValueError:
        raise ConfigError(f"synthetic_acceptance_rates is numbers separated by commas, got {value!r}") from None


def rates_text(rates) -> str:
    return ",".join(repr(float(r)) for r in rates)


def synthetic_options(config: dict) -> dict:
    """The SpeculativeConfig fields of a header's config that make its acceptance synthetic (where
    it names the method or a rate or length); the rates cut to its draft length."""
    method = config.get("rejection_sample_method")
    if method is None and config.get(RATES) is None and config.get(LENGTH) is None:
        return {}
    options = {"rejection_sample_method": method or "synthetic"}
    if config.get(RATES) is not None:
        options[RATES] = parse_rates(config[RATES])[:config.get("num_speculative_tokens") or 0]
    if config.get(LENGTH) is not None:
        options[LENGTH] = float(config[LENGTH])
    return options


def header_fields(spec) -> dict:
    """What a header records of a SpeculativeConfig's acceptance: nothing unless it is synthetic."""
    if getattr(spec, "rejection_sample_method", "standard") != "synthetic":
        return {}
    return {"rejection_sample_method": "synthetic", RATES: rates_text(spec.synthetic_acceptance_rates)}


class SyntheticAcceptance:
    """How many of a request's drafts a step keeps, by vLLM's synthetic rule (its rates resolved)."""

    def __init__(self, rates: list[float], seed: int = 0):
        self.rates = conditional_rates(list(rates))
        self.seed = seed

    def num_accepted(self, key: int, num_tokens: int, drafts) -> int:
        """Of `drafts` (vLLM's padding, -1, is never kept) of the request `key` (its index in the
        workload) at `num_tokens` tokens."""
        num_drafts = next((i for i, d in enumerate(drafts) if d < 0), len(drafts))
        return synthetic_num_accepted(self.seed, key, num_tokens, self.rates, num_drafts)


def synthetic_acceptance(scheduler) -> SyntheticAcceptance | None:
    """The scheduler's synthetic acceptance; None when its drafts are not kept synthetically."""
    spec = scheduler.vllm_config.speculative_config
    if spec is None or spec.rejection_sample_method != "synthetic":
        return None
    return SyntheticAcceptance(spec.synthetic_acceptance_rates, scheduler.vllm_config.model_config.seed or 0)


def measured_rates(events) -> list[float]:
    """The unconditional acceptance rate of each draft position in a trace's verifications, made
    non-increasing as vLLM asks (a later position's rate is never above an earlier one's)."""
    from tracengine.analysis.spec_decoding import SpecCounts
    from tracengine.trace.events import SpecAccepted, SpecDecode
    counts = SpecCounts()
    for e in events:
        if type(e) is SpecDecode:
            counts.scheduled(e)
        elif type(e) is SpecAccepted:
            counts.accepted(e)
    rates = []
    for rate in counts.figures().acceptance_rate_per_position:
        rates.append(min(rate, rates[-1]) if rates else rate)
    return rates


def whatif_config(recorded: dict, overrides: dict, config: dict, events) -> dict:
    """The config a what-if in simulated time runs for `overrides` (`config`: the recorded one
    with them): synthetic acceptance where it drafts another number of tokens than the recording,
    or names an acceptance field; else `config`."""
    k = config.get("num_speculative_tokens") or 0
    named = set(overrides) & set(SYNTHETIC_FIELDS)
    if not k or (not named and k == recorded.get("num_speculative_tokens")) \
            or config.get("rejection_sample_method") not in (None, "synthetic"):
        return config
    new = {**config, "rejection_sample_method": "synthetic"}
    if LENGTH in overrides or RATES in overrides:     # the one given, not the recording's other
        new.pop(RATES if LENGTH in overrides and RATES not in overrides else LENGTH, None)
        return new
    if new.get(RATES) is None and new.get(LENGTH) is None:
        rates = measured_rates(events)
        if len(rates) < k:
            raise ConfigError(f"the trace's drafts show acceptance at {len(rates)} draft positions, not {k}: "
                              f"give synthetic_acceptance_rates or synthetic_acceptance_length")
        new[RATES] = rates_text(rates[:k])
    return new
