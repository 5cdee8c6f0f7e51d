"""Model runner: paged KV cache, attention backends, CUDA graphs, sampler,
tensor parallelism (the tp_* modules). Unlike nano-vllm, whose ModelRunner
branches on its rank and talks to workers through shared memory, ModelRunner
here computes one rank's shard and nothing else: rank 0's TensorParallelRunner
owns the worker processes, and the CPU attention plans live with the torch
backend, so each module keeps one job."""


def make_runner(config, hf_config=None):
    """The runner for `config`: rank 0's TensorParallelRunner when
    config.tensor_parallel_size > 1, else a ModelRunner."""
    if config.tensor_parallel_size > 1:
        from tracengine.runner.tp_runner import TensorParallelRunner
        return TensorParallelRunner(config, hf_config)
    from tracengine.runner.model_runner import ModelRunner
    return ModelRunner(config, hf_config)
