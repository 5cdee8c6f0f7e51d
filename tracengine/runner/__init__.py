"""Model runner: paged KV cache, attention backends, CUDA graphs, sampler."""
