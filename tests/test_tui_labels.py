"""What the TUI's panels say is whole and unambiguous: the fleet's figures are never cut, a
running queue longer than max_num_seqs says why it may be, the KV map labels sequences past 99
by their whole id, vLLM's null block is drawn as what it is, and no event type runs into its text."""
from pathlib import Path

from textual.geometry import Region
from textual.widgets import Static

from test_tui import opened, record
from tracengine.cli.main import main
from tracengine.replay.fold import Fold
from tracengine.tui.trace_index import EVENT_TYPE_NAMES
from tracengine.tui.widgets.block_map import GUTTER, BlockMap
from tracengine.tui.widgets.event_list import EventList

GOLDEN = Path(__file__).parent.parent / "traces"
DATA = Path(__file__).parent / "data"


def block_cells(app, width: int) -> list[str]:
    """Each block's cell as the KV map draws it (`width` characters each), in block order."""
    block_map = app.query_one(BlockMap)
    per_row = block_map.cells_per_row
    cells = []
    for y in range(-(-app.view.state.num_blocks // per_row)):
        line = block_map.render_line(y).text[GUTTER:]
        cells += [line[i:i + width] for i in range(0, len(line), width)][:per_row]
    return cells[:app.view.state.num_blocks]


async def test_the_fleet_figures_are_shown_whole(tmp_path):
    """The replica table is wider than a fixed dialog: its cells came out cut ("2,087.…")."""
    from tracengine.tui.fleet_app import FleetTraceApp, FleetView
    path = tmp_path / "fleet.trace"
    assert main(["simulate", "--num-prompts", "12", "--step-time", str(DATA / "fixed_steptime.json"),
                 "--set", "num_kvcache_blocks=200", "--replicas", "4", "--router", "prefix_aware",
                 "--record", str(path), "--quiet"]) == 0
    view = FleetView(path)
    index = view.index(0)
    try:
        app = FleetTraceApp(index, view, 0)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("F")
            await pilot.pause()
            text = app.screen.query(Static).last()
            lines = [strip.text for strip in text.render_lines(Region(0, 0, *text.size))]
            shown = "\n".join(lines)
            assert "…" not in shown, shown
            for title in ("requests", "prompt tokens", "completion tokens", "TTFT p99 ms", "preemptions"):
                assert title in shown, shown
    finally:
        index.close()
        view.close()


async def test_a_running_queue_over_max_num_seqs_says_it_caps_a_step():
    # default_mix (max_num_seqs 8): step 3's prefill adds to the sequences already running
    path = GOLDEN / "default_mix.trace"
    assert len(Fold.from_trace(path).state_at(3).running) == 10
    app, running = opened(path)
    async with running as pilot:
        await app.workers.wait_for_complete()
        app.go(3)
        await pilot.pause()
        assert app.query_one("#running").border_title == "Running (10 > max_num_seqs 8: a per-step cap)"
        app.go(0)
        await pilot.pause()
        assert app.query_one("#running").border_title == f"Running ({len(app.view.state.running)})"


async def test_the_kv_map_labels_sequences_past_99_by_their_whole_id(tmp_path):
    # one short request a step: seq 103 runs long after seq 3, and the map must not call both "03"
    path = record(tmp_path / "many.trace", [(step, 5, 2) for step in range(120)])
    fold = Fold.from_trace(path)
    step = next(s for s in range(fold.num_steps) if any(o >= 100 for b in fold.state_at(s).blocks for o in b.owners))
    app, running = opened(path)
    async with running as pilot:
        await app.workers.wait_for_complete()
        app.go(step)
        await pilot.pause()
        cells = block_cells(app, 4)          # three digits and a marker
        for block in app.view.state.blocks:
            if block.owners:
                assert cells[block.block_id].startswith(f"{block.owners[0]:03d}"), (block, cells)
        assert app.query_one(BlockMap).border_subtitle.startswith("NNN seq")


async def test_vllms_null_block_is_drawn_as_null_and_counted_apart():
    app, running = opened(GOLDEN / "vllm.trace")
    async with running as pilot:
        await app.workers.wait_for_complete()
        app.go(3)
        await pilot.pause()
        state = app.view.state
        cells = block_cells(app, 3)
        assert cells[0] == "▪▪ " and not state.blocks[0].owners and 0 not in state.free_block_ids
        used = sum(1 for b in state.blocks if b.owners)
        assert app.query_one(BlockMap).border_title.startswith(
            f"KV blocks: {used} used, 1 null, {state.num_free_blocks} free")


async def test_every_event_type_name_is_set_apart_from_its_text():
    # hash_ids_v7.trace holds PromptBlocksHashed, the longest event type name
    app, running = opened(GOLDEN / "hash_ids_v7.trace")
    async with running as pilot:
        await app.workers.wait_for_complete()
        app.go(app.index.find_step("PromptBlocksHashed", -1, 1))
        await pilot.pause()
        events = app.query_one(EventList)
        words = [events.render_line(y).text.split()[1] for y in range(events.scrollable_content_region.height)]
        assert "PromptBlocksHashed" in words
        assert set(words) <= set(EVENT_TYPE_NAMES)
