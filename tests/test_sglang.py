"""SGLang's own scheduler (0.5.23, on the CPU with a stand-in worker) recorded through tracengine's
hooks, re-executed from the trace, and run again under another config (skipped where SGLang is
not installed: scripts/install-sglang-cpu.sh)."""
import importlib.util
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from tracengine.trace.events import BlockAllocate, RequestAdded, ScheduleDecision, SeqAbort, TokenSample
from tracengine.trace.tracelog import write_trace

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")
TRACES = Path(__file__).resolve().parents[1] / "traces"


def shared_prefix_specs(num: int = 8):
    """Prompts of a shared 64-token prefix and their own tails, arriving three a step."""
    from tracengine.sglang.drive import RequestSpec
    return [RequestSpec(f"r{i}", [1, 2, 3, 4, 5, 6, 7, 8] * 8 + [i] * (10 + i), 6 + i % 3, arrival_step=i // 3)
            for i in range(num)]


@pytest.fixture(scope="module")
def prefix_trace():
    from tracengine.sglang.build import default_config
    from tracengine.sglang.drive import record_workload
    return record_workload(default_config(max_total_tokens=300, chunked_prefill_size=64, max_running_requests=6),
                           shared_prefix_specs())


@pytest.fixture(scope="module")
def abort_trace():
    from tracengine.sglang.build import default_config
    from tracengine.sglang.drive import RequestSpec, record_workload
    specs = [RequestSpec(f"r{i}", [5] * 20 + [i] * (20 + i), 60, arrival_step=i) for i in range(8)]
    return record_workload(default_config(max_total_tokens=300, chunked_prefill_size=64, max_running_requests=8),
                           specs, aborts={6: ["r1"], 9: ["r7"]})


def test_prefix_sharing_and_chunked_prefill_replay_exactly(prefix_trace):
    from tracengine.sglang.replay import reexecute
    header = prefix_trace[0]
    assert (header.engine, header.engine_version) == ("sglang", "0.5.23")
    hits = [e for e in prefix_trace if type(e) is BlockAllocate and e.num_cached_blocks]
    assert hits, "the radix cache matched no prefix"
    assert any(type(e) is TokenSample and not e.kept for e in prefix_trace), "no prompt was chunked"
    result = reexecute(prefix_trace)
    assert result.ok and result.num_steps == sum(1 for e in prefix_trace if type(e).__name__ == "StepEnd")


def test_aborts_waiting_and_running_replay_exactly(abort_trace):
    from tracengine.sglang.replay import reexecute
    aborts = [e for e in abort_trace if type(e) is SeqAbort]
    assert [(e.seq_id, e.status) for e in aborts] == [(1, "running"), (7, "waiting")]
    assert reexecute(abort_trace).ok


def test_a_planted_change_is_found_at_its_step(prefix_trace):
    from tracengine.sglang.replay import reexecute
    events = list(prefix_trace)
    i = next(i for i, e in enumerate(events) if type(e) is ScheduleDecision and e.step == 7)
    events[i] = msgspec.structs.replace(events[i], num_batched_tokens=events[i].num_batched_tokens + 1)
    divergence = reexecute(events).divergence
    assert divergence is not None and divergence.step == 7 and divergence.expected == events[i]


def test_recording_changes_no_decision():
    """The same workload through an unrecorded scheduler runs the same batches."""
    from tracengine.sglang.build import build_scheduler, default_config
    from tracengine.sglang.drive import Tokens, record_workload, run
    config = default_config(max_total_tokens=300, chunked_prefill_size=64, max_running_requests=6)
    specs = shared_prefix_specs()
    recorded = [[(s.seq_id, s.num_tokens) for s in e.seqs] for e in record_workload(config, specs)
                if type(e) is ScheduleDecision]
    scheduler = build_scheduler(config, Tokens(specs))
    batches, run_batch = [], scheduler.run_batch
    index = {spec.request_id: i for i, spec in enumerate(specs)}

    def logged(batch, *args, **kwargs):
        lens = batch.extend_lens if batch.forward_mode.is_extend() else [1] * len(batch.reqs)
        batches.append([(index[req.rid], n) for req, n in zip(batch.reqs, lens)])
        return run_batch(batch, *args, **kwargs)
    scheduler.run_batch = logged
    run(scheduler, specs)
    assert batches == recorded


def test_whatif_equals_sglang_run_under_the_new_config(prefix_trace):
    from tracengine.replay.reexecution import _COMPARED
    from tracengine.sglang.build import apply_overrides
    from tracengine.sglang.drive import record_workload
    from tracengine.sglang.whatif import whatif
    for change in ({"chunked_prefill_size": 32}, {"max_total_tokens": 200}):
        result = whatif(prefix_trace, change)
        assert result.changes == [(name, prefix_trace[0].config[name], value) for name, value in change.items()]
        really = record_workload(apply_overrides(prefix_trace[0].config, change), shared_prefix_specs())
        assert [_COMPARED[type(e)](e) for e in result.events[1:]] == [_COMPARED[type(e)](e) for e in really[1:]]
        assert result.events[1:] != prefix_trace[1:]


def test_replay_command_and_its_refusals(tmp_path, capsys, monkeypatch, prefix_trace):
    from tracengine.cli.main import main
    path = tmp_path / "sglang.trace"
    write_trace(path, prefix_trace)
    assert main(["replay", str(path)]) == 0
    assert "reproduced exactly" in capsys.readouterr().out
    other = tmp_path / "other.trace"
    write_trace(other, [msgspec.structs.replace(prefix_trace[0], engine_version="0.0.1")] + prefix_trace[1:])
    assert main(["replay", str(other)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "tracengine: error: the trace was recorded with SGLang 0.0.1; the installed SGLang is 0.5.23 "
        "(a replay needs the recorded version)"]
    assert main(["replay", str(path), "--set", "chunk_size=3"]) == 2
    assert "unknown SGLang config field 'chunk_size'" in capsys.readouterr().err
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert main(["replay", str(path)]) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SGLang is not installed here" in err[0]
    assert main(["stats", str(path)]) == 0      # the commands that read a trace need no SGLang


@pytest.mark.parametrize("name, loop", [("sglang", "normal"), ("sglang_overlap", "overlap")])
def test_the_golden_traces_replay(name, loop):
    from tracengine.sglang.replay import reexecute
    from tracengine.trace.tracelog import TraceReader
    with TraceReader(TRACES / f"{name}.trace") as reader:
        events = list(reader.events())
    assert events[0].config["scheduler_loop"] == loop
    kinds = Counter(type(e).__name__ for e in events)
    assert kinds["SeqAbort"] == 2 and kinds["RequestAdded"] == 12
    assert reexecute(events).ok


def test_check_reads_an_sglang_trace_whole(tmp_path, capsys, prefix_trace):
    """`check` applies SGLang's trace's own rules (no SGLang needed): slots inside the pool, seqs added."""
    from tracengine.cli.main import main
    path = tmp_path / "sglang.trace"
    write_trace(path, prefix_trace)
    assert main(["check", str(path)]) == 0
    bad = list(prefix_trace)
    i = next(i for i, e in enumerate(bad) if type(e) is BlockAllocate)
    bad[i] = msgspec.structs.replace(bad[i], block_ids=[10_000])
    write_trace(tmp_path / "bad.trace", bad)
    assert main(["check", str(tmp_path / "bad.trace")]) == 1
    assert "slot 10000 is outside the token pool of 301" in capsys.readouterr().out


def test_retraction_under_token_pool_pressure_replays_exactly():
    """Requests that may stop at EOS are admitted on SGLang's new-token ratio, not their max_tokens:
    six of them overcommit a 300-slot pool, and a decode that no longer fits retracts one
    (retract_decode, SGLang's preemption), which is admitted again later and recomputed."""
    from tracengine.analysis.stats import stats
    from tracengine.sglang.build import default_config
    from tracengine.sglang.drive import RequestSpec, record_workload
    from tracengine.sglang.replay import reexecute
    from tracengine.trace.events import Preempt
    specs = [RequestSpec(f"r{i}", [7] * 8 + [i] * 30, 80, eos_after=81) for i in range(6)]
    events = record_workload(default_config(max_total_tokens=300, chunked_prefill_size=64, max_running_requests=8,
                                            schedule_conservativeness=0.3), specs)
    preempts = [e for e in events if type(e) is Preempt]
    assert preempts and all(e.freed_block_ids and e.num_computed_tokens for e in preempts)
    resumed = [e for e in events if type(e) is ScheduleDecision and e.resumed_seq_ids]
    assert [e.resumed_seq_ids for e in resumed] == [[p.seq_id] for p in preempts]
    assert resumed[0].step > preempts[0].step
    assert stats(events)["preemption"].num_preemptions == len(preempts)
    assert reexecute(events).ok
    planted = list(events)
    i = planted.index(preempts[0])
    planted[i] = msgspec.structs.replace(preempts[0], seq_id=preempts[0].seq_id + 1)
    divergence = reexecute(planted).divergence
    assert divergence is not None and divergence.step == preempts[0].step and divergence.expected == planted[i]


class LivePool:
    """A sink that keeps, at each StepEnd, SGLang's live token pool: its free slots, the radix
    tree's slots no request holds, and each request's slots."""
    enabled = True

    def __init__(self, scheduler):
        self.scheduler, self.events, self.at_step = scheduler, [], {}

    def emit(self, event):
        self.events.append(event)
        if type(event).__name__ == "StepEnd":
            self.at_step[event.step] = self.live()

    def live(self):
        s = self.scheduler
        allocator = s.token_to_kv_pool_allocator
        free = set(allocator.free_pages.tolist()) | set(allocator.release_pages.tolist())
        batches = (s.running_batch, s.last_batch, s.cur_batch_for_debug)
        reqs = [*s.waiting_queue, *(r for b in batches if b is not None for r in b.reqs)]
        reqs += [s.chunked_req] if s.chunked_req is not None else []
        owned = {s.tracengine.seq_ids[r.rid]: set(s.req_to_token_pool.req_to_token[r.kv.req_pool_idx,
                                                                                      :r.kv.kv_allocated_len].tolist())
                 for r in reqs if not r.finished() and r.kv.req_pool_idx is not None}
        tree = set(s.tree_cache.all_values_flatten().tolist()) - set().union(*owned.values())
        return free, tree, owned


@pytest.mark.parametrize("workload", ["prefix", "aborts", "retraction"])
def test_the_fold_is_sglangs_token_pool_and_radix_tree_at_every_step(workload):
    """What `tui` draws (the fold of SGLang's rules, replay/sglang_fold.py) is SGLang's own pool
    after each step: the same free slots, the tree's slots no request holds, each request's slots."""
    from tracengine.replay.fold import Fold
    from tracengine.sglang.build import build_scheduler, default_config
    from tracengine.sglang.drive import RequestSpec, Tokens, run
    from tracengine.sglang.header import trace_header
    from tracengine.sglang.recorder import record_to, stop_recording
    config, specs, aborts = {
        "prefix": (dict(max_total_tokens=200, chunked_prefill_size=32, max_running_requests=6),
                   shared_prefix_specs(12), {}),
        "aborts": (dict(max_total_tokens=300, chunked_prefill_size=64, max_running_requests=8),
                   [RequestSpec(f"r{i}", [5] * 20 + [i] * (20 + i), 60, arrival_step=i) for i in range(8)],
                   {6: ["r1"], 9: ["r7"]}),
        "retraction": (dict(max_total_tokens=300, chunked_prefill_size=64, schedule_conservativeness=0.3),
                       [RequestSpec(f"r{i}", [7] * 8 + [i] * 30, 80, eos_after=81) for i in range(6)], {}),
    }[workload]
    scheduler = build_scheduler(default_config(**config), Tokens(specs))
    header = trace_header(scheduler)
    pool = LivePool(scheduler)
    record_to(scheduler, pool, header.created_at)
    try:
        run(scheduler, specs, aborts=aborts)
    finally:
        stop_recording(scheduler)
    fold = Fold([header] + pool.events)
    assert len(pool.at_step) == fold.num_steps
    for step, (free, tree, owned) in pool.at_step.items():
        state = fold.state_at(step)
        folded: dict[int, set] = {}
        for block in state.blocks:
            for seq_id in block.owners:
                folded.setdefault(seq_id, set()).add(block.block_id)
        assert set(state.free_block_ids) == free, step
        assert {b.block_id for b in state.blocks if not b.owners and b.hash != -1} == tree, step
        assert folded == {seq_id: slots for seq_id, slots in owned.items() if slots}, step


@pytest.mark.parametrize("workload", ["aborts", "retraction"])
def test_the_overlap_loop_records_and_replays_exactly(workload):
    """event_loop_overlap on the CPU: each step's batch is chosen while the last one's result is
    in flight, and its frame is written whole when its result is processed; the trace replays
    exactly, a planted change is found at its step, the fold follows it, and (where no request
    needs tokens past its recorded output) the what-if to the normal loop is SGLang's normal loop
    really run."""
    from tracengine.replay.fold import Fold
    from tracengine.sglang.build import apply_overrides, default_config
    from tracengine.sglang.drive import RequestSpec, record_workload
    from tracengine.sglang.replay import reexecute
    from tracengine.sglang.whatif import whatif
    from tracengine.trace.events import Preempt, SeqFinish, StepEnd
    if workload == "aborts":
        config = default_config(max_total_tokens=300, chunked_prefill_size=32, scheduler_loop="overlap")
        # r3 and r5 stop at EOS; r1 is aborted running, r7 waiting (a what-if has no tokens past an abort)
        specs = [RequestSpec(f"r{i}", [5] * 20 + [i] * (20 + i), 30, arrival_step=i,
                             eos_after=4 + i % 3 if i in (3, 5) else 0) for i in range(8)]
        drive = {"aborts": {6: ["r1"], 9: ["r7"]}}
    else:
        config = default_config(max_total_tokens=300, chunked_prefill_size=64, schedule_conservativeness=0.3,
                                scheduler_loop="overlap")
        specs = [RequestSpec(f"r{i}", [7] * 8 + [i] * 30, 80, eos_after=81) for i in range(6)]
        drive = {}
    events = record_workload(config, specs, **drive)
    assert events[0].config["scheduler_loop"] == "overlap"
    steps = [e.step for e in events[1:]]
    assert steps == sorted(steps) and [e.step for e in events if type(e) is StepEnd] == list(range(steps[-1] + 1))
    if workload == "aborts":
        assert {e.reason for e in events if type(e) is SeqFinish} >= {"eos", "length"}
        assert sum(1 for e in events if type(e) is SeqAbort) == 2
    else:
        assert any(type(e) is Preempt for e in events)
    assert reexecute(events).ok
    Fold(events)     # every StepEnd's free slots follow from the events before it
    planted = list(events)
    i = next(i for i, e in enumerate(planted) if type(e) is ScheduleDecision and e.step == 7)
    planted[i] = msgspec.structs.replace(planted[i], num_batched_tokens=planted[i].num_batched_tokens + 1)
    divergence = reexecute(planted).divergence
    assert divergence is not None and divergence.step == 7
    if workload == "aborts":
        return      # r1 ran on past its recorded output before its abort took it out of the normal loop
    from tracengine.replay.reexecution import _COMPARED
    normal = whatif(events, {"scheduler_loop": "normal"})
    really = record_workload(apply_overrides(config, {"scheduler_loop": "normal"}), specs)
    assert [_COMPARED[type(e)](e) for e in normal.events[1:]] == [_COMPARED[type(e)](e) for e in really[1:]]


def test_the_schedulers_built_here_have_no_watchdog_to_fire():
    """SGLang's watchdog thread, unfed by the drivers here, would send this process's parent SIGQUIT
    300 s after a run that ended mid-batch (a replay stops after its last step's batch)."""
    from tracengine.sglang.build import NO_WATCHDOG_S, build_scheduler, default_config
    from tracengine.sglang.drive import Tokens
    scheduler = build_scheduler(default_config(), Tokens([]))
    assert scheduler.watchdog.watchdog_timeout == NO_WATCHDOG_S


def test_replay_reports_a_planted_change_with_the_replaying_schedulers_token_slots(tmp_path, capsys, prefix_trace):
    """The divergence report shows SGLang's scheduler as it was where it diverged: its requests'
    token slots are the blocks (of one token) of its pool."""
    from tracengine.cli.main import main
    planted = list(prefix_trace)
    i = next(i for i, e in enumerate(planted) if type(e) is ScheduleDecision and e.step == 7)
    planted[i] = msgspec.structs.replace(planted[i], num_batched_tokens=planted[i].num_batched_tokens + 1)
    path = tmp_path / "planted.trace"
    write_trace(path, planted)
    assert main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert "replay diverges at step 7" in out and "replayed state at the divergence:" in out
    state = out[out.index("replayed state at the divergence:"):]
    assert "of 301 blocks free (block size 1)" in state and "ref 1" in state     # slot 0: the padding slot
