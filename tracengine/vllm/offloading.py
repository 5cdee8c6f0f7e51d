"""vLLM's native CPU offloading (`--kv-offloading-size`: its OffloadingConnector over the CPU
backend's OffloadingManager, LRU) in simulated time: `simulate --scheduler vllm --set
kv_offloading_size=GiB` and the what-if in simulated time of a trace recorded with it run vLLM's
own scheduler side, and `TimedOffloadingWorker` stands in for its workers.

The header of a run with it holds `kv_offloading_size` (GiB), `kv_bytes_per_token` (a token's K
and V in every layer) and `kv_offloading_bandwidth_gbps` (decimal GB/s each way; 0: transfers
take no time), beside the connector's fields (connector.py). The tier holds as many blocks as
tracengine's engine gives the same size (engine/config.cpu_tier_num_blocks: the size over a
block's bytes rounded up to a 4 KiB page, as vLLM's CPUOffloadingSpec sizes its chunks), whatever
KV shape the scheduler built here has.

The workers' rules, vLLM's OffloadingConnectorWorker's: a step's loads start at its start, its
stores at the next step's start (a store the step's own metadata flushes: at once); each
direction's copies run one after another, each taking blocks x block_size x kv_bytes_per_token
bytes at the bandwidth; a step's output reports the jobs that ended by the step's end (an
asynchronous load's request in finished_recving). A step that scheduled nothing while copies are
in flight is followed by the next one when the next copy ends (the engine core's idle steps, run
at once). Not modelled: the wait of a step's forward pass for the stores it flushes."""
import heapq

from tracengine.engine.config import cpu_tier_num_blocks
from tracengine.engine.cpu_tier import transfer_ns
from tracengine.errors import ConfigError

# a header's fields of native CPU offloading, and `--set`'s
OFFLOADING_FIELDS = ("kv_offloading_size", "kv_bytes_per_token", "kv_offloading_bandwidth_gbps")
NATIVE_CONNECTOR = "OffloadingConnector"
_PAGE = 4096


def is_native_offloading(config: dict) -> bool:
    """A header's (or a simulation's) config with vLLM's native CPU offloading: a what-if in
    simulated time runs its connector (no other connector's)."""
    return bool(config.get("kv_offloading_size")) and config.get("kv_connector") in (None, NATIVE_CONNECTOR)


def spec_bytes_per_token(config: dict) -> int:
    """A token's K and V in the one layer of the KV cache a scheduler is built with here (build.py)."""
    import torch
    return 2 * config["num_kv_heads"] * config["head_size"] * getattr(torch, config["kv_dtype"]).itemsize


