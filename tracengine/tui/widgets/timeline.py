"""The whole run at a glance: one column per step, or per group of steps when
there are more steps than columns. Height is the tokens scheduled, colour the
phase; a mark above a column says a preemption happened there."""
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from tracengine.tui.trace_index import TraceIndex
from tracengine.tui.widgets.styles import ComponentStyles

BARS = " ▁▂▃▄▅▆▇█"


class Timeline(ComponentStyles, Widget):
    COMPONENT_CLASSES = {"timeline--prefill", "timeline--decode", "timeline--mixed", "timeline--preempt",
                         "timeline--cursor"}
    DEFAULT_CSS = """
    Timeline > .timeline--prefill { color: $warning; }
    Timeline > .timeline--decode { color: $primary; }
    Timeline > .timeline--mixed { color: $success; }
    Timeline > .timeline--preempt { color: $error; text-style: bold; }
    Timeline > .timeline--cursor { color: $accent; text-style: bold; }
    """

    step = reactive(0, repaint=False)     # only the cursor row is redrawn when it moves
    num_steps = reactive(0)

    class Selected(Message):
        """The user clicked the column of `step`."""

        def __init__(self, step: int):
            super().__init__()
            self.step = step

    def __init__(self, index: TraceIndex, **kwargs):
        super().__init__(**kwargs)
        self.index = index
        self._row_strips: list[Strip] = []
        self._row_strips_key = None

    @property
    def steps_per_column(self) -> int:
        width = max(1, self.size.width)
        return max(1, -(-self.num_steps // width))

    def column_of(self, step: int) -> int:
        return step // self.steps_per_column

    def on_mount(self) -> None:
        self.border_title = "Timeline: tokens scheduled per step, coloured by phase (prefill / decode), ▼ preemption"

    def watch_num_steps(self) -> None:
        self._update_subtitle()

    def watch_step(self) -> None:
        self.refresh(Region(0, self.size.height - 1, self.size.width, 1))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._row_strips_key = None     # drawn in the old theme

    def on_resize(self) -> None:
        self._update_subtitle()

    def _update_subtitle(self) -> None:
        group = self.steps_per_column
        per = "1 step" if group == 1 else f"{group} steps"
        self.border_subtitle = f"steps 0–{max(0, self.num_steps - 1)}, {per} per column"

    def _rows(self) -> list[Strip]:
        """The mark row and the bar rows: they change with the trace and the size, not the cursor."""
        width, height = self.size
        key = (self.num_steps, width, height)
        if key != self._row_strips_key:
            group, n = self.steps_per_column, self.num_steps
            columns = [self.index.column_summary(start, min(n, start + group)) for start in range(0, n, group)]
            self._row_strips = [self._row(y, columns, width, height) for y in range(max(0, height - 1))]
            self._row_strips_key = key
        return self._row_strips

    def _row(self, y: int, columns, width: int, height: int) -> Strip:
        if y == 0:
            mark = self.component_style("timeline--preempt")
            cells = [("▼", mark) if preempted else (" ", Style()) for _, _, preempted in columns]
        else:
            num_rows = max(1, height - 2)
            level = num_rows - y + 1    # 1 at the bottom row
            scale = max(1, self.index.max_tokens)
            styles = {phase: self.component_style(f"timeline--{phase}") for phase in ("prefill", "decode", "mixed")}
            cells = []
            for tokens, phase, _ in columns:
                eighths = max(1 if tokens else 0, round(tokens * num_rows * 8 / scale))
                fill = min(8, max(0, eighths - (level - 1) * 8))
                cells.append((BARS[fill], styles[phase]))
        segments = [Segment(char, style) for char, style in cells[:width]]
        return Strip(segments).simplify().extend_cell_length(width)

    def render_line(self, y: int) -> Strip:
        width, height = self.size
        if width <= 0 or not self.num_steps:
            return Strip.blank(width)
        if y < height - 1:
            return self._rows()[y]
        cursor = min(self.column_of(self.step), width - 1)      # the cursor row
        return Strip([Segment(" " * cursor), Segment("▲", self.component_style("timeline--cursor"))]
                     ).extend_cell_length(width)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def on_click(self, event) -> None:
        offset = event.get_content_offset(self)
        if offset is None or not self.num_steps:
            return
        step = min(self.num_steps - 1, offset.x * self.steps_per_column)
        self.post_message(self.Selected(step))
