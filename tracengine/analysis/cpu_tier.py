"""What a trace says of its CPU tier (KV offloading, engine/cpu_tier.py): the request timeline
folds its events here (`CpuTierRecord`, made at the first of them, so a trace without a tier
costs nothing), and `cpu_tier_figures` gives the figures `stats` reports."""
from tracengine.analysis.figures import CpuTierFigures, summarize
from tracengine.trace.events import CpuHit, CpuLoad, CpuStore

NS = 1e9


class CpuTierRecord:
    __slots__ = ("num_hit_blocks", "num_stored_blocks", "num_evicted_blocks", "num_loaded_blocks", "hits", "loads")

    def __init__(self):
        self.num_hit_blocks = self.num_stored_blocks = self.num_evicted_blocks = self.num_loaded_blocks = 0
        self.hits: dict[int, int] = {}                 # seq_id -> when its load started (ns), until it ended
        self.loads: list[tuple[int, int]] = []         # (step its load ended at, when it started)


def _record(timeline) -> CpuTierRecord:
    if timeline.cpu is None:
        timeline.cpu = CpuTierRecord()
    return timeline.cpu


def cpu_stored(timeline, event: CpuStore) -> None:
    record = _record(timeline)
    record.num_stored_blocks += len(event.hashes)
    record.num_evicted_blocks += len(event.evicted)


def cpu_hit(timeline, event: CpuHit) -> None:
    record = _record(timeline)
    record.num_hit_blocks += len(event.hashes)
    record.hits[event.seq_id] = event.start_ns


def cpu_loaded(timeline, event: CpuLoad) -> None:
    record = _record(timeline)
    record.num_loaded_blocks += event.num_blocks
    start_ns = record.hits.pop(event.seq_id, None)
    if start_ns is not None:
        record.loads.append((event.step, start_ns))


FOLD = {CpuStore: cpu_stored, CpuHit: cpu_hit, CpuLoad: cpu_loaded}


def cpu_tier_figures(timeline) -> CpuTierFigures | None:
    """The tier's figures (None: the trace has no tier). A load's wait runs from the start of
    the step it started in to the start of the step its sequence was scheduled at again."""
    record, header = timeline.cpu, timeline.header
    config = header.config if header is not None else {}
    if record is None and (not config.get("kv_offloading_size") or config.get("kv_connector")):
        return None      # (vLLM's own offloading: its connector's figures, stats' kv_connector)
    record = record or CpuTierRecord()
    block_bytes = config.get("kv_bytes_per_token", 0) * (timeline.block_size or 0)
    waits = [timeline.start_ns(step) - start_ns for step, start_ns in record.loads if step < timeline.num_steps]
    return CpuTierFigures(
        kv_offloading_size_gib=config.get("kv_offloading_size", 0.0),
        kv_offloading_bandwidth_gbps=config.get("kv_offloading_bandwidth_gbps", 0.0), block_bytes=block_bytes,
        num_hit_blocks=record.num_hit_blocks, num_stored_blocks=record.num_stored_blocks,
        num_evicted_blocks=record.num_evicted_blocks, num_loads=len(record.loads) + len(record.hits),
        bytes_to_cpu=record.num_stored_blocks * block_bytes, bytes_to_gpu=record.num_hit_blocks * block_bytes,
        load_wait_s=summarize([w / NS for w in waits]))
