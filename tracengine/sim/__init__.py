"""Simulation: the real scheduler in simulated time, with no model. The simulated engine
(engine.py), step-time models (steptime.py, roofline.py), the runners that stand in for a
model (runners.py) and sweeps over configs (sweep.py)."""
