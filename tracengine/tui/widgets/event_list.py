"""Every event of the trace as one scrolling list, the current step's events
at the top and highlighted. Line API over the index of frame offsets: a line
finds its step by bisection, the step's frame is read from the file, and
frames and rendered strips are kept in LRU caches, as Toolong does for logs."""
from rich.segment import Segment
from rich.style import Style
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tracengine.analysis.render import describe_event
from tracengine.tui.trace_index import EVENT_TYPE_NAMES, TraceIndex
from tracengine.tui.widgets.styles import ComponentStyles

# the event type's column: the longest name and a space, so that no name runs into its text
NAME_WIDTH = max(map(len, EVENT_TYPE_NAMES)) + 1


class EventList(ComponentStyles, ScrollView, can_focus=True):
    COMPONENT_CLASSES = {"event-list--current", "event-list--match", "event-list--step"}
    DEFAULT_CSS = """
    EventList > .event-list--current { background: $primary 20%; }
    EventList > .event-list--match { color: $warning; text-style: bold; }
    EventList > .event-list--step { color: $text-muted; }
    """

    step = reactive(0)
    num_steps = reactive(0)
    event_type = reactive("Preempt")

    class Selected(Message):
        """The user clicked an event of `step`."""

        def __init__(self, step: int):
            super().__init__()
            self.step = step

    def __init__(self, index: TraceIndex, **kwargs):
        super().__init__(**kwargs)
        self.index = index
        self._frames: LRUCache[int, list] = LRUCache(256)
        self._strips: LRUCache[tuple, Strip] = LRUCache(2048)
        self._scroll_pending = False

    def watch_num_steps(self, num_steps: int) -> None:
        self.virtual_size = Size(self.scrollable_content_region.width, self.index.event_start(num_steps))
        if self._scroll_pending:
            self._scroll_to_step()
        self._update_titles()

    def watch_step(self) -> None:
        self._scroll_to_step()
        self._update_titles()
        self.refresh()

    def _scroll_to_step(self) -> None:
        """The step's first event at the top; until the list is long enough for
        that (a step just arrived, or one near the end), again as it grows."""
        if self.step >= self.num_steps:
            self._scroll_pending = True
            return
        y = self.index.event_start(self.step)
        self.scroll_to(y=y, animate=False, immediate=True)
        self._scroll_pending = y > self.max_scroll_y

    def watch_event_type(self) -> None:
        self._update_titles()
        self.refresh()

    def _update_titles(self) -> None:
        if self.step < self.num_steps:
            count = self.index.event_start(self.step + 1) - self.index.event_start(self.step)
            self.border_title = f"Events of step {self.step} ({count})"
        self.border_subtitle = f"n/N: next/previous {self.event_type}"

    def events_of(self, step: int) -> list:
        events = self._frames.get(step)
        if events is None:
            events = self.index.events_at(step)
            self._frames.set(step, events)
        return events

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        line = y + round(self.scroll_y)
        index = self.index
        if width <= 0 or line >= index.event_start(self.num_steps):
            return Strip.blank(width)
        step = index.step_of_line(line)
        event = self.events_of(step)[line - index.event_start(step)]
        name = type(event).__name__
        is_current, is_match = step == self.step, name == self.event_type
        key = (line, width, is_current, is_match)
        strip = self._strips.get(key)
        if strip is None:
            base = self.component_style("event-list--current") if is_current else Style()
            step_style = base + self.component_style("event-list--step")
            name_style = base + self.component_style("event-list--match") if is_match else base
            strip = Strip([Segment(f"{step:>7} ", step_style), Segment(f"{name:<{NAME_WIDTH}}", name_style),
                           Segment(describe_event(event), base)])
            strip = strip.crop(0, width).extend_cell_length(width, base)
            self._strips.set(key, strip)
        return strip

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()         # drawn in the old theme

    def on_resize(self) -> None:
        self._strips.clear()
        self.virtual_size = Size(self.scrollable_content_region.width, self.index.event_start(self.num_steps))

    def on_click(self, event) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        line = offset.y + round(self.scroll_y)
        if line < self.index.event_start(self.num_steps):
            self.post_message(self.Selected(self.index.step_of_line(line)))
