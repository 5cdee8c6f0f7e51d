"""A kept trace of vLLM's own scheduler (traces/vllm.trace, made by
scripts/make_vllm_trace.py) read by the commands that need no vLLM: check,
stats, render, events, export and the fold. Its re-execution, which needs the
vLLM it names, is in tests/test_vllm.py."""
import json
from pathlib import Path

from tracengine.cli import main
from tracengine.replay.fold import Fold
from tracengine.trace.events import Preempt, SeqAbort
from tracengine.trace.tracelog import TraceReader

TRACE = Path(__file__).resolve().parent.parent / "traces" / "vllm.trace"


def test_the_vllm_trace_names_its_engine_and_config():
    with TraceReader(TRACE) as reader:
        header = reader.header
    assert (header.format_version, header.engine, header.engine_version) == (5, "vllm", "0.33.0")
    assert header.config["num_gpu_blocks"] == 24 and header.config["max_num_batched_tokens"] == 64
    assert header.config["policy"] == "fcfs" and header.config["scheduler_kind"] == "sync"


def test_check_finds_every_event_following(capsys):
    assert main(["check", str(TRACE)]) == 0
    assert capsys.readouterr().out.endswith(f"{TRACE}: whole\n")


def test_the_fold_follows_vllms_block_pool():
    fold = Fold.from_trace(TRACE)
    assert fold.num_steps == 58 and fold.num_blocks == 24
    before = fold.state_at(-1)
    assert before.num_free_blocks == 23 and 0 not in before.free_block_ids   # block 0: vLLM's null block
    preempt = next(e for step in range(fold.num_steps) for e in fold.events_at(step) if type(e) is Preempt)
    state = fold.state_at(preempt.step)
    assert state.seqs[preempt.seq_id].status == "waiting" and state.seqs[preempt.seq_id].num_preemptions == 1
    last = fold.state_at(fold.num_steps - 1)
    assert not last.waiting and not last.running and last.num_free_blocks == 23


def test_render_shows_mixed_steps_hits_and_the_preemption(capsys):
    assert main(["render", str(TRACE)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == ("# vLLM 0.33.0 (sync): max_num_batched_tokens=64 max_num_seqs=8 max_model_len=4096 "
                        "block_size=16 num_gpu_blocks=24 enable_prefix_caching=True policy=fcfs "
                        "long_prefill_token_threshold=0")
    assert table[4] == "   2 mixed   s0:1@49 + s1:24@32 | waiting_empty | arrive s1:56; alloc s1[hit 1 2, 5 6] | free 17"
    assert any("preempt s" in line for line in table)


def test_stats_and_events_count_what_vllm_did(capsys):
    assert main(["stats", str(TRACE), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["trace"]["num_kvcache_blocks"] == 23
    assert main(["events", str(TRACE), "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sum(e["type"] == "Preempt" for e in events) == 1
    assert [e["seq_id"] for e in events if e["type"] == SeqAbort.__name__] == [6]
    added = [e for e in events if e["type"] == "RequestAdded"]
    assert [e["request_id"] for e in added] == [f"chatcmpl-{i}" for i in range(12)]   # seq_ids in arrival order
    assert [e["seq_id"] for e in added] == list(range(12))


def test_export_writes_the_vllm_trace_for_perfetto(tmp_path):
    out = tmp_path / "vllm.json"
    assert main(["export", str(TRACE), "--perfetto", str(out)]) == 0
    assert json.loads(out.read_text())["traceEvents"]
