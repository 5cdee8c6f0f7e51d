"""Workloads: where the requests of a run come from (prompts, files, synthetic mixes)."""
