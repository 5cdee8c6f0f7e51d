"""Component-class styles looked up once per theme change, not once per
cell: the Line-API widgets render many cells per line, every step. And the
two ways such a widget repaints less when the cursor moves: border titles
set only when they change (only their border row repainted), and only the
rows whose content changed repainted."""
from rich.style import Style
from textual.geometry import Region


class ComponentStyles:
    """Mix into a widget before its Textual base class."""

    def component_style(self, name: str) -> Style:
        """The Rich style of the component class `name` (as in COMPONENT_CLASSES)."""
        cache = self.__dict__.setdefault("_component_style_cache", {})
        style = cache.get(name)
        if style is None:
            style = cache[name] = self.get_component_rich_style(name)
        return style

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.__dict__["_component_style_cache"] = {}
        self.__dict__["_shown_rows"] = None

    def set_titles(self, title: str | None, subtitle: str | None) -> None:
        """The border title and subtitle. Setting either makes Textual repaint the
        whole widget, even to the same text; here an unchanged one is left alone
        and a changed one repaints its border row only. That stores the title
        where Textual 8's public setter does (`_border_title`, a Content): the
        dependency is pinned to Textual 8 and a test compares the two."""
        shown = self.__dict__.setdefault("_shown_titles", [None, None])
        for i, (name, text) in enumerate((("_border_title", title), ("_border_subtitle", subtitle))):
            if text == shown[i]:
                continue
            shown[i] = text
            if not self.is_mounted:
                setattr(self, name[1:], text)
                continue
            # what Textual's border-title setter stores, without its whole-widget refresh
            setattr(self, name, None if text is None else self.render_str(text).expand_tabs(4).split()[0])
            x, y = self.content_offset
            row = -y if i == 0 else self.outer_size.height - y - 1
            self.refresh(Region(-x, row, self.outer_size.width, 1))

    def refresh_rows(self, keys: tuple, frame=None) -> None:
        """Repaint the content rows (0 = the first) whose key differs from the
        last call's; everything when `frame` (what all rows depend on: size,
        scroll position) changed or something else repainted them meanwhile."""
        shown = self.__dict__.get("_shown_rows")
        self.__dict__["_shown_rows"] = (frame, keys)
        if shown is None or shown[0] != frame:
            self.refresh()
            return
        old = shown[1]
        width = self.size.width
        for y in range(max(len(keys), len(old))):
            if y >= len(keys) or y >= len(old) or keys[y] != old[y]:
                self.refresh(Region(0, y, width, 1))

    def forget_rows(self) -> None:
        """Something other than the rows' keys changed what they show: the next
        `refresh_rows` repaints them all."""
        self.__dict__["_shown_rows"] = None
