"""Scheduling policies of a user's own, for tests/test_policies.py: loaded by
import path (`user_policies:ShortestFirst`), as a user's module would be."""
from tracengine.engine.policies import MixedScheduler
from tracengine.engine.scheduler import Scheduler


class ShortestFirst(Scheduler):
    """prefill_first, but waiting is served shortest prompt first (docs/policies.md)."""

    def order_waiting(self):
        waiting = self.waiting
        if len(waiting) < 2:
            return
        # a sequence in the middle of a chunked prefill holds its blocks: it stays at the head
        head = [waiting.popleft()] if waiting[0].block_table else []
        rest = sorted(waiting, key=lambda seq: seq.num_tokens)    # stable: FIFO among equals
        waiting.clear()
        waiting.extend(head + rest)


class AtMostTwoRunning(Scheduler):
    """prefill_first that admits nobody while two sequences run."""

    def admit(self, seq):
        return len(self.running) < 2


class MixedPreemptingHead(MixedScheduler):
    """A deliberate change to mixed: the head of the not yet scheduled running sequences
    gives way instead of the tail."""

    def preempt_victim(self, seq):
        return self.running.popleft()
