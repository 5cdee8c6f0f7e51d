"""Clients that leave a fleet (fleet/engine.py): a request with an `abort_ns` (a what-if of a
trace that recorded its SeqAbort) leaves as it left the recording, on whichever replica
holds it then, by the rule one simulated engine follows (sim/runners.Departures): at a
replica's step, once the requests routed to it have entered, each request it holds whose
time has come by the step's start is aborted there. A request whose client left while its
KV was in flight to a decode replica leaves that replica at its first step after landing."""
import math

from tracengine.engine.request import Request


class FleetDepartures:
    """The requests that leave, by when; `holder` follows each of them from replica to replica."""

    def __init__(self, requests: list[Request]):
        self._pending = sorted((r.abort_ns, r.seq_id, r.abort_reason) for r in requests if r.abort_ns >= 0)
        self._next = 0
        self._next_due = self._pending[0][0] if self._pending else math.inf
        self._due: dict[int, tuple[int, str]] = {}      # seq_id -> (abort_ns, reason): come due, still held
        self._leaving = {seq_id for _, seq_id, _ in self._pending}
        self.holder: dict[int, int | None] = {}        # seq_id -> the replica routed it; None: in a transfer

    @property
    def num_leaving(self) -> int:
        """The requests whose clients leave, over the run."""
        return len(self._pending)

    def moved(self, seq_id: int, replica: int | None) -> None:
        """`seq_id` was routed to `replica` (None: handed off, its KV in flight)."""
        if seq_id in self._leaving:
            self.holder[seq_id] = replica

    def leaving(self, replica: int, now_ns: int) -> list[tuple[int, str]]:
        """(seq_id, reason) of each request `replica` holds whose time has come by `now_ns`, in
        the order of their times; each is named once."""
        if not self._due and self._next_due > now_ns:
            return []
        pending = self._pending
        while self._next < len(pending) and pending[self._next][0] <= now_ns:
            abort_ns, seq_id, reason = pending[self._next]
            if seq_id in self._leaving:     # not finished first
                self._due[seq_id] = (abort_ns, reason)
            self._next += 1
        self._next_due = pending[self._next][0] if self._next < len(pending) else math.inf
        here = sorted((abort_ns, seq_id, reason) for seq_id, (abort_ns, reason) in self._due.items()
                      if self.holder.get(seq_id) == replica)
        for _, seq_id, _ in here:
            del self._due[seq_id]
        return [(seq_id, reason) for _, seq_id, reason in here]

    def finished(self, seq_id: int) -> None:
        """`seq_id` finished before its client left: nothing to take out."""
        if seq_id in self._leaving:
            self._leaving.discard(seq_id)
            self._due.pop(seq_id, None)
            self.holder.pop(seq_id, None)
