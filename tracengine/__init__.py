"""tracengine: a nano-vllm-style inference engine whose every scheduling decision is an event.

One folder per part (engine, model, runner, trace, replay, sim, analysis, tui, workload, serve,
cli): docs/architecture.md is the map, what each part may import, and the way an event travels."""

from tracengine.compiled import decide as _decide

__all__ = ["LLM", "SamplingParams", "Config", "open_trace", "stats", "__version__"]

_decide()      # which core runs (compiled or Python), before any core module is imported


def __getattr__(name):
    # Lazy, so that importing the scheduler or the trace reader never imports torch.
    if name == "__version__":
        from tracengine.version import __version__
        return __version__
    if name == "LLM":
        from tracengine.engine.llm import LLM
        return LLM
    if name == "SamplingParams":
        from tracengine.engine.sampling_params import SamplingParams
        return SamplingParams
    if name == "Config":
        from tracengine.engine.config import Config
        return Config
    if name == "open_trace":
        from tracengine.trace.tracelog import open_trace
        return open_trace
    if name == "stats":
        from tracengine.analysis.stats import stats
        return stats
    raise AttributeError(f"module 'tracengine' has no attribute {name!r}")
