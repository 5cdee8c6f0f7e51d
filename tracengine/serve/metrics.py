"""Prometheus metrics of the server, under vLLM's names (`vllm:` prefix, a
`model_name` label), so dashboards and alerts written for `vllm serve` read
them. Each server has its own registry: two servers in one process (tests)
do not share counters. Updated by the engine loop after each step and each abort."""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the app)

# vLLM's buckets for request latencies, in seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:

    def __init__(self, model_name: str, num_kvcache_blocks: int):
        self.registry = r = CollectorRegistry()
        labels = ["model_name"]
        self.num_kvcache_blocks = num_kvcache_blocks

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=r).labels(model_name)

        def counter(name, doc):
            return Counter(name, doc, labels, registry=r).labels(model_name)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.num_requests_running = gauge("vllm:num_requests_running", "Requests in the running queue (decoding).")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting",
                                          "Requests in the waiting queue (new, mid-prefill or preempted).")
        self.kv_cache_usage = gauge("vllm:kv_cache_usage_perc", "Share of KV cache blocks in use, 0 to 1.")
        self.num_preemptions = counter("vllm:num_preemptions", "Preemptions by recomputation.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens computed in prefill steps "
                                     "(recomputation after a preemption included).")
        self.generation_tokens = counter("vllm:generation_tokens", "Completion tokens generated.")
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a request.",
                             ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to the last token.", E2E_BUCKETS)
        self._success = Counter("vllm:request_success", "Requests ended, by finish reason.",
                                ["model_name", "finished_reason"], registry=r)
        self.model_name = model_name
        self.start_ns = 0            # the engine's start_ns, for arrival times

    def tokens(self, request, now_ns: int) -> None:
        """A step gave `request` a token at `now_ns`."""
        if request.first_token_ns == 0:
            request.first_token_ns = now_ns
            self.ttft.observe((now_ns - self.start_ns) / 1e9 - request.arrival_time)
        else:
            self.itl.observe((now_ns - request.last_token_ns) / 1e9)
        request.last_token_ns = now_ns

    def request_finished(self, request, reason: str) -> None:
        self._success.labels(self.model_name, reason).inc()
        if request.last_token_ns:
            self.e2e.observe((request.last_token_ns - self.start_ns) / 1e9 - request.arrival_time)

    def queues(self, llm) -> None:
        """The gauges, from the scheduler's queues and free blocks: after every step and abort."""
        scheduler = llm.scheduler
        self.num_requests_running.set(len(scheduler.running))
        self.num_requests_waiting.set(len(scheduler.waiting))
        self.kv_cache_usage.set(1 - scheduler.block_manager.num_free_blocks / self.num_kvcache_blocks)

    def step(self, llm, is_prefill: bool, num_new_tokens: int, num_preemptions: int) -> None:
        self.queues(llm)
        if is_prefill:
            self.prompt_tokens.inc(llm.num_batched_tokens)
        self.generation_tokens.inc(num_new_tokens)
        if num_preemptions:
            self.num_preemptions.inc(num_preemptions)

    def render(self) -> bytes:
        return generate_latest(self.registry)
