"""Component-class styles looked up once per theme change, not once per
cell: the Line-API widgets render many cells per line, every step."""
from rich.style import Style


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
