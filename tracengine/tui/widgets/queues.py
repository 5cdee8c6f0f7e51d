"""A scheduler queue (waiting or running) at the current step, in queue
order, one line per sequence with its counters. Line API: only the visible
rows are rendered, whatever the queue's length."""
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tracengine.tui.trace_index import StepView

HEADER = f"{'seq':>6}{'prompt':>7}{'out':>5}{'cached':>7}{'sched':>6}{'blocks':>7}{'pre':>4}"


def format_row(seq) -> str:
    """One sequence: prompt and completion tokens, cached tokens, tokens
    scheduled this step, blocks held, preemptions so far."""
    preempted = str(seq.num_preemptions) if seq.num_preemptions else "-"
    return (f"{seq.seq_id:>6}{seq.num_prompt_tokens:>7}{seq.num_tokens - seq.num_prompt_tokens:>5}"
            f"{seq.num_cached_tokens:>7}{seq.num_scheduled_tokens or '-':>6}{len(seq.block_table):>7}{preempted:>4}")


class SeqTable(ScrollView, can_focus=True):
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
        Binding("enter", "open", "Open sequence", show=False),
    ]

    view: reactive[StepView | None] = reactive(None)
    selected_seq_id = reactive(-1)
    cursor = reactive(0)

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

    def __init__(self, queue: str, **kwargs):
        super().__init__(**kwargs)
        self.queue = queue            # "waiting" or "running"
        self.seq_ids: list[int] = []
        self.border_title = queue.capitalize()

    def watch_view(self, view: StepView | None) -> None:
        if view is None:
            self.seq_ids = []
        else:
            self.seq_ids = view.state.waiting if self.queue == "waiting" else view.state.running
        self.border_title = f"{self.queue.capitalize()} ({len(self.seq_ids)})"
        self._update_size()
        self._follow_selection()
        self.refresh()

    def _update_size(self) -> None:
        # whole pages, so a queue that grows or shrinks by a few does not redo the screen's layout
        page = max(1, self.scrollable_content_region.height)
        height = -(-(len(self.seq_ids) + 1) // page) * page
        self.virtual_size = Size(len(HEADER), height)

    def on_resize(self) -> None:
        self._update_size()

    def watch_selected_seq_id(self) -> None:
        self._follow_selection()
        self.refresh()

    def watch_cursor(self) -> None:
        self.refresh()

    def _follow_selection(self) -> None:
        if self.selected_seq_id in self.seq_ids:
            self.cursor = self.seq_ids.index(self.selected_seq_id)
            self._scroll_to_cursor()
        else:
            self.cursor = min(self.cursor, max(0, len(self.seq_ids) - 1))

    def _scroll_to_cursor(self) -> None:
        rows = max(1, self.scrollable_content_region.height - 1)
        top = round(self.scroll_y)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + rows:
            self.scroll_to(y=self.cursor - rows + 1, animate=False)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        if y == 0:
            text, style = HEADER, self.get_component_rich_style("seq-table--header")
        else:
            row = y - 1 + scroll_y
            if self.view is None or row >= len(self.seq_ids):
                return Strip.blank(width)
            seq = self.view.state.seqs[self.seq_ids[row]]
            text = format_row(seq)
            style = Style()
            if seq.num_scheduled_tokens:
                style += self.get_component_rich_style("seq-table--scheduled")
            if seq.seq_id == self.selected_seq_id:
                style += self.get_component_rich_style("seq-table--selected")
            if row == self.cursor and self.has_focus:
                style += self.get_component_rich_style("seq-table--cursor")
        text = text.ljust(max(width + scroll_x, len(HEADER)))
        return Strip([Segment(text, style)]).crop(scroll_x, scroll_x + width)

    def row_texts(self) -> list[str]:
        """The rows as shown (all of them, not only the visible ones)."""
        if self.view is None:
            return []
        return [format_row(self.view.state.seqs[seq_id]) for seq_id in self.seq_ids]

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def action_move_cursor(self, delta: int) -> None:
        if not self.seq_ids:
            return
        self.cursor = max(0, min(len(self.seq_ids) - 1, self.cursor + delta))
        self._scroll_to_cursor()
        self.post_message(self.Selected(self.seq_ids[self.cursor]))

    def action_open(self) -> None:
        if self.seq_ids:
            self.post_message(self.Opened(self.seq_ids[self.cursor]))

    def on_click(self, event) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y == 0:
            return
        row = offset.y - 1 + round(self.scroll_y)
        if row < len(self.seq_ids):
            self.cursor = row
            self.post_message(self.Selected(self.seq_ids[row]))
            if event.chain >= 2:
                self.post_message(self.Opened(self.seq_ids[row]))
