"""A scheduler queue (waiting or running) at the current step, in queue
order, one line per sequence with its counters. Line API: only the visible
rows are rendered, whatever the queue's length. The table scrolls itself
(the cursor, the wheel) instead of sizing a virtual canvas, so a queue that
grows or shrinks as the cursor moves never makes the screen lay out again."""
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from tracengine.tui.trace_index import StepView
from tracengine.tui.widgets.styles import ComponentStyles

HEADER = f"{'seq':>6}{'prompt':>7}{'out':>5}{'cached':>7}{'sched':>6}{'blocks':>7}{'pre':>4}{'age ms':>9}"


def format_row(seq, age_ns: int | None = None, num_blocks: int | None = None) -> str:
    """One sequence: prompt and completion tokens, cached tokens, tokens
    scheduled this step, blocks held (`num_blocks`, a hybrid model's in every
    KV cache group; else its block table's), preemptions so far, and its age: the
    time from its arrival to the end of the step, on the trace's time axis."""
    num_blocks = len(seq.block_table) if num_blocks is None else num_blocks
    preempted = str(seq.num_preemptions) if seq.num_preemptions else "-"
    age = "-" if age_ns is None else f"{age_ns / 1e6:,.1f}"
    return (f"{seq.seq_id:>6}{seq.num_prompt_tokens:>7}{seq.num_tokens - seq.num_prompt_tokens:>5}"
            f"{seq.num_cached_tokens:>7}{seq.num_scheduled_tokens or '-':>6}{num_blocks:>7}{preempted:>4}"
            f"{age:>9}")


def blocks_held(state, seq_id: int) -> int:
    """A sequence's blocks in every KV cache group (a vLLM hybrid model's groups past the first
    are the fold's group_tables; one group: its block table)."""
    return len(state.seqs[seq_id].block_table) + sum(len(tables.get(seq_id, ())) for tables in state.group_tables.values())


def view_row(view: StepView, seq_id: int) -> str:
    state = view.state
    return format_row(state.seqs[seq_id], view.age_ns.get(seq_id) if view.age_ns else None,
                      blocks_held(state, seq_id))


