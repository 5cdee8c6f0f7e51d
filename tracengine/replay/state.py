"""The state of the scheduler and the block manager at one step, as values:
what `Fold.state_at` returns, what the TUI draws, and what a live scheduler
looks like in the same terms (`live_state`), so the two can be compared."""
from bisect import bisect_right

import msgspec

from tracengine.trace.events import ScheduleDecision

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


class SeqState(msgspec.Struct, gc=False):
    seq_id: int
    status: str
    num_prompt_tokens: int
    num_tokens: int
    num_cached_tokens: int = 0
    num_scheduled_tokens: int = 0   # tokens computed in this state's step, else 0
    block_table: list[int] = []
    num_preemptions: int = 0
    arrival_step: int = -1
    first_token_step: int = -1
    finish_step: int = -1
    finish_reason: str = ""
    # speculative decoding: the drafts proposed after its last step, which its next step verifies
    draft_token_ids: list[int] = []

    @property
    def num_completion_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    def _copy(self) -> "SeqState":
        return msgspec.structs.replace(self, block_table=list(self.block_table), draft_token_ids=list(self.draft_token_ids))


class BlockState(msgspec.Struct, frozen=True, gc=False):
    block_id: int
    ref_count: int
    hash: int            # -1: none
    owners: list[int]    # seq ids whose block table holds the block, ascending
    group: int = 0       # the KV cache group of the tables that hold it (a vLLM hybrid model's)


class CpuTierState:
    """The CPU tier after `step`: how many blocks it holds, the sequences set aside while they
    load (seq_id -> (first block, blocks)), and, on demand, the hashes it holds."""
    __slots__ = ("step", "num_blocks", "loading", "_history")

    def __init__(self, step: int = -1, num_blocks: int = 0, loading=None, history=None):
        self.step, self.num_blocks = step, num_blocks
        self.loading: dict[int, tuple[int, int]] = loading or {}
        self._history = history or {}

    @property
    def block_hashes(self) -> list[int]:
        """The blocks the tier holds, by hash, in the order they were first stored."""
        step = self.step
        return [h for h, steps in self._history.items() if bisect_right(steps, step) % 2 == 1]


class FoldState:
    """The state after `step` completed (step -1: before the first step)."""
    __slots__ = ("step", "waiting", "running", "seqs", "ref_counts", "hashes", "free_block_ids",
                 "hash_to_block_id", "decision", "block_size", "in_flight", "cpu", "group_tables", "_blocks")

    def __init__(self, step, waiting, running, seqs, ref_counts, hashes, free_block_ids, hash_to_block_id,
                 decision, block_size, in_flight=(), cpu: CpuTierState | None = None):
        self.step: int = step
        self.waiting: list[int] = waiting
        self.running: list[int] = running
        self.seqs: dict[int, SeqState] = seqs
        self.ref_counts: list[int] = ref_counts
        self.hashes: list[int] = hashes
        self.free_block_ids: list[int] = free_block_ids
        self.hash_to_block_id: dict[int, int] = hash_to_block_id
        self.decision: ScheduleDecision | None = decision
        self.block_size: int = block_size
        # Mid-step only (a live scheduler stopped inside a step): unfinished sequences
        # out of both queues, e.g. the one being scheduled, or a victim being preempted.
        self.in_flight: list[int] = list(in_flight)
        self.cpu: CpuTierState = cpu if cpu is not None else CpuTierState(step)   # the second KV tier
        # a vLLM hybrid model's KV cache groups past the first: group -> seq_id -> its blocks there
        # (a sequence's block_table is its first group's); empty for one group
        self.group_tables: dict[int, dict[int, list[int]]] = {}
        self._blocks = None

    @property
    def num_blocks(self) -> int:
        return len(self.ref_counts)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def blocks(self) -> list[BlockState]:
        if self._blocks is None:
            owners: list[list[int]] = [[] for _ in self.ref_counts]
            for seq_id in sorted(self.waiting + self.running + self.in_flight):
                for block_id in self.seqs[seq_id].block_table:
                    owners[block_id].append(seq_id)
            if self.group_tables:
                return self._group_blocks(owners)
            self._blocks = [BlockState(i, rc, h, o) for i, (rc, h, o)
                            in enumerate(zip(self.ref_counts, self.hashes, owners))]
        return self._blocks

    def _group_blocks(self, owners: list[list[int]]) -> list[BlockState]:
        groups = [0] * len(owners)
        for group, tables in sorted(self.group_tables.items()):
            for seq_id, table in sorted(tables.items()):
                for block_id in table:
                    owners[block_id].append(seq_id)
                    groups[block_id] = group
        self._blocks = [BlockState(i, rc, h, o, g) for i, (rc, h, o, g)
                        in enumerate(zip(self.ref_counts, self.hashes, owners, groups))]
        return self._blocks

    def __repr__(self):
        return (f"FoldState(step={self.step}, waiting={self.waiting}, running={self.running}, "
                f"num_free_blocks={self.num_free_blocks})")


def live_state(scheduler, step: int, known_seqs=()) -> FoldState:
    """A live scheduler's queues and block pool as a FoldState. Its sequences
    only, since a scheduler forgets finished ones (and knows no arrival steps);
    of `known_seqs`, those unfinished but in neither queue are `in_flight`."""
    bm = scheduler.block_manager
    status = {"WAITING": WAITING, "RUNNING": RUNNING, "FINISHED": FINISHED}
    queued = {seq.seq_id for seq in (*scheduler.waiting, *scheduler.running)}
    in_flight = [seq for seq in known_seqs if seq.seq_id not in queued and not seq.is_finished]
    seqs = {}
    for seq in (*scheduler.waiting, *scheduler.running, *in_flight):
        seqs[seq.seq_id] = SeqState(seq.seq_id, status[seq.status.name], seq.num_prompt_tokens, seq.num_tokens,
                                    seq.num_cached_tokens, seq.num_scheduled_tokens, list(seq.block_table),
                                    seq.num_preemptions, finish_reason=seq.finish_reason,
                                    draft_token_ids=list(seq.spec_token_ids))
    tier = getattr(scheduler, "cpu_tier", None)
    cpu = CpuTierState(step, len(tier.held), dict(tier.loads), {h: [step] for h in tier.held}) \
        if tier is not None else None
    return FoldState(step, [s.seq_id for s in scheduler.waiting], [s.seq_id for s in scheduler.running], seqs,
                     bm.ref_counts, bm.hashes, list(bm.free_block_ids),
                     dict(bm.hash_to_block_id), None, bm.block_size, sorted(s.seq_id for s in in_flight), cpu)
