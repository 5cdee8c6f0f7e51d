"""The server's Prometheus figures against the engine's own counts."""
import re

import pytest

from tracengine.engine.llm import LLM
from tracengine.engine.sampling_params import SamplingParams
from tracengine.serve.engine_loop import EngineLoop, ServeRequest
from tracengine.serve.metrics import ServerMetrics


@pytest.mark.parametrize("policy", ["prefill_first", "mixed"])
def test_preemptions_metric_counts_every_preemption(policy):
    # a KV cache too small for the batch: sequences are preempted, in decode steps under
    # prefill_first and in mixed steps under mixed
    llm = LLM("", num_kvcache_blocks=12, kvcache_block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
              scheduling_policy=policy)
    try:
        metrics = ServerMetrics("embedded", 12)
        loop = EngineLoop(llm, metrics)
        requests = [ServeRequest(list(range(3 + i, 13 + i)), SamplingParams(temperature=0.0, max_tokens=12,
                                                                             ignore_eos=True), None, None)
                    for i in range(4)]
        deliveries = []
        for request in requests:
            loop._add(request, deliveries)
        seqs = [r.seq for r in requests]
        while not llm.is_finished():
            loop._step(deliveries)
        preempted = sum(seq.num_preemptions for seq in seqs)
        assert preempted > 0
        counted = re.search(r'^vllm:num_preemptions_total\{model_name="embedded"\} (\S+)$',
                            metrics.render().decode(), re.M)
        assert float(counted.group(1)) == preempted
    finally:
        llm.close()
