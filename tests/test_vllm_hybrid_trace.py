"""A kept trace of vLLM's scheduler over a hybrid model's KV cache (traces/vllm_hybrid.trace, made by
`scripts/make_vllm_trace.py --hybrid`: a full-attention group, a 64-token sliding window and a Mamba
group sharing 48 blocks, async scheduling) read by the commands that need no vLLM: check, stats,
render, events, the fold and the TUI's block map. Its re-execution is in tests/test_vllm_kv_groups.py."""
import json
from pathlib import Path

from tracengine.cli import main
from tracengine.replay.fold import Fold
from tracengine.trace.tracelog import TraceReader
from tracengine.tui.widgets.block_map import group_counts
from tracengine.tui.widgets.queues import blocks_held

TRACE = Path(__file__).resolve().parent.parent / "traces" / "vllm_hybrid.trace"


def test_the_header_names_every_group():
    with TraceReader(TRACE) as reader:
        header = reader.header
    assert (header.format_version, header.engine, header.not_recorded) == (13, "vllm", [])
    groups = json.loads(header.config["kv_cache_groups"])
    assert [g["spec"] for g in groups] == ["FullAttentionSpec", "SlidingWindowSpec", "MambaSpec"]
    assert groups[1]["fields"]["sliding_window"] == 64


def test_check_folds_every_group(capsys):
    assert main(["check", str(TRACE)]) == 0
    assert capsys.readouterr().out.endswith(f"{TRACE}: whole\n")


def test_the_fold_keeps_each_groups_tables_and_frees_them_all():
    fold = Fold.from_trace(TRACE, keyframe_interval=32)
    middle = fold.state_at(60)
    assert set(middle.group_tables) == {1, 2}
    running = middle.running[0]
    # the window holds at most 64 tokens' blocks (and the one being written); the full group all of them
    assert len(middle.group_tables[1][running]) <= 64 // 16 + 1 < len(middle.seqs[running].block_table)
    assert len(middle.group_tables[2][running]) <= 2          # Mamba: the last states only
    assert group_counts(middle).startswith(" (group 0: ")
    # the TUI's queue counts a sequence's blocks in every group
    held = len(middle.seqs[running].block_table) + len(middle.group_tables[1][running]) + \
        len(middle.group_tables[2][running])
    assert blocks_held(middle, running) == held > len(middle.seqs[running].block_table)
    last = fold.state_at(fold.num_steps - 1)
    assert last.num_free_blocks == 47 and not any(t for tables in last.group_tables.values() for t in tables.values())


def test_stats_render_and_events_name_the_groups(capsys):
    assert main(["stats", str(TRACE), "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["kv_groups"]
    assert [g["spec"] for g in groups] == ["FullAttentionSpec", "SlidingWindowSpec", "MambaSpec"]
    assert groups[0]["num_skipped_blocks"] == 0 and groups[1]["num_skipped_blocks"] > 0
    assert all(g["num_hit_blocks"] > 0 for g in groups)
    assert main(["render", str(TRACE)]) == 0
    table = capsys.readouterr().out
    assert "s1/g1[hit 5-8" in table and "skip s1/g1-[5]" in table
    assert main(["events", str(TRACE), "--type", "BlockSkip"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all("group=" in line for line in lines if "BlockSkip" in line)
