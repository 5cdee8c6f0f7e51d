"""Recording from the real engine (the embedded model on the CPU): every event
type of the contract in a consistent order, the fold of the events alone
equal to the engine's own block manager after every step, `generate --record`
then `check`, and a recording process killed with SIGKILL."""
import collections
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_tracelog import wait_for_frames
from tracengine import LLM, SamplingParams
from tracengine.cli import main
from tracengine.trace.events import (CPU_TIER_EVENT_TYPES, EVENT_TYPES, FLEET_EVENT_TYPES, HASH_ID_EVENT_TYPES, SPEC_EVENT_TYPES, VLLM_EVENT_TYPES,
                               BlockAllocate, BlockAppend, BlockFree, BlockHash, Preempt, RequestAdded,
                               ScheduleDecision, SeqFinish, StepEnd, TokenSample, TraceHeader)
from tracengine.replay.fold import Fold
from tracengine.trace.tracelog import TraceReader, open_trace

REPO = Path(__file__).resolve().parents[1]
BLOCK_SIZE = 4
# 12 blocks of 4 tokens, a budget of 16, 4 sequences at a time
CONFIG = dict(num_kvcache_blocks=12, kvcache_block_size=BLOCK_SIZE, max_num_batched_tokens=16, max_num_seqs=4)
PREFIX = list(range(500, 508))          # two blocks shared by seqs 0, 1 and 4


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


# (prompt, max_tokens); greedy and ignoring EOS, so the schedule does not depend on the tokens:
# seq 0 (20 tokens) is chunked 16 + 4; seq 1 hits seq 0's two prefix blocks; seq 2 (7 blocks)
# blocks the head of waiting with seq 3 behind it, later preempts itself, and its recompute
# hits its own cached blocks; seq 3 preempts the running tail, seq 4; seq 4 hits the prefix again.
REQUESTS = [(PREFIX + tokens(100, 12), 6), (PREFIX + tokens(200, 4), 10), (tokens(300, 28), 4), (tokens(400, 4), 3),
            (PREFIX + tokens(600, 2), 12)]
ARRIVALS = {0: [0], 2: [1, 2, 3], 6: [4]}    # step -> requests added before it, for the step-by-step run


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    engine = LLM("", **CONFIG)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def generated(llm, tmp_path_factory):
    """The workload through `generate(..., record=path)`; its events."""
    path = tmp_path_factory.mktemp("generated") / "run.trace"
    llm.generate([prompt for prompt, _ in REQUESTS], [params(n) for _, n in REQUESTS], record=str(path),
                 use_tqdm=False)
    return list(open_trace(path))


def snapshot(llm) -> dict:
    """What the engine's own scheduler and block manager hold now."""
    scheduler = llm.scheduler
    bm = scheduler.block_manager
    live = (*scheduler.waiting, *scheduler.running)
    return dict(num_free_blocks=bm.num_free_blocks, free_block_ids=list(bm.free_block_ids),
                ref_counts=[b.ref_count for b in bm.blocks], hashes=[b.hash for b in bm.blocks],
                hash_to_block_id=dict(bm.hash_to_block_id),
                waiting=[s.seq_id for s in scheduler.waiting], running=[s.seq_id for s in scheduler.running],
                block_tables={s.seq_id: list(s.block_table) for s in live},
                num_cached_tokens={s.seq_id: s.num_cached_tokens for s in live},
                num_tokens={s.seq_id: s.num_tokens for s in live})


def folded(state) -> dict:
    """The same, from a fold of the events alone."""
    live = state.waiting + state.running
    return dict(num_free_blocks=state.num_free_blocks, free_block_ids=list(state.free_block_ids),
                ref_counts=list(state.ref_counts), hashes=list(state.hashes),
                hash_to_block_id=dict(state.hash_to_block_id), waiting=list(state.waiting),
                running=list(state.running),
                block_tables={i: list(state.seqs[i].block_table) for i in live},
                num_cached_tokens={i: state.seqs[i].num_cached_tokens for i in live},
                num_tokens={i: state.seqs[i].num_tokens for i in live})


@pytest.fixture(scope="module")
def stepped(llm, tmp_path_factory):
    """The workload driven step by step, requests arriving at ARRIVALS; the
    trace and a snapshot of the engine's state after every step."""
    path = tmp_path_factory.mktemp("stepped") / "run.trace"
    llm.start_recording(str(path))
    snapshots = []
    try:
        while len(snapshots) <= max(ARRIVALS) or not llm.is_finished():
            for i in ARRIVALS.get(llm.num_steps, ()):
                prompt, max_tokens = REQUESTS[i]
                llm.add_request(prompt, params(max_tokens))
            llm.step()
            snapshots.append(snapshot(llm))
    finally:
        llm.stop_recording()
    return path, snapshots


