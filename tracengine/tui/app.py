"""`tracengine tui run.trace [--follow]`: step through a recorded run.

The app owns the cursor (`step`, `selected_seq_id`) and the folded state at
the cursor (`view`) as reactives; each panel is bound to what it shows and
renders it. Panels send messages up; the app sets attributes down. A thread
worker indexes the trace in slices (and, with --follow, keeps tailing it),
posting `Indexed` messages that replace each other."""
import gc
import threading
import time

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import var
from textual.widgets import Footer

from tracengine.tui.indexer import Pacing, read_in_background
from tracengine.tui.screens import EventTypePicker, HelpScreen, NumberPrompt, RunFiguresScreen
from tracengine.tui.seq_view import SeqScreen, life_lines, life_summary
from tracengine.tui.trace_index import EVENT_TYPE_NAMES, StepView, TraceIndex
from tracengine.tui.widgets.block_map import BlockMap
from tracengine.tui.widgets.cpu_tier import CpuTierPanel, tier_capacity
from tracengine.tui.widgets.event_list import EventList
from tracengine.tui.widgets.header import Explanation, TraceHeaderBar
from tracengine.tui.widgets.queues import SeqTable
from tracengine.tui.widgets.timeline import Timeline
from tracengine.replay.sglang_fold import PADDING_SLOT
from tracengine.replay.vllm_fold import NULL_BLOCK_ID
from tracengine.trace.header import SGLANG, VLLM, backend_of

SPEEDS = (1, 2, 5, 10, 25, 50, 100)   # steps per second when playing


def with_cpu_tier(block_map: BlockMap, header) -> ComposeResult:
    """The KV block map, and beside it the CPU tier's panel where the trace has a tier."""
    capacity = tier_capacity(header)
    if not capacity:
        yield block_map
        return
    with Horizontal(id="tiers"):
        yield block_map
        yield CpuTierPanel(capacity, id="cpu-tier").data_bind(TraceApp.view)


def null_block_id(header) -> int:
    """The block no sequence ever holds: vLLM's null block, SGLang's padding slot (-1: none)."""
    return {VLLM: NULL_BLOCK_ID, SGLANG: PADDING_SLOT}.get(backend_of(header), -1)


class TraceApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "tracengine"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (90, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    PACING = Pacing()

    BINDINGS = [
        Binding("right,l", "step(1)", "Step", key_display="→", priority=True),
        Binding("left,h", "step(-1)", "Back", key_display="←", priority=True),
        Binding("plus,equals_sign", "step(10)", "+10", key_display="+"),
        Binding("minus", "step(-10)", "-10", key_display="-"),
        Binding("home", "first", "First step", show=False, priority=True),
        Binding("end", "last", "Last step (and follow a live trace)", show=False, priority=True),
        Binding("g", "goto", "Go to step"),
        Binding("p", "preemption(1)", "Next preemption"),
        Binding("P", "preemption(-1)", "Previous preemption", show=False),
        Binding("t", "choose_type", "Choose event type", show=False),
        Binding("n", "event(1)", "Next event of the chosen type", show=False),
        Binding("N", "event(-1)", "Previous event of the chosen type", show=False),
        Binding("s", "select_seq", "Select a sequence", show=False),
        Binding("right_square_bracket", "milestone(1)", "Next step in the selected sequence's life",
                key_display="]", show=False),
        Binding("left_square_bracket", "milestone(-1)", "Previous step in the selected sequence's life",
                key_display="[", show=False),
        Binding("o", "open_seq", "Seq life"),
        Binding("space", "play", "Play/pause"),
        Binding("greater_than_sign", "speed(1)", "Play faster", key_display=">", show=False),
        Binding("less_than_sign", "speed(-1)", "Play slower", key_display="<", show=False),
        Binding("i", "run_figures", "Run figures (tracengine stats) of the steps read so far", show=False),
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        *(Binding(str(d), f"goto('{d}')", "Type a step number", show=False) for d in range(10)),
    ]
    # actions that move the cursor or open a dialog: not while a dialog is open
    MAIN_ONLY = {"step", "first", "last", "goto", "preemption", "choose_type", "event", "select_seq",
                 "milestone", "open_seq", "play", "speed", "help", "run_figures"}

    # `var`: the app itself draws nothing, the panels bound to these repaint themselves
    step = var(0)
    num_steps = var(0)
    view: var[StepView | None] = var(None)
    selected_seq_id = var(-1)
    event_type = var("Preempt")
    live = var(False)        # following a file that is being written
    at_tail = var(False)     # ... and staying at its newest step
    playing = var(False)
    speed = var(10)
    note = var("")
    indexed_all = var(False)   # the worker has read the whole file (following: up to its end frame)

    class Indexed(Message):
        """The worker has folded the trace up to `num_steps`."""

        def __init__(self, num_steps: int, done: bool = False):
            super().__init__()
            self.num_steps = num_steps
            self.done = done

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, TraceApp.Indexed)

    class IndexFailed(Message):
        """The worker met damage it cannot read past."""

        def __init__(self, message: str):
            super().__init__()
            self.message = message

    def __init__(self, index: TraceIndex, follow: bool = False):
        super().__init__()
        self.index = index
        self.follow = follow
        self._play_timer = None
        self._stop = threading.Event()
        self._moved_at = 0.0      # monotonic time of the last move, read by the indexer
        self._gc_threshold = None   # the collector's setting before the app changed it
        self._frozen_steps = -1     # the steps folded when the collector last froze them
        # what the first slice holds, set before the panels are bound so the first frame shows it
        num_steps = index.num_steps
        step = num_steps - 1 if follow else 0
        self.set_reactive(TraceApp.live, follow)
        self.set_reactive(TraceApp.at_tail, follow)
        self.set_reactive(TraceApp.num_steps, num_steps)
        self.set_reactive(TraceApp.step, max(0, step))
        self.set_reactive(TraceApp.view, index.view_at(step) if num_steps else None)

    def compose(self) -> ComposeResult:
        header = self.index.header
        yield TraceHeaderBar(self.index.name, header, id="header").data_bind(
            TraceApp.view, TraceApp.num_steps, TraceApp.live, TraceApp.at_tail, TraceApp.playing,
            TraceApp.speed, TraceApp.note)
        yield Explanation(id="explanation").data_bind(TraceApp.view)
        yield Timeline(self.index, id="timeline").data_bind(TraceApp.step, TraceApp.num_steps)
        with Horizontal(id="panels"):
            with Vertical(id="queues"):
                yield SeqTable("waiting", id="waiting").data_bind(TraceApp.view, TraceApp.selected_seq_id)
                yield SeqTable("running", id="running", max_num_seqs=header.config.get("max_num_seqs")).data_bind(
                    TraceApp.view, TraceApp.selected_seq_id)
            with Vertical(id="state"):
                block_map = BlockMap(null_block_id(header), id="blocks").data_bind(
                    TraceApp.view, TraceApp.selected_seq_id)
                yield from with_cpu_tier(block_map, header)
                yield EventList(self.index, id="events").data_bind(TraceApp.step, TraceApp.num_steps,
                                                                   TraceApp.event_type)
        yield Footer()

    def on_ready(self) -> None:
        # What the UI makes while moving (strips, states) is short-lived: collect it young,
        # and leave the full passes that stall a seek for tens of ms to rare occasions.
        # Set once for the app's life; the process's own setting comes back at unmount.
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(10_000, 50, 1_000)
        self.index_trace()      # the first frame is on screen: index the rest meanwhile

    def on_unmount(self) -> None:
        self._stop.set()
        if self._gc_threshold is not None:
            gc.unfreeze()
            gc.set_threshold(*self._gc_threshold)

    # -- the cursor -------------------------------------------------------------------------------

    def validate_step(self, step: int) -> int:
        return max(0, min(step, self.num_steps - 1))

    def watch_step(self, step: int) -> None:
        if self.num_steps:
            self.view = self.index.view_at(step)

    def watch_num_steps(self, num_steps: int) -> None:
        if not num_steps:
            return
        if self.at_tail:
            self.step = num_steps - 1
        if self.view is None:
            self.view = self.index.view_at(self.step)

    def go(self, step: int) -> None:
        """Every move the user makes; stepping back from the newest step stops following it."""
        if not self.num_steps:
            return
        self._moved_at = time.monotonic()
        self.step = step
        self.at_tail = self.live and self.step == self.num_steps - 1

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in self.MAIN_ONLY and len(self.screen_stack) > 1:
            return False
        return True

    def action_step(self, delta: int) -> None:
        self.go(self.step + delta)

    def action_first(self) -> None:
        self.go(0)

    def action_last(self) -> None:
        self.go(self.num_steps - 1)

    def action_goto(self, typed: str = "") -> None:
        def done(step: int | None) -> None:
            if step is not None:
                self.go(step)
        self.push_screen(NumberPrompt(f"Go to step (0–{max(0, self.num_steps - 1)})", typed), done)

    def _jump(self, step: int | None, what: str) -> None:
        if step is None:
            self.notify(f"no {what}", timeout=3)
        else:
            self.go(step)

    def action_preemption(self, direction: int) -> None:
        self._jump(self.index.find_step("Preempt", self.step, direction),
                   "later preemption" if direction > 0 else "earlier preemption")

    def action_choose_type(self) -> None:
        def done(name: str | None) -> None:
            if name is not None:
                self.event_type = name
        self.push_screen(EventTypePicker(EVENT_TYPE_NAMES, self.event_type), done)

    def action_event(self, direction: int) -> None:
        self._jump(self.index.find_step(self.event_type, self.step, direction),
                   f"{'later' if direction > 0 else 'earlier'} {self.event_type}")

    # -- sequences ----------------------------------------------------------------------------------

    def action_select_seq(self) -> None:
        def done(seq_id: int | None) -> None:
            if seq_id is None:
                return
            if self.index.milestones(seq_id):
                self.selected_seq_id = seq_id
            else:
                self.notify(f"no seq {seq_id} in the steps read so far", severity="warning", timeout=3)
        self.push_screen(NumberPrompt("Select sequence (its blocks and rows are highlighted)"), done)

    def action_milestone(self, direction: int) -> None:
        if self.selected_seq_id < 0:
            self.notify("select a sequence first (s, or click it)", timeout=3)
            return
        steps = [m.step for m in self.index.milestones(self.selected_seq_id)]
        later = [s for s in steps if s > self.step] if direction > 0 else [s for s in steps if s < self.step]
        self._jump((min(later) if direction > 0 else max(later)) if later else None,
                   f"{'later' if direction > 0 else 'earlier'} step in seq {self.selected_seq_id}'s life")

    def action_open_seq(self) -> None:
        if self.selected_seq_id < 0:
            self.notify("select a sequence first (s, or click it)", timeout=3)
            return
        self.open_seq(self.selected_seq_id)

    def open_seq(self, seq_id: int) -> None:
        last = self.num_steps - 1
        seq = self.index.state_at(last).seqs.get(seq_id)
        if seq is None:
            self.notify(f"no seq {seq_id} in the steps read so far", severity="warning", timeout=3)
            return
        self.selected_seq_id = seq_id

        def done(step: int | None) -> None:
            if step is not None:
                self.go(step)
        milestones = self.index.milestones(seq_id)
        self.push_screen(SeqScreen(life_summary(seq, milestones), life_lines(seq_id, milestones, last)), done)

    # -- play ------------------------------------------------------------------------------------------

    def action_play(self) -> None:
        self.playing = not self.playing

    def action_speed(self, delta: int) -> None:
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else 0
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + delta))]

    def watch_playing(self, playing: bool) -> None:
        if self._play_timer is not None:
            self._play_timer.stop()
            self._play_timer = None
        if playing:
            self._play_timer = self.set_interval(1 / self.speed, self._advance)

    def watch_speed(self) -> None:
        if self.playing:
            self.watch_playing(True)

    def _advance(self) -> None:
        if self.step < self.num_steps - 1:
            self.go(self.step + 1)
        elif self.indexed_all:
            self.playing = False     # the end; a live or still indexing trace waits for more

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    @work(thread=True, exclusive=True, group="figures")
    def action_run_figures(self) -> None:
        num_steps = self.index.num_steps
        figures = self.index.run_figures()
        title = f"{self.index.name}: steps 0–{num_steps - 1}" if num_steps else f"{self.index.name}: no step yet"
        self.call_from_thread(self.push_screen, RunFiguresScreen(figures, title))

    # -- messages from the panels -------------------------------------------------------------------

    @on(Timeline.Selected)
    @on(EventList.Selected)
    def _go_to_selected_step(self, message: Timeline.Selected | EventList.Selected) -> None:
        self.go(message.step)

    @on(SeqTable.Selected)
    @on(BlockMap.Selected)
    def _select_seq(self, message: SeqTable.Selected | BlockMap.Selected) -> None:
        self.selected_seq_id = message.seq_id

    @on(SeqTable.Opened)
    def _open_seq(self, message: SeqTable.Opened) -> None:
        self.open_seq(message.seq_id)

    # -- indexing and following ---------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="index")
    def index_trace(self) -> None:
        read_in_background(self.index, self.follow, self._stop, lambda: self._moved_at,
                           report=lambda num_steps, done: self.post_message(self.Indexed(num_steps, done)),
                           fail=lambda message: self.post_message(self.IndexFailed(message)),
                           pacing=self.PACING)

    def on_trace_app_indexed(self, message: Indexed) -> None:
        if message.num_steps > self._frozen_steps:
            # What this slice folded lives as long as the app: keep it out of the cycle
            # collector's full passes, which would otherwise pause the screen for most of a
            # second. Each slice adds such objects, so each is frozen (a list splice, O(1)).
            gc.freeze()
            self._frozen_steps = message.num_steps
        self.num_steps = message.num_steps
        if message.done:
            self.indexed_all = True
            if self.live:   # the writer closed the trace: nothing more will come
                self.live = self.at_tail = False
                self.note = "recording ended"
                return
            tail = self.index.torn_tail
            self.note = tail or ""
            if tail:
                self.notify(f"{self.index.name}: {self.note}", severity="warning", timeout=5)
        elif not self.follow:
            self.note = f"indexing… {message.num_steps:,} steps so far"

    def on_trace_app_index_failed(self, message: IndexFailed) -> None:
        self.indexed_all = True
        self.note = message.message
        self.notify(message.message, title="trace damaged", severity="error", timeout=10)
