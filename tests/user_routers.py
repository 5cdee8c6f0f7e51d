"""Routers of one's own, loaded by import path in tests/test_fleet.py."""
from tracengine.fleet.routers import RoundRobin, Router


class LastReplica(Router):
    """Every request to the pool's last replica."""

    def route(self, request, replicas):
        return [float(len(replicas) - i) for i in range(len(replicas))]


class RoundRobinButSeven(RoundRobin):
    """round_robin, but request s7 goes where round_robin would send the next one: a planted
    routing change at one request."""

    def route(self, request, replicas):
        scores = super().route(request, replicas)
        if request.seq_id == 7:
            scores = [(s - 1) % len(replicas) for s in scores]
        return scores