def test_every_event_type_and_scheduling_behaviour_is_recorded(generated):
    assert type(generated[0]) is TraceHeader
    assert {type(e).__name__ for e in generated} == set(EVENT_TYPES) - {"SeqAbort", "RunEnd"} - FLEET_EVENT_TYPES - HASH_ID_EVENT_TYPES - VLLM_EVENT_TYPES \
        - SPEC_EVENT_TYPES - CPU_TIER_EVENT_TYPES   # only a server aborts; one engine; it finished
    decisions = [e for e in generated if type(e) is ScheduleDecision]
    assert {"budget_exhausted", "no_free_blocks"} <= {d.stop_reason for d in decisions}   # chunking, head-of-line
    assert any(type(e) is TokenSample and not e.kept for e in generated)                  # a middle chunk
    assert any(type(e) is BlockAllocate and e.num_cached_blocks > 0 for e in generated)   # prefix-cache hits
    preempts = [e for e in generated if type(e) is Preempt]
    assert any(p.by_seq_id == p.seq_id for p in preempts) and any(p.by_seq_id != p.seq_id for p in preempts)
    finishes = [e for e in generated if type(e) is SeqFinish]
    assert sorted(f.seq_id for f in finishes) == list(range(len(REQUESTS)))
    assert [(f.num_prompt_tokens, f.num_completion_tokens) for f in sorted(finishes, key=lambda f: f.seq_id)] == \
        [(len(prompt), n) for prompt, n in REQUESTS]


def test_one_decision_and_one_step_end_per_step_from_zero(generated):
    by_step = collections.defaultdict(list)
    for event in generated[1:]:
        by_step[event.step].append(type(event))
    assert list(by_step) == list(range(len(by_step)))       # contiguous from 0, in order
    for step, types in by_step.items():
        assert types.count(ScheduleDecision) == 1 and types.count(StepEnd) == 1, step
        assert types[-1] is StepEnd
        added = types.count(RequestAdded)
        assert types[:added] == [RequestAdded] * added       # requests enter before the step's decisions


def test_allocation_frees_and_hashes_follow_the_schedule(generated):
    """Allocation before the first prefill of a sequence, a BlockFree for every
    finish and every preemption, a BlockHash for every block that fills."""
    tables: dict[int, list[int]] = {}         # seq -> its block table while it holds blocks
    num_hashed: dict[int, int] = {}           # seq -> leading blocks of its table that are hashed
    num_computed: dict[int, int] = {}         # seq -> tokens in its KV cache after its last step
    allocated_this_step: set[int] = set()
    releasing: dict[int, list[int]] = {}      # seq -> the blocks its finish or preemption must free
    num_frees = 0
    for event in generated[1:]:
        match event:
            case BlockAllocate(seq_id=seq_id, block_ids=block_ids, num_cached_blocks=num_cached):
                assert seq_id not in tables
                tables[seq_id] = list(block_ids)
                num_hashed[seq_id] = num_cached       # cached blocks keep their hashes
                allocated_this_step.add(seq_id)
            case BlockAppend(seq_id=seq_id, block_id=block_id):
                tables[seq_id].append(block_id)
            case ScheduleDecision(phase=phase, seqs=seqs):
                scheduled = {s.seq_id for s in seqs}
                assert scheduled <= set(tables)                    # every scheduled sequence holds blocks
                assert allocated_this_step <= scheduled and phase == "prefill" if allocated_this_step else True
                for s in seqs:
                    num_computed[s.seq_id] = s.num_cached_tokens + s.num_tokens
                allocated_this_step = set()
            case BlockHash(seq_id=seq_id, block_id=block_id):
                assert block_id == tables[seq_id][num_hashed[seq_id]]   # the next block of its table
                num_hashed[seq_id] += 1
            case Preempt(seq_id=seq_id, freed_block_ids=freed):
                assert freed == tables[seq_id][::-1]
                releasing[seq_id] = freed
            case SeqFinish(seq_id=seq_id):
                assert num_hashed[seq_id] == num_computed[seq_id] // BLOCK_SIZE
                releasing[seq_id] = tables[seq_id][::-1]
            case BlockFree(seq_id=seq_id, block_ids=block_ids):
                assert block_ids == releasing.pop(seq_id)          # only at a finish or a preemption
                del tables[seq_id]
                num_frees += 1
            case StepEnd():
                assert not releasing                               # each finish and preemption freed its blocks
                for seq_id in tables:
                    if seq_id in num_computed:
                        # every block that filled is hashed by the end of the step
                        assert num_hashed[seq_id] == num_computed[seq_id] // BLOCK_SIZE, (event.step, seq_id)
    assert not tables
    num_preempts = sum(type(e) is Preempt for e in generated)
    assert num_frees == len(REQUESTS) + num_preempts


