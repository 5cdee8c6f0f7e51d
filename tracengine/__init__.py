"""tracengine: a nano-vllm-style inference engine whose every scheduling decision is an event."""
__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "Config", "open_trace", "stats", "__version__"]


def __getattr__(name):
    # Lazy, so that importing the scheduler or the trace reader never imports torch.
    if name == "LLM":
        from tracengine.llm import LLM
        return LLM
    if name == "SamplingParams":
        from tracengine.sampling_params import SamplingParams
        return SamplingParams
    if name == "Config":
        from tracengine.config import Config
        return Config
    if name == "open_trace":
        from tracengine.tracelog import open_trace
        return open_trace
    if name == "stats":
        from tracengine.serving_stats import stats
        return stats
    raise AttributeError(f"module 'tracengine' has no attribute {name!r}")
