"""Modal screens: the help, a text under a title (the run figures, a fleet's), a number
prompt (go to step, select sequence) and the event-type picker. Each returns its answer with `dismiss`."""
from rich.measure import Measurement
from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import ScrollableContainer, Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, Static

KEY_NAMES = {"right": "→", "left": "←", "plus": "+", "equals_sign": "=", "minus": "-", "space": "space",
             "question_mark": "?", "right_square_bracket": "]", "left_square_bracket": "[",
             "greater_than_sign": ">", "less_than_sign": "<"}

MOUSE_HELP = [
    ("click the timeline", "go to that step (or group of steps)"),
    ("click a queue row", "select the sequence; double-click opens its life"),
    ("click a block", "select the sequence that holds it"),
    ("click an event", "go to its step"),
    ("wheel", "scroll the panel under the pointer"),
]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for keys, description in key_help(self.app.BINDINGS):
            table.add_row(keys, description)
        table.add_row("", "")
        for what, does in MOUSE_HELP:
            table.add_row(what, does)
        with Vertical(id="help"):
            yield Label("Keys and mouse (Esc closes)", id="help-title")
            yield Static(table)


class TextScreen(ModalScreen[None]):
    """A renderable under a title; Esc closes. The dialog is as wide as the renderable (up to
    the screen's width), which is drawn at its own width: a table wider than the screen scrolls
    sideways instead of having its cells cut ("2,087.…")."""
    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, renderable, title: str):
        super().__init__()
        self.renderable = renderable
        self.title_text = title

    def compose(self) -> ComposeResult:
        with ScrollableContainer(id="text-screen"):
            yield Label(f"{self.title_text} (Esc closes)", id="help-title")
            yield Static(self.renderable, id="text")

    def on_mount(self) -> None:
        # the renderable's own width: narrower, a table would shorten its cells with "…"
        console = self.app.console
        options = console.options.update_width(10_000)
        self.query_one("#text", Static).styles.width = Measurement.get(console, options, self.renderable).maximum


class RunFiguresScreen(TextScreen):
    """`tracengine stats` of the steps read so far, rendered as the command does."""
    BINDINGS = [Binding("escape,q,i", "dismiss", "Close")]

    def __init__(self, figures: dict, title: str):
        from tracengine.analysis.stats import render
        super().__init__(render(figures), title)
        self.figures = figures


def key_help(bindings) -> list[tuple[str, str]]:
    """(keys, what they do), one row per description: the digit keys share one."""
    rows: dict[str, list[str]] = {}
    for binding in bindings:
        for key in binding.key.split(","):
            rows.setdefault(binding.description, []).append(KEY_NAMES.get(key, key))
    return [(("0–9" if all(k.isdigit() for k in keys) else " ".join(keys)), description)
            for description, keys in rows.items()]


class NumberPrompt(ModalScreen[int | None]):
    """Asks for one integer: a step to go to, a sequence to select."""
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, value: str = ""):
        super().__init__()
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="prompt"):
            yield Label(self.title_text)
            yield Input(self.value, type="integer", id="number")

    def on_mount(self) -> None:
        self.query_one(Input).cursor_position = len(self.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(int(event.value) if event.value.strip().lstrip("-").isdigit() else None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class EventTypePicker(ModalScreen[str | None]):
    """The event type that n / N jump to."""
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, names: list[str], current: str):
        super().__init__()
        self.names = names
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="prompt"):
            yield Label("Jump with n / N to events of type")
            yield OptionList(*self.names, id="types")

    def on_mount(self) -> None:
        self.query_one(OptionList).highlighted = self.names.index(self.current)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.names[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)