def offloading_transfer_config(config: dict):
    """vLLM's KVTransferConfig of native CPU offloading for `config` (None: none): the
    OffloadingConnector, its CPU bytes sized so that it holds cpu_tier_num_blocks chunks of the
    KV cache built here; the header's fields ride along in its extra config."""
    size = config.get("kv_offloading_size")
    if not size:
        return None
    from vllm.config import KVTransferConfig
    values = {name: config.get(name) or 0 for name in OFFLOADING_FIELDS}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value == float("inf"):
            raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
    own = spec_bytes_per_token(config)
    values = {"kv_offloading_size": float(size), "kv_bytes_per_token": int(values["kv_bytes_per_token"]) or own,
              "kv_offloading_bandwidth_gbps": float(values["kv_offloading_bandwidth_gbps"])}
    num_blocks = cpu_tier_num_blocks(size, values["kv_bytes_per_token"], config["block_size"])
    if not num_blocks:
        raise ConfigError(f"kv_offloading_size={size} GiB holds no KV block of {config['block_size']} tokens at "
                          f"{values['kv_bytes_per_token']} bytes a token")
    chunk_bytes = -(-own * config["block_size"] // _PAGE) * _PAGE
    return KVTransferConfig(kv_connector=NATIVE_CONNECTOR, kv_role="kv_both",
                            kv_connector_extra_config={"cpu_bytes_to_use": num_blocks * chunk_bytes,
                                                       "tracengine": values})


def offloading_fields(scheduler) -> dict:
    """The header's fields of the scheduler's native CPU offloading ({}: none). Recorded from a
    server: the size it was given, the bytes of a token in its KV cache, and no bandwidth (0)."""
    transfer = scheduler.vllm_config.kv_transfer_config
    connector = scheduler.connector
    if transfer is None or connector is None or type(connector).__name__ != NATIVE_CONNECTOR:
        return {}
    extra = transfer.kv_connector_extra_config or {}
    if extra.get("spec_name", "CPUOffloadingSpec") != "CPUOffloadingSpec" or not extra.get("cpu_bytes_to_use"):
        return {}
    if "tracengine" in extra:
        return dict(extra["tracengine"])
    group = scheduler.kv_cache_config.kv_cache_groups[0]
    block_bytes = group.kv_cache_spec.page_size_bytes * len(group.layer_names)
    return {"kv_offloading_size": extra["cpu_bytes_to_use"] / (1 << 30),
            "kv_bytes_per_token": block_bytes // scheduler.block_size, "kv_offloading_bandwidth_gbps": 0.0}


def with_model_kv_bytes(config: dict, step_time) -> dict:
    """`config` with the roofline model's bytes of a token where offloading needs them and none are
    given (as sim/engine.with_kv_bytes gives tracengine's engine)."""
    model = getattr(step_time, "model", None) if getattr(step_time, "kind", "") == "roofline" else None
    if not config.get("kv_offloading_size") or config.get("kv_bytes_per_token") or model is None:
        return config
    return {**config, "kv_bytes_per_token": model.kv_bytes_per_token}


def offloading_worker(scheduler):
    """The stand-in workers of the scheduler's native CPU offloading (None: it has none)."""
    fields = offloading_fields(scheduler)
    if not fields:
        return None
    return TimedOffloadingWorker(scheduler.block_size * fields["kv_bytes_per_token"],
                                 fields["kv_offloading_bandwidth_gbps"])


class TimedOffloadingWorker:
    """The OffloadingConnector's workers on the simulated clock (drive.VllmClockedEngine's
    `kv_worker`): `scheduled` after each schedule (its start and end), `output` for each step's
    output, `next_start` for when the next step starts."""

    def __init__(self, block_bytes: int, gbps: float):
        self.block_bytes, self.gbps = block_bytes, gbps
        self.d2h_free_ns = self.h2d_free_ns = 0     # when each direction's link is next free
        self.queued_stores: list = []               # (job id, blocks): started at the next step's start
        self.in_flight: list = []                   # heap: (done_ns, job id, step, request id of a load)
        self.steps: dict[int, tuple[int, int]] = {}   # id of a SchedulerOutput -> (its step, its end)
        self.num_steps = 0
        self.idle = False                           # the last step scheduled nothing

    def _start(self, now_ns: int, job_id: int, num_blocks: int, is_store: bool, req_id) -> None:
        start = max(now_ns, self.d2h_free_ns if is_store else self.h2d_free_ns)
        done = start + transfer_ns(num_blocks, self.block_bytes, self.gbps)
        if is_store:
            self.d2h_free_ns = done
        else:
            self.h2d_free_ns = done
        heapq.heappush(self.in_flight, (done, job_id, self.num_steps, req_id))

    def scheduled(self, out, start_ns: int, end_ns: int) -> None:
        self.steps[id(out)] = (self.num_steps, end_ns)
        meta = out.kv_connector_metadata
        flushed = getattr(meta, "jobs_to_flush", None) or ()
        stores = dict(getattr(meta, "store_jobs", None) or {})
        for job_id, blocks in self.queued_stores:
            self._start(start_ns, job_id, blocks, True, None)
        self.queued_stores = []
        for job_id in flushed:
            job = stores.pop(job_id, None)
            if job is not None:
                self._start(start_ns, job_id, len(job.src_spec.block_ids), True, None)
        for job_id, job in (getattr(meta, "load_jobs", None) or {}).items():
            self._start(start_ns, job_id, len(job.dst_spec.block_ids), False, None if job.sync else job.req_id)
        self.queued_stores = [(job_id, len(job.src_spec.block_ids)) for job_id, job in stores.items()]
        self.idle = out.total_num_scheduled_tokens == 0
        self.num_steps += 1

    def output(self, scheduler, out):
        """The step's kv_connector_output: the jobs started by it that ended by its end."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput
        step, end_ns = self.steps.pop(id(out))
        done, later, recving = {}, [], set()
        while self.in_flight and self.in_flight[0][0] <= end_ns:
            entry = heapq.heappop(self.in_flight)
            if entry[2] > step:       # started by a later step (scheduled ahead): reported by its own
                later.append(entry)
                continue
            done[entry[1]] = 1
            if entry[3] is not None:
                recving.add(entry[3])
        for entry in later:
            heapq.heappush(self.in_flight, entry)
        if not done:
            return None
        return KVConnectorOutput(finished_recving=recving or None,
                                 kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done))

    def next_start(self, base_ns: int) -> int:
        """When the next step starts: `base_ns`, or after a step that scheduled nothing, when the
        next copy in flight (or queued) ends."""
        if not self.idle:
            return base_ns
        if self.in_flight:
            return max(base_ns, self.in_flight[0][0])
        return base_ns
