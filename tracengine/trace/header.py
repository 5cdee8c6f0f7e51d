"""A trace's first record: making the header of this format version, and checking that a
stream of events starts with one."""
import time
from typing import Iterator

from tracengine.version import __version__
from tracengine.errors import TraceError
from tracengine.trace.events import AnyEvent, ModelInfo, TraceHeader
from tracengine.trace.frames import FORMAT_VERSION


def make_header(config, model: ModelInfo | None = None, device: str = "cpu", torch_version: str = "",
                seed: int | None = None) -> TraceHeader:
    """A header of this format version for `config` (any object with `to_dict()` and `seed`)."""
    return TraceHeader(FORMAT_VERSION, __version__, config.to_dict(),
                       model if model is not None else ModelInfo("synthetic", "none", "none"),
                       device, torch_version, config.seed if seed is None else seed, time.time())


def check_header(event) -> TraceHeader:
    """The first event of a trace, which must be its TraceHeader: the one check."""
    if not isinstance(event, TraceHeader):
        got = "nothing" if event is None else type(event).__name__
        raise TraceError(f"a trace starts with a TraceHeader, not {got}")
    return event


def split_header(events) -> tuple[TraceHeader, Iterator[AnyEvent]]:
    """(the header, an iterator over the events after it)."""
    it = iter(events)
    return check_header(next(it, None)), it


ENGINE, VLLM, FLEET, SGLANG = "tracengine", "vllm", "fleet", "sglang"      # the backends a trace can name


def backend_of(header: TraceHeader) -> str:
    """The backend that runs a trace's scheduling again, as its header names it: a fleet of
    engines (the header has a fleet), vLLM's own scheduler (engine "vllm"), SGLang's (engine
    "sglang"), or tracengine's engine. The one place that reads a header's kind: everything
    else asks this."""
    if header.fleet:
        return FLEET
    return {"vllm": VLLM, "sglang": SGLANG}.get(header.engine, ENGINE)


def block_pool_config(header: TraceHeader) -> tuple[int, int, int]:
    """(num_blocks, num_usable_blocks, block_size) of the KV block pool a header's config names:
    tracengine's fields, or vLLM's in a trace of vLLM's scheduler (whose block 0 is its null
    block, never used); -1, -1, 0 where they are not recorded."""
    config = header.config
    if backend_of(header) == SGLANG:     # token-pool slots, slot 0 SGLang's padding slot
        num_slots = config.get("max_total_tokens", -1)
        return (num_slots + 1, num_slots, 1) if isinstance(num_slots, int) and num_slots > 0 else (-1, -1, 0)
    if backend_of(header) == VLLM:
        num_blocks, block_size = config.get("num_gpu_blocks", -1), config.get("block_size", 0)
        return num_blocks, num_blocks - 1 if isinstance(num_blocks, int) and num_blocks > 0 else -1, block_size
    num_blocks = config.get("num_kvcache_blocks", -1)
    return num_blocks, num_blocks, config.get("kvcache_block_size", 0)


def not_recorded_note(header: TraceHeader) -> str | None:
    """What `replay` and `check` say first of a trace that does not hold all its engine did (a
    vLLM feature recorded anyway, tracengine/vllm/features.py); None for a whole recording."""
    if not header.not_recorded:
        return None
    return (f"the trace was recorded without {'; '.join(header.not_recorded)} (recorded anyway): "
            f"a replay of it is not exact")
