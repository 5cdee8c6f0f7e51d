"""tracengine: a nano-vllm-style inference engine whose every scheduling decision is an event.

One folder per part, in the order events flow:
  engine/    sequence, block manager, scheduler, the step loop and `LLM` (nano-vllm's engine/)
  runner/    tensors: model runner, KV cache, attention backends, sampler, CUDA graphs, tensor parallel
  model/     the architectures (a registry), layers, attention, the Hugging Face loader, the embedded tiny model
  trace/     the event vocabulary and the trace file
  replay/    re-execution, fold, what-if, diff, the runners without a model, and simulation in
             simulated time (step-time models, roofline, simulate, sweeps): it re-runs the same scheduler
  analysis/  the request timeline, stats, the Perfetto export
  tui/       the Textual viewer
  workload/  where requests come from
  serve/     the OpenAI-compatible HTTP server and its load client
  cli/       the parser and every command's function
nano-vllm keeps everything in two folders; tracengine has four more parts (trace, replay,
analysis, tui) that must not import the engine's torch side, and folders make that visible.
`errors.py` is shared by every part, `jsonfile.py` by the parts that read JSON files;
`testing.py` holds the fixtures and the opt-in pytest plugin for scheduling snapshot tests
(tracengine's own and a user's)."""
__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "Config", "open_trace", "stats", "__version__"]


def __getattr__(name):
    # Lazy, so that importing the scheduler or the trace reader never imports torch.
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
