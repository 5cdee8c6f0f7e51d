"""The whole run at a glance: one column per step, or per group of steps when
there are more steps than columns. Height is the tokens scheduled, colour the
phase; a mark above a column says a preemption happened there."""
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from tracengine.tui.trace_index import TraceIndex

BARS = " ▁▂▃▄▅▆▇█"


class Timeline(Widget):
    COMPONENT_CLASSES = {"timeline--prefill", "timeline--decode", "timeline--preempt", "timeline--cursor"}
    DEFAULT_CSS = """
    Timeline > .timeline--prefill { color: $warning; }
    Timeline > .timeline--decode { color: $primary; }
    Timeline > .timeline--preempt { color: $error; text-style: bold; }
    Timeline > .timeline--cursor { background: $foreground 25%; }
    """

    step = reactive(0)
    num_steps = reactive(0)

    class Selected(Message):
        """The user clicked the column of `step`."""

        def __init__(self, step: int):
            super().__init__()
            self.step = step

    def __init__(self, index: TraceIndex, **kwargs):
        super().__init__(**kwargs)
        self.index = index
        self._columns: list[tuple[int, bool, bool]] = []
        self._columns_key = None

    @property
    def steps_per_column(self) -> int:
        width = max(1, self.size.width)
        return max(1, -(-self.num_steps // width))

    def column_of(self, step: int) -> int:
        return step // self.steps_per_column

    def watch_num_steps(self) -> None:
        self._update_titles()

    def watch_step(self) -> None:
        self._update_titles()

    def on_resize(self) -> None:
        self._update_titles()

    def _update_titles(self) -> None:
        group = self.steps_per_column
        per = "1 step" if group == 1 else f"{group} steps"
        last = max(0, self.num_steps - 1)
        self.border_title = "Timeline: tokens scheduled per step, coloured by phase (prefill / decode), ▼ preemption"
        self.border_subtitle = f"steps 0–{last}, {per} per column"

    def _summaries(self) -> list[tuple[int, bool, bool]]:
        key = (self.num_steps, self.size.width)
        if key != self._columns_key:
            group, n = self.steps_per_column, self.num_steps
            self._columns = [self.index.column_summary(start, min(n, start + group)) for start in range(0, n, group)]
            self._columns_key = key
        return self._columns

    def render_line(self, y: int) -> Strip:
        width, height = self.size
        columns = self._summaries()
        if width <= 0 or not columns:
            return Strip.blank(width)
        cursor = self.column_of(self.step)
        cursor_style = self.get_component_rich_style("timeline--cursor")
        if y == 0:
            mark = self.get_component_rich_style("timeline--preempt")
            cells = [("▼" if preempted else " ", mark if preempted else Style()) for _, _, preempted in columns]
        elif y == height - 1:
            cells = [(" ", Style())] * len(columns)
            cells[cursor] = ("▲", Style(bold=True))
        else:
            num_rows = max(1, height - 2)
            level = num_rows - y + 1    # 1 at the bottom row
            scale = max(1, self.index.max_tokens)
            prefill = self.get_component_rich_style("timeline--prefill")
            decode = self.get_component_rich_style("timeline--decode")
            cells = []
            for tokens, is_prefill, _ in columns:
                eighths = max(1 if tokens else 0, round(tokens * num_rows * 8 / scale))
                fill = min(8, max(0, eighths - (level - 1) * 8))
                cells.append((BARS[fill], prefill if is_prefill else decode))
        if 0 <= cursor < len(cells):
            char, style = cells[cursor]
            cells[cursor] = (char, style + cursor_style)
        segments = [Segment(char, style) for char, style in cells[:width]]
        return Strip(segments).simplify().extend_cell_length(width)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def on_click(self, event) -> None:
        offset = event.get_content_offset(self)
        if offset is None or not self.num_steps:
            return
        step = min(self.num_steps - 1, offset.x * self.steps_per_column)
        self.post_message(self.Selected(step))