class SeqTable(ComponentStyles, Widget, can_focus=True):
    COMPONENT_CLASSES = {"seq-table--header", "seq-table--cursor", "seq-table--selected", "seq-table--scheduled"}
    DEFAULT_CSS = """
    SeqTable > .seq-table--header { text-style: bold; color: $text-muted; }
    SeqTable > .seq-table--cursor { background: $accent 40%; }
    SeqTable > .seq-table--selected { background: $secondary 40%; text-style: bold; }
    SeqTable > .seq-table--scheduled { color: $text; text-style: bold; }
    """
    BINDINGS = [
        Binding("up", "move_cursor(-1)", "Up", show=False),
        Binding("down", "move_cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("enter", "open", "Open sequence", show=False),
    ]

    # the watchers repaint the rows that changed
    view: reactive[StepView | None] = reactive(None, repaint=False)
    selected_seq_id = reactive(-1, repaint=False)
    cursor = reactive(0)
    top = reactive(0)          # the queue position of the first row shown

    class Selected(Message):
        """The user picked a sequence in a queue."""

        def __init__(self, seq_id: int):
            super().__init__()
            self.seq_id = seq_id

    class Opened(Message):
        """The user asked for a sequence's whole life."""

        def __init__(self, seq_id: int):
            super().__init__()
            self.seq_id = seq_id

    def __init__(self, queue: str, max_num_seqs: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.queue = queue            # "waiting" or "running"
        self.max_num_seqs = max_num_seqs if isinstance(max_num_seqs, int) else 0
        self.seq_ids: list[int] = []
        self.set_titles(queue.capitalize(), None)

    @property
    def num_rows(self) -> int:
        """Sequences that fit below the column header."""
        return max(1, self.size.height - 1)

    def watch_view(self, view: StepView | None) -> None:
        if view is None:
            self.seq_ids = []
        else:
            self.seq_ids = view.state.waiting if self.queue == "waiting" else view.state.running
        self._follow_selection()
        self._clamp()
        self._refresh_rows()

    def watch_selected_seq_id(self) -> None:
        self._follow_selection()
        self._refresh_rows()

    def watch_top(self) -> None:
        self._update_titles()

    def _update_titles(self) -> None:
        n, rows = len(self.seq_ids), self.num_rows
        # nano-vllm's rule (prefill_first) caps the sequences a step schedules at max_num_seqs, not
        # the running queue: a prefill step adds up to that many to those already running
        over = f" > max_num_seqs {self.max_num_seqs}: a per-step cap" if 0 < self.max_num_seqs < n else ""
        self.set_titles(f"{self.queue.capitalize()} ({n}{over})",
                        f"{self.top + 1}–{min(n, self.top + rows)} of {n}" if n > rows else "")

    def _row_key(self, row: int) -> tuple:
        """What a row shows: its text and which of the row styles it has."""
        seq = self.view.state.seqs[self.seq_ids[row]]
        return (view_row(self.view, seq.seq_id), bool(seq.num_scheduled_tokens), seq.seq_id == self.selected_seq_id,
                row == self.cursor and self.has_focus)

    def _refresh_rows(self) -> None:
        """Repaint the rows that show something else now (stepping changes few of the waiting ones)."""
        rows = range(self.top, min(len(self.seq_ids), self.top + self.num_rows)) if self.view is not None else ()
        self.refresh_rows(((HEADER,), *(self._row_key(row) for row in rows)), (self.size, self.top))

    def on_resize(self) -> None:
        self._clamp()

    def watch_cursor(self) -> None:
        self.forget_rows()       # the reactive repaints them all

    def _clamp(self) -> None:
        self.top = max(0, min(self.top, len(self.seq_ids) - self.num_rows))
        self._update_titles()

    def _follow_selection(self) -> None:
        if self.selected_seq_id in self.seq_ids:
            self.cursor = self.seq_ids.index(self.selected_seq_id)
            self._show_cursor()
        else:
            self.cursor = min(self.cursor, max(0, len(self.seq_ids) - 1))

    def _show_cursor(self) -> None:
        if self.cursor < self.top:
            self.top = self.cursor
        elif self.cursor >= self.top + self.num_rows:
            self.top = self.cursor - self.num_rows + 1

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            return Strip([Segment(HEADER.ljust(width), self.component_style("seq-table--header"))]).crop(0, width)
        row = self.top + y - 1
        view, seq_ids = self.view, self.seq_ids
        if view is None or row >= len(seq_ids):
            return Strip.blank(width)
        seq = view.state.seqs[seq_ids[row]]
        style = Style()
        if seq.num_scheduled_tokens:
            style += self.component_style("seq-table--scheduled")
        if seq.seq_id == self.selected_seq_id:
            style += self.component_style("seq-table--selected")
        if row == self.cursor and self.has_focus:
            style += self.component_style("seq-table--cursor")
        return Strip([Segment(view_row(view, seq.seq_id).ljust(width), style)]).crop(0, width)

    def row_texts(self) -> list[str]:
        """The rows as shown (all of them, not only the visible ones)."""
        if self.view is None:
            return []
        return [view_row(self.view, seq_id) for seq_id in self.seq_ids]

    def on_focus(self) -> None:
        self.forget_rows()
        self.refresh()

    def on_blur(self) -> None:
        self.forget_rows()
        self.refresh()

    def action_move_cursor(self, delta: int) -> None:
        if not self.seq_ids:
            return
        self.cursor = max(0, min(len(self.seq_ids) - 1, self.cursor + delta))
        self._show_cursor()
        self.post_message(self.Selected(self.seq_ids[self.cursor]))

    def action_page(self, direction: int) -> None:
        self.action_move_cursor(direction * self.num_rows)

    def action_open(self) -> None:
        if self.seq_ids:
            self.post_message(self.Opened(self.seq_ids[self.cursor]))

    def on_mouse_scroll_down(self, event) -> None:
        event.stop()
        self.top = min(self.top + 1, max(0, len(self.seq_ids) - self.num_rows))

    def on_mouse_scroll_up(self, event) -> None:
        event.stop()
        self.top = max(0, self.top - 1)

    def on_click(self, event) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y == 0:
            return
        row = self.top + offset.y - 1
        if row < len(self.seq_ids):
            self.cursor = row
            self.post_message(self.Selected(self.seq_ids[row]))
            if event.chain >= 2:
                self.post_message(self.Opened(self.seq_ids[row]))
