"""Figures and views of a trace from its events alone: the request timeline, stats, the Perfetto export."""
