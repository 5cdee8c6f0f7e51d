"""The one table renderer: every table a command prints is a rich `Table` made here and
written by `table_text`, a line per row with no trailing spaces and no wrapping, so a table
reads the same on a terminal, in a pipe and in a test."""
import io
import re

from rich.console import Console
from rich.table import Table

# What every one of rich's emoji codes (`:smile:`, `:smile-emoji:`) is an instance of
EMOJI_CODE = re.compile(r":\S*?:")


class TableConsole(Console):
    """rich's Console, which replaces emoji codes in a string only where the string could hold
    one: the same text, without loading rich's table of thousands of codes (which costs a
    short command more than the rest of its tables) for figures and names that hold none."""

    def render_str(self, text, *, emoji=None, **kwargs):
        if emoji is None and not EMOJI_CODE.search(text):
            emoji = False       # rich would find no code to replace
        return super().render_str(text, emoji=emoji, **kwargs)


def make_table(header: list[str], rows: list[list[str]], left_columns: int = 1, title: str | None = None) -> Table:
    """Columns titled by `header` (an empty title: no header row at all when every one is
    empty); the first `left_columns` are labels, aligned left, the rest figures, aligned right."""
    table = Table(box=None, pad_edge=False, show_header=any(header), header_style="bold", title=title,
                  title_justify="left", title_style="")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < left_columns else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def table_text(*renderables) -> str:
    """The renderables as plain text, one line per row: as wide as they need, right-stripped."""
    return console_text(TableConsole, renderables)


def console_text(console_class: type[Console], renderables) -> str:
    """`table_text`'s printing, by a console of `console_class` (rich's own, in a test of TableConsole)."""
    out = io.StringIO()
    console = console_class(file=out, width=10_000, color_system=None, highlight=False, soft_wrap=False,
                            legacy_windows=False)
    for renderable in renderables:
        console.print(renderable)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())