def test_fold_reproduces_the_engine_after_every_step(stepped):
    path, snapshots = stepped
    fold = Fold.from_trace(path)
    assert fold.num_steps == len(snapshots)
    for step, live in enumerate(snapshots):
        assert folded(fold.state_at(step)) == live, f"step {step}"
    assert snapshots[-1]["num_free_blocks"] == CONFIG["num_kvcache_blocks"]


def test_step_by_step_recording_has_every_event_type_and_arrivals(stepped):
    events = list(open_trace(stepped[0]))
    assert {type(e).__name__ for e in events} == set(EVENT_TYPES) - {"SeqAbort", "RunEnd"} - FLEET_EVENT_TYPES - HASH_ID_EVENT_TYPES - VLLM_EVENT_TYPES \
        - SPEC_EVENT_TYPES - CPU_TIER_EVENT_TYPES
    added = {e.seq_id: e.step for e in events if type(e) is RequestAdded}
    assert added == {i: step for step, ids in ARRIVALS.items() for i in ids}


def test_generate_record_then_check(tmp_path, capsys):
    path = tmp_path / "cli.trace"
    assert main(["generate", "--record", str(path), "--quiet", "--prompt-lens", "25,8,6", "--max-tokens", "4",
                 "--max-num-batched-tokens", "20", "--ignore-eos", "--temperature", "0", "--block-size", "4",
                 "--num-kvcache-blocks", "64"]) == 0
    assert f"trace        {path}" in capsys.readouterr().out
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"{path}: whole"
    assert "model embedded" in out and "device cpu" in out
    first = next(e for e in open_trace(path) if type(e) is ScheduleDecision)
    assert [(s.seq_id, s.num_tokens) for s in first.seqs] == [(0, 20)]    # the seeds' worked example


def start_long_generate(path, stderr):
    """`generate --record path` in a child process, on 4 requests long enough to be stopped mid-run."""
    argv = [sys.executable, "-m", "tracengine.cli", "generate", "--record", str(path), "--quiet", "--num-prompts", "4",
            "--input-len", "16:32", "--output-len", "1000:1000", "--ignore-eos", "--block-size", "16",
            "--num-kvcache-blocks", "512"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def test_generate_killed_with_sigkill_leaves_a_readable_trace(tmp_path, capsys):
    path = tmp_path / "killed.trace"
    child = start_long_generate(path, stderr=subprocess.DEVNULL)
    try:
        wait_for_frames(path, 6, child, timeout=90)
        assert child.poll() is None, "generate ended before it was killed"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with TraceReader(path) as reader:
        num_steps = reader.num_frames - 1
        torn = reader.torn_tail
        assert reader.corruption is None and num_steps >= 5
    exit_code = main(["check", str(path)])
    out = capsys.readouterr().out
    if torn is None:      # killed between two frames: intact, but never ended (exit 3)
        assert exit_code == 3 and out.splitlines()[-1] == f"{path}: not ended (intact, but no end frame: exit 3)"
    else:                 # killed while writing one
        assert exit_code == 1 and f"torn last frame: {torn.nbytes} bytes at offset {torn.offset}" in out
    assert f"steps: {num_steps} (0..{num_steps - 1})" in out
    assert main(["events", str(path), "--type", "StepEnd"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [int(line.split()[0]) for line in listed] == list(range(num_steps))
    assert [e.step for e in open_trace(path) if type(e) is StepEnd] == list(range(num_steps))


@pytest.mark.parametrize("num_frames", [3, 9])
def test_generate_interrupted_with_sigint_ends_at_the_last_finished_step(tmp_path, capsys, num_frames):
    # Ctrl-C lands in the middle of a step (most of a step is the model): the trace must end
    # at the step before it, closed by the end frame, and replay exactly.
    path = tmp_path / "interrupted.trace"
    child = start_long_generate(path, stderr=subprocess.PIPE)
    try:
        wait_for_frames(path, num_frames, child, timeout=90)
        assert child.poll() is None, "generate ended before it was interrupted"
    finally:
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    assert child.returncode == 130 and err.decode().strip().splitlines()[-1] == "tracengine: interrupted (SIGINT)"
    with TraceReader(path) as reader:
        assert reader.ended and reader.torn_tail is None and reader.corruption is None
        num_steps = sum(1 for e in reader.events() if type(e) is StepEnd)
        assert type(list(reader.read_frame(reader.num_frames - 1))[-1]) is StepEnd   # no half step after it
    assert num_steps >= num_frames - 1
    assert main(["check", str(path)]) == 4            # closed, and says the run was interrupted
    assert capsys.readouterr().out.splitlines()[-1] == f"{path}: interrupted (intact; the run did not finish: exit 4)"
    assert main(["replay", str(path)]) == 0
    assert f"{num_steps} steps" in capsys.readouterr().out
    assert main(["diff", str(path), str(path)]) == 0
