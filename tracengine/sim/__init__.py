"""Simulation: the real scheduler in simulated time, with no model. The simulated engine
(engine.py), step-time models (steptime.py, roofline.py), the runners that stand in for a
model (runners.py), sweeps over configs (sweep.py): a sweep's variants as data (spec.py),
where they run (executors.py: local processes or Ray tasks), the result cache (cache.py) and
the capacity search (search.py); and fleets of replicas behind routers (fleet.py, routers.py,
fleet_sweep.py; docs/cluster.md)."""
