"""The worker side of a KV connector when vLLM's scheduler is driven with no model (drive.py):
every transfer a step starts is reported finished with that step's output, as workers report
them through the model runner's output (kv_connector_output). Loads: the requests the step left
waiting for remote KV (WAITING_FOR_REMOTE_KVS); sends: finished requests whose blocks the
connector kept (request_finished's delay); vLLM's OffloadingConnector's jobs, from the step's
connector metadata, as its workers count them."""


class KVWorker:
    """Fabricates each step's kv_connector_output; `load_steps`: the updates a load takes to finish;
    `failing`: request ids whose load fails (reported in failed_recving as it ends)."""

    def __init__(self, load_steps: int = 1, failing=()):
        self.load_steps, self.failing = load_steps, set(failing)
        self.loading: dict[str, int] = {}      # request id -> updates since its load started
        self.sent: set[str] = set()

    def output(self, scheduler, scheduler_output):
        from vllm.v1.outputs import KVConnectorOutput
        from vllm.v1.request import RequestStatus
        recving, sending = [], []
        for req_id, request in scheduler.requests.items():
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                waited = self.loading[req_id] = self.loading.get(req_id, -1) + 1
                if waited + 1 >= self.load_steps:
                    recving.append(req_id)
                    del self.loading[req_id]
            elif request.is_finished() and req_id not in self.sent \
                    and req_id not in scheduler_output.num_scheduled_tokens:
                sending.append(req_id)           # kept by the connector past its finish
                self.sent.add(req_id)
        meta = getattr(scheduler_output, "kv_connector_metadata", None)
        worker_meta = None
        jobs = [*getattr(meta, "load_jobs", ()), *getattr(meta, "store_jobs", ())]
        if jobs:
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
            worker_meta = OffloadingWorkerMetadata(completed_jobs={job_id: 1 for job_id in jobs})
        failed = {req_id for req_id in recving if req_id in self.failing}
        if not (recving or sending or worker_meta):
            return None
        return KVConnectorOutput(finished_sending=set(sending) or None, finished_recving=set(recving) or None,
                                 kv_connector_worker_meta=worker_meta, failed_recving=failed)

    def scheduled(self, out, start: int, end: int) -> None:
        """After a step is scheduled (its start and end): nothing here, every transfer ends with its step."""

    def next_start(self, base: int) -> int:
        return base
