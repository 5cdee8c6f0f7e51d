"""Simulation beyond one run: sweeps' variants as data (spec.py), where they run (executors.py:
local processes or Ray tasks), the result cache (cache.py) and the capacity search (search.py)."""
