"""The TUI: open a recorded trace, move through it with keys and mouse, and
check what the panels show against the fold's state at that step."""
import os
import threading
from pathlib import Path

import pytest

from helpers import cut_like_a_kill
from tracengine.analysis.stats import stats
from tracengine.analysis.timeline import load
from tracengine.cli import main
from tracengine.engine.config import Config
from tracengine.trace.events import BlockAllocate, Preempt, SeqFinish
from tracengine.engine.llm_engine import LLMEngine
from tracengine.replay.fold import Fold
from tracengine.sim.runners import SyntheticRunner
from tracengine.engine.sampling_params import SamplingParams
from tracengine.trace.tracelog import TraceReader, TraceWriter, make_header
from tracengine.cli.engine_commands import open_index
from tracengine.tui.app import TraceApp
from tracengine.tui.screens import HelpScreen, NumberPrompt, RunFiguresScreen
from tracengine.tui.seq_view import SeqScreen
from tracengine.analysis.render import describe_event
from tracengine.tui.trace_index import TraceIndex
from tracengine.tui.widgets.block_map import GUTTER, BlockMap
from tracengine.tui.widgets.event_list import NAME_WIDTH, EventList
from tracengine.tui.widgets.header import Explanation, TraceHeaderBar
from tracengine.tui.widgets.queues import SeqTable, format_row

SIZE = (120, 40)
SNAPSHOTS = Path(__file__).parent / "snapshots" / "tui"
EOS = 999
# (arrival step, prompt tokens, max tokens). Budget 20 and 14 blocks of 4: the
# 25-token prompt is chunked, the 30-token one blocks the head of waiting, and
# decode runs out of blocks, preempting the running tail and, once, itself.
WORKLOAD = [(0, 25, 10), (0, 8, 16), (0, 6, 16), (0, 7, 16), (4, 30, 4), (4, 9, 6), (8, 5, 5), (8, 14, 3)]


def recording(path, workload=WORKLOAD):
    """Records the workload step by step; yields after each step."""
    config = Config(num_kvcache_blocks=14, kvcache_block_size=4, max_num_batched_tokens=20,
                    max_num_seqs=4, max_model_len=128, eos=EOS)
    with TraceWriter(path, make_header(config)) as writer:
        engine = LLMEngine(config, SyntheticRunner(eos=EOS), writer)
        pending = list(workload)
        while pending or not engine.is_finished():
            while pending and pending[0][0] <= engine.num_steps:
                _, n, max_tokens = pending.pop(0)
                prompt = [1 + (engine.next_seq_id * 37 + j) % 900 for j in range(n)]
                engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
            engine.step()
            yield engine.num_steps


def record(path, workload=WORKLOAD):
    for _ in recording(path, workload):
        pass
    return path


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return record(tmp_path_factory.mktemp("tui") / "run.trace")


@pytest.fixture(scope="module")
def fold(trace):
    return Fold.from_trace(trace)


def steps_with(fold, kind) -> list[int]:
    return [s for s in range(fold.num_steps) if any(isinstance(e, kind) for e in fold.events_at(s))]


def opened(trace, size=SIZE, follow=False):
    app = TraceApp(TraceIndex(trace), follow=follow)
    return app, app.run_test(size=size)


def shown_state(app):
    """What the panels show, in the fold's terms."""
    waiting, running = app.query_one("#waiting", SeqTable), app.query_one("#running", SeqTable)
    return waiting.seq_ids, running.seq_ids, waiting.row_texts(), running.row_texts()


def assert_panels_match(app, fold, step):
    state = fold.state_at(step)
    waiting, running, waiting_rows, running_rows = shown_state(app)
    assert app.step == step
    assert (waiting, running) == (state.waiting, state.running)
    # each row's age: from the request's arrival to the end of the step, on the stats' time axis
    t = load(app.index.path)

    def row(i):
        return format_row(state.seqs[i], t.end_ns(step) - t.arrival_ns(t.requests[i]))
    assert waiting_rows == [row(i) for i in state.waiting]
    assert running_rows == [row(i) for i in state.running]
    header = str(app.query_one(TraceHeaderBar).render())
    assert f"step {step} of {app.num_steps}" in header
    assert f" · t {t.start_ns(step) / 1e6:,.3f} ms (+" in header
    assert state.decision.phase.upper() in header
    assert_block_cells(app, state)
    assert_event_lines(app, fold, step)


