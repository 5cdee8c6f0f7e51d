"""Model runner: paged KV cache, attention backends, CUDA graphs, sampler,
tensor parallelism (the tp_* modules)."""


def make_runner(config, hf_config=None):
    """The runner for `config`: rank 0's TensorParallelRunner when
    config.tensor_parallel_size > 1, else a ModelRunner."""
    if config.tensor_parallel_size > 1:
        from tracengine.runner.tp_runner import TensorParallelRunner
        return TensorParallelRunner(config, hf_config)
    from tracengine.runner.model_runner import ModelRunner
    return ModelRunner(config, hf_config)