def assert_block_cells(app, state):
    """Each cell's label is its owner's whole id, `+` marks a shared block, `░░` a free hashed
    one (an SGLang slot the radix tree holds), `▪▪` vLLM's null block or SGLang's padding slot
    (block 0 of their traces)."""
    block_map = app.query_one(BlockMap)
    per_row, width = block_map.cells_per_row, block_map.cell_width
    digits = width - 1
    shown = []
    for y in range(-(-state.num_blocks // per_row)):
        line = block_map.render_line(y).text[GUTTER:]
        shown += [line[i:i + width] for i in range(0, len(line), width)][:per_row]
    for block in state.blocks:
        cell = shown[block.block_id]
        if block.owners:
            assert cell == f"{block.owners[0]:0{digits}d}" + ("+" if block.ref_count > 1 else " ")
        elif app.index.header.engine in ("vllm", "sglang") and block.block_id == 0:    # vLLM's null block,
            assert cell == "▪" * digits + " "                                          # SGLang's padding slot
        elif state.hash_to_block_id.get(block.hash) == block.block_id:
            assert cell == "░" * digits + " "
        else:
            assert cell == "·" * digits + " "


def assert_event_lines(app, fold, step):
    """The step's events are listed (at the top unless the list ends first), one line each."""
    events = app.query_one(EventList)
    first = app.index.event_start(step) - round(events.scroll_y)
    assert 0 <= first < events.scrollable_content_region.height
    for y, event in enumerate(fold.events_at(step), start=first):
        if y < events.scrollable_content_region.height:
            shown = events.render_line(y).text.rstrip()
            assert shown == f"{step:>7} {type(event).__name__:<{NAME_WIDTH}}{describe_event(event)}"[:len(shown)]


def style_at(strip, x):
    for segment in strip:
        if x < len(segment.text):
            return segment.style
        x -= len(segment.text)
    raise IndexError(x)


def explanation(app) -> str:
    return str(app.query_one(Explanation).render())


async def test_opens_at_the_first_step_and_steps_forward_and_back(trace, fold):
    app, running = opened(trace)
    async with running as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.num_steps == fold.num_steps
        assert_panels_match(app, fold, 0)
        header = str(app.query_one(TraceHeaderBar).render())
        assert "run.trace ·" in header and os.sep + "run.trace" not in header   # the file name, not its path
        await pilot.press("right", "right", "right")
        assert_panels_match(app, fold, 3)
        await pilot.press("left")
        assert_panels_match(app, fold, 2)
        await pilot.press("plus")
        assert_panels_match(app, fold, 12)
        await pilot.press("minus", "minus")      # clamped at the first step
        assert_panels_match(app, fold, 0)
        await pilot.press("end")
        assert_panels_match(app, fold, fold.num_steps - 1)
        await pilot.press("right")               # clamped at the last step
        assert app.step == fold.num_steps - 1
        await pilot.press("home")
        assert app.step == 0


async def test_explains_chunked_prefill_blocking_and_preemption(trace, fold):
    app, running = opened(trace)
    async with running as pilot:
        # the seeds' worked example: budget 20, the 25-token head is chunked
        assert explanation(app).startswith("chunked prefill: seq 0 got 20 of 25 tokens")
        await pilot.press("right")
        assert explanation(app).startswith("prefill seq 0 got its last 5 of 25 tokens, seq 1 (8 tokens)")
        # 5 + 8 + 6 = 19 of 20: the next head does not fit and may not be chunked
        assert explanation(app).endswith("stopped at seq 3: 1 token of budget left and only the first seq "
                                         "of a step may be chunked (chunk gate)")
        for step in range(fold.num_steps):
            decision = fold.state_at(step).decision
            if decision.blocked_seq_id >= 0 and decision.stop_reason != "chunk_gate":
                break
        free = fold.state_at(step - 1).num_free_blocks if decision.phase == "decode" else decision.num_free_blocks
        app.go(step)
        await pilot.pause()
        assert (f"head seq {decision.blocked_seq_id} needs {decision.num_blocks_needed} blocks, {free} free "
                f"(head-of-line blocking)") in explanation(app)
        kinds = set()
        for step in steps_with(fold, Preempt):
            app.go(step)
            await pilot.pause()
            for p in (e for e in fold.events_at(step) if isinstance(e, Preempt)):
                if p.seq_id == p.by_seq_id:
                    kinds.add("itself")
                    assert f"seq {p.seq_id} needed a block and no other seq was left to preempt" in explanation(app)
                else:
                    kinds.add("running tail")
                    assert f"seq {p.by_seq_id} needed a block; preempted seq {p.seq_id} (running tail)" in explanation(app)
        assert kinds == {"itself", "running tail"}


GOLDEN = Path(__file__).parent.parent / "traces"


async def test_the_seeds_worked_example_is_explained_step_by_step():
    """Budget 20; prompts 25, 8, 6 (traces/worked_example.trace, recorded from the real engine)."""
    app, running = opened(GOLDEN / "worked_example.trace")
    async with running as pilot:
        assert explanation(app) == "chunked prefill: seq 0 got 20 of 25 tokens; the token budget of 20 tokens is used up"
        await pilot.press("right")
        # 5 + 8 + 6 = 19 tokens, and nothing is left waiting
        assert explanation(app) == ("prefill seq 0 got its last 5 of 25 tokens, seq 1 (8 tokens), seq 2 (6 tokens), "
                                    "19 tokens in all; waiting queue empty")
        await pilot.press("right")
        assert explanation(app) == "decode: 3 seqs, 1 token each"


@pytest.mark.parametrize("name", ["worked_example", "preemption", "default_mix", "hash_ids", "mixed", "vllm"])
async def test_golden_traces_show_what_the_fold_says(name):
    path = GOLDEN / f"{name}.trace"
    fold = Fold.from_trace(path)
    steps = sorted({0, fold.num_steps - 1, *steps_with(fold, Preempt)[:4], *steps_with(fold, BlockAllocate)[:4]})
    app, running = opened(path)
    async with running as pilot:
        await app.workers.wait_for_complete()
        for step in steps:
            app.go(step)
            await pilot.pause()
            assert_panels_match(app, fold, step)


async def test_next_and_previous_preemption_and_event_type(trace, fold):
    preempts, finishes = steps_with(fold, Preempt), steps_with(fold, SeqFinish)
    assert len(preempts) >= 2
    app, running = opened(trace)
    async with running as pilot:
        for step in preempts:
            await pilot.press("p")
            assert_panels_match(app, fold, step)
        await pilot.press("P")
        assert app.step == preempts[-2]
        await pilot.press("t")                  # choose the event type n/N jump to
        await pilot.press("down", "down", "enter")     # from Preempt, past TokenSample
        assert app.event_type == "SeqFinish"
        await pilot.press("home", "n", "n")
        assert app.step == finishes[1]
        await pilot.press("N")
        assert app.step == finishes[0]


async def test_go_to_a_step_by_dialog_and_by_typing_its_number(trace, fold):
    app, running = opened(trace)
    async with running as pilot:
        await pilot.press("g")
        assert isinstance(app.screen, NumberPrompt)
        await pilot.press("left", "1", "7", "enter")       # keys reach the input, not the app
        assert_panels_match(app, fold, 17)
        await pilot.press("9", "enter")                    # typing a number opens the same dialog
        assert_panels_match(app, fold, 9)
        await pilot.press("g", "escape")
        assert app.step == 9 and not isinstance(app.screen, NumberPrompt)


async def test_mouse_on_the_timeline_and_the_event_list(trace, fold):
    app, running = opened(trace)
    async with running as pilot:
        # one column per step: column 6 is step 6 (the border takes the first cell)
        await pilot.click("#timeline", offset=(1 + 6, 3))
        assert_panels_match(app, fold, 6)
        await pilot.click("#events", offset=(5, 1 + len(fold.events_at(6))))   # the first event of step 7
        assert app.step == 7


async def test_select_a_sequence_highlights_it_and_opens_its_life(trace, fold):
    preempt = next(e for s in steps_with(fold, Preempt) for e in fold.events_at(s) if isinstance(e, Preempt))
    app, running = opened(trace)
    async with running as pilot:
        app.go(preempt.step - 1)
        await pilot.pause()
        state = fold.state_at(preempt.step - 1)
        assert preempt.seq_id in state.running
        row = state.running.index(preempt.seq_id)
        await pilot.click("#running", offset=(3, 2 + row))   # border, column header, then rows
        assert app.selected_seq_id == preempt.seq_id
        block_map = app.query_one(BlockMap)
        selected_style = block_map.get_component_rich_style("block-map--selected")
        other = next(b for b in state.blocks if b.owners and preempt.seq_id not in b.owners)
        y, x = divmod(other.block_id, block_map.cells_per_row)
        await pilot.click("#blocks", offset=(1 + GUTTER + 3 * x, 1 + y))      # a cell selects its holder
        assert app.selected_seq_id == other.owners[0]
        await pilot.click("#running", offset=(3, 2 + row))
        assert selected_style.reverse
        for block in state.blocks:
            y, x = divmod(block.block_id, block_map.cells_per_row)
            style = style_at(block_map.render_line(y), GUTTER + 3 * x)
            assert bool(style.reverse) == (preempt.seq_id in block.owners)
        await pilot.press("o")
        assert isinstance(app.screen, SeqScreen)
        lines = [text for _, text in app.screen.lines]
        assert lines[0].startswith(f"arrives with {state.seqs[preempt.seq_id].num_prompt_tokens} prompt tokens")
        assert any(text.startswith("preempted for") for text in lines)
        assert any(text.startswith("recompute") for text in lines)
        assert lines[-1].startswith("finishes (length)")
        await pilot.press("end", "enter")       # the last line: its finish step
        assert app.step == fold.state_at(fold.num_steps - 1).seqs[preempt.seq_id].finish_step
        await pilot.press("home", "right_square_bracket")   # its next milestone: arrival or first prefill
        assert app.step == min(m.step for m in app.index.milestones(preempt.seq_id) if m.step > 0)


async def test_select_a_sequence_by_number_and_help(trace, fold):
    app, running = opened(trace)
    async with running as pilot:
        await pilot.press("s", "2", "enter")
        assert app.selected_seq_id == 2
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("right")               # stepping keys are off while a dialog is open
        assert app.step == 0
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_run_figures_are_the_stats_of_the_trace(trace, fold):
    # one set of run figures: the TUI's are `tracengine stats`' own
    app, running = opened(trace)
    async with running as pilot:
        await app.workers.wait_for_complete()
        await pilot.press("i")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, RunFiguresScreen)
        assert app.screen.figures == stats(trace)
        await pilot.press("escape")
        assert not isinstance(app.screen, RunFiguresScreen)


async def test_border_titles_are_stored_as_textuals_own_setter_stores_them(trace):
    # set_titles writes Textual's private title to repaint one row: it must read back as the public one
    app, running = opened(trace)
    async with running as pilot:
        waiting = app.query_one("#waiting", SeqTable)
        waiting.set_titles("Waiting [b](3)[/b]", "s1 s2")
        ours = (waiting.border_title, waiting.border_subtitle, waiting._border_title, waiting._border_subtitle)
        waiting.border_title, waiting.border_subtitle = "Waiting [b](3)[/b]", "s1 s2"
        await pilot.pause()
        assert ours == (waiting.border_title, waiting.border_subtitle, waiting._border_title,
                        waiting._border_subtitle)
        assert waiting.border_title == "Waiting [b](3)[/b]"


async def test_the_collector_is_tuned_once_and_given_back(trace):
    import gc
    before = gc.get_threshold()
    app, running = opened(trace)
    async with running as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert gc.get_threshold() == (10_000, 50, 1_000) and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


async def test_play_advances_and_stops_at_the_end(trace, fold):
    app, running = opened(trace)
    async with running as pilot:
        app.speed = 1
        await pilot.press("space")
        assert app.playing
        app.speed = 100
        for _ in range(500):
            if not app.playing:
                break
            await pilot.pause(0.02)
        assert not app.playing and app.step == fold.num_steps - 1


@pytest.fixture(scope="module")
def fixed_time_trace(tmp_path_factory, trace):
    """The same run with every step lasting 1 ms after no gap, each request arriving as
    its step began: the screenshots show times on the trace's axis, never measured ones."""
    import msgspec
    from tracengine.trace.events import RequestAdded, StepEnd
    from tracengine.trace.tracelog import open_trace
    path = tmp_path_factory.mktemp("tui-fixed") / "run.trace"
    events = list(open_trace(trace))
    with TraceWriter(path, events[0]) as writer:
        for e in events[1:]:
            if type(e) is StepEnd:
                e = msgspec.structs.replace(e, schedule_ns=100_000, model_ns=800_000, postprocess_ns=100_000, gap_ns=0)
            elif type(e) is RequestAdded:
                e = msgspec.structs.replace(e, arrival_ns=-1)
            writer.emit(e)
    return path


@pytest.mark.parametrize("moment", ["start", "preemption", "end"])
async def test_screenshots(fixed_time_trace, snapshot, moment):
    snapshot.snapshot_dir = SNAPSHOTS
    app, running = opened(fixed_time_trace)
    async with running as pilot:
        await app.workers.wait_for_complete()
        if moment == "preemption":
            await pilot.press("p")
        elif moment == "end":
            await pilot.press("end")
        await pilot.pause()
        snapshot.assert_match(app.export_screenshot(), f"{moment}.svg")


async def test_small_terminal_still_works(trace, fold):
    app, running = opened(trace, size=(30, 12))
    async with running as pilot:
        await pilot.press("right", "p", "question_mark", "escape", "end")
        assert app.step == fold.num_steps - 1
        assert "run.trace" in app.export_screenshot()
        # 36 steps in 30 columns (no border on a short screen): two steps per column
        await pilot.click("#timeline", offset=(5, 1))
        assert app.step == 10


async def until(pilot, condition):
    for _ in range(250):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError("the app did not catch up with the file")


async def test_follow_shows_new_steps_as_another_writer_appends(tmp_path, fold):
    path = tmp_path / "live.trace"
    writer = recording(path)
    for _ in range(3):
        next(writer)
    app, running = opened(path, follow=True)
    async with running as pilot:
        assert app.step == 2 and app.at_tail
        assert "● LIVE at the newest step" in str(app.query_one(TraceHeaderBar).render())
        for _ in range(5):
            next(writer)
        await until(pilot, lambda: app.num_steps == 8)
        assert_panels_match(app, fold, 7)            # the view moved to the newest step
        await pilot.press("left")                    # stepping back stops following the tail
        next(writer)
        await until(pilot, lambda: app.num_steps == 9)
        assert app.step == 6 and not app.at_tail
        assert "End: back to the newest step" in str(app.query_one(TraceHeaderBar).render())
        await pilot.press("end")
        for _ in writer:
            pass
        await until(pilot, lambda: app.num_steps == fold.num_steps)
        assert_panels_match(app, fold, fold.num_steps - 1)
        # The writer closed the trace: its end frame turns LIVE off.
        await until(pilot, lambda: not app.live)
        header = str(app.query_one(TraceHeaderBar).render())
        assert "LIVE" not in header and "recording ended" in header and app.indexed_all


async def test_follow_waits_out_a_torn_frame(tmp_path, fold, trace):
    """A frame half written (the writer is in the middle of it) is not an
    error: the view shows it once it is complete."""
    data = trace.read_bytes()
    with TraceReader(trace) as reader:
        frames = reader.frames()
    live = tmp_path / "live.trace"

    def written(num_steps, extra=0):
        end = frames[num_steps + 1].offset if num_steps + 1 < len(frames) else len(data)
        with open(live, "ab") as f:
            f.write(data[os.path.getsize(live):end + extra])

    live.write_bytes(b"")
    written(3)
    app, running = opened(live, follow=True)
    async with running as pilot:
        assert app.step == 2 and app.live and app.at_tail
        written(5, extra=7)                      # steps 3 and 4, and 7 bytes of step 5's frame
        await until(pilot, lambda: app.num_steps == 5)
        await pilot.pause(3 * app.PACING.poll_interval)
        assert app.num_steps == 5 and app.step == 4 and app.note == ""
        written(9)
        await until(pilot, lambda: app.num_steps == 9)
        assert_panels_match(app, fold, 8)


async def test_a_torn_tail_is_reported_and_every_complete_step_shown(tmp_path, fold, trace):
    torn = tmp_path / "torn.trace"
    torn.write_bytes(trace.read_bytes())
    cut_like_a_kill(torn, 5)
    app, running = opened(torn)
    async with running as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.num_steps == fold.num_steps - 1
        assert "torn last frame: " in app.note and app.note.endswith(" not read")


async def test_damage_after_the_start_is_notified_and_earlier_steps_shown(tmp_path, fold, trace):
    data = bytearray(trace.read_bytes())
    with TraceReader(trace) as reader:
        frames = reader.frames()
    damaged = tmp_path / "damaged.trace"
    data[frames[21].offset + 20] ^= 0xFF         # a byte of step 20's frame
    damaged.write_bytes(bytes(data))
    index = TraceIndex(damaged, first_slice=8)
    app = TraceApp(index)
    async with app.run_test(size=SIZE) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.num_steps == 20
        assert "frame 21 fails its checksum" in app.note


def header_only(path):
    TraceWriter(path, make_header(Config(num_kvcache_blocks=8, kvcache_block_size=4))).close()
    return path.read_bytes()


@pytest.mark.parametrize("content, message", [
    (None, "no such trace"),
    (b"not a trace at all", "not a tracengine trace"),
    (b"TRCE\x01\x00\x00\x00", "the file ends inside its header frame"),
    (header_only, "no complete step to show"),
])
def test_unreadable_trace_is_a_one_line_error_before_the_app_starts(tmp_path, capsys, content, message):
    path = tmp_path / "bad.trace"
    if callable(content):
        content = content(tmp_path / "header.trace")
    if content is not None:
        path.write_bytes(content)
    assert main(["tui", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracengine: error: ") and message in err and err.count("\n") == 1


def test_following_waits_for_the_recording_to_start(tmp_path, trace):
    path = tmp_path / "starting.trace"
    timer = threading.Timer(0.2, lambda: path.write_bytes(trace.read_bytes()))
    timer.start()
    index = open_index(str(path), follow=True)
    timer.join()
    assert index.num_steps > 0
    index.close()


@pytest.mark.parametrize("name", ["sglang", "sglang_overlap"])
async def test_an_sglang_traces_kv_panel_draws_its_token_pool_and_radix_cache(name):
    """traces/sglang.trace (SGLang's scheduler, no SGLang needed to read it) and its overlap loop's:
    a cell per token-pool slot, each as the fold of SGLang's rules leaves it at every step
    (replay/sglang_fold.py, held to the live scheduler's pool and tree in tests/test_sglang.py):
    the requests' slots, shared where the radix cache matched a prefix, the tree's slots no
    request holds, the padding slot."""
    trace = Path(__file__).resolve().parents[1] / "traces" / f"{name}.trace"
    fold = Fold.from_trace(trace)
    kinds = set()
    app, running = opened(trace)
    async with running as pilot:
        await pilot.pause()
        for step in range(fold.num_steps):
            assert app.step == step
            state = fold.state_at(step)
            assert state.num_blocks == app.index.header.config["max_total_tokens"] + 1
            assert_block_cells(app, state)
            kinds |= {"shared" if b.ref_count > 1 else "owned" if b.owners else "tree" if b.hash != -1 else "free"
                      for b in state.blocks[1:]}
            await pilot.press("right")
            await pilot.pause()
    assert kinds == {"shared", "owned", "tree", "free"}


def test_replay_state_of_an_sglang_trace_folds_its_token_pool(capsys):
    """`replay --state` on an SGLang trace needs no SGLang: the fold of its token pool. A request
    aborted while running (s3, at step 4) is finished, not running, though SGLang decodes it once
    more before its abort's result is processed."""
    trace = Path(__file__).resolve().parents[1] / "traces" / "sglang.trace"
    assert main(["replay", str(trace), "--state", "5"]) == 0
    out = capsys.readouterr().out
    running = out.split("running:\n")[1].split("finished")[0]
    assert out.startswith("state after step 5: 5 waiting, 6 running, 205 of 401 blocks free (block size 1)")
    assert "s3 " not in running and "finished (1): s3:abort@4" in out
