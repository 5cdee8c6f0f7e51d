"""The top of the screen: which trace (file name only), model, device and
config; where the cursor is and what this step did; whether the view follows
a live recording; and the sentence that explains the step's decision."""
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tracengine.trace.events import TraceHeader
from tracengine.tui.trace_index import StepView
from tracengine.trace.header import VLLM, backend_of, block_pool_config


def describe_trace(name: str, header: TraceHeader) -> str:
    config, model = header.config, header.model
    num_blocks, _, block_size = block_pool_config(header)
    engine = f" · vLLM {header.engine_version}'s scheduler" if backend_of(header) == VLLM else ""
    return (f"{name} · {model.name} ({model.architecture}, {model.dtype}) on {header.device}{engine} · "
            f"{num_blocks} blocks × {block_size} tokens · "
            f"budget {config.get('max_num_batched_tokens')} tokens, {config.get('max_num_seqs')} seqs")


class TraceHeaderBar(Widget):
    COMPONENT_CLASSES = {"header--prefill", "header--decode", "header--mixed", "header--live", "header--note"}
    DEFAULT_CSS = """
    TraceHeaderBar > .header--prefill { color: $warning; text-style: bold; }
    TraceHeaderBar > .header--decode { color: $primary; text-style: bold; }
    TraceHeaderBar > .header--mixed { color: $accent; text-style: bold; }
    TraceHeaderBar > .header--live { color: $error; text-style: bold; }
    TraceHeaderBar > .header--note { color: $text-muted; }
    """

    view: reactive[StepView | None] = reactive(None)
    num_steps = reactive(0)
    live = reactive(False)
    at_tail = reactive(False)
    playing = reactive(False)
    speed = reactive(1)
    note = reactive("")        # indexing progress, a torn tail or damage

    def __init__(self, name: str, header: TraceHeader, **kwargs):
        super().__init__(**kwargs)
        self.trace_line = describe_trace(name, header)

    def render(self) -> Text:
        style = self.get_component_rich_style
        text = Text(self.trace_line)
        text.append("\n")
        if self.view is None:
            text.append("no complete step yet", style("header--note"))
        else:
            text.append(f"step {self.view.step} of {self.num_steps} (0–{self.num_steps - 1}) · ")
            phase = self.view.phase
            text.append(phase.upper() or "-", style(f"header--{phase}") if phase else style("header--note"))
            # the step's time on the trace's axis: from the run's start, idle gaps included
            text.append(f" · t {self.view.start_ns / 1e6:,.3f} ms (+{(self.view.end_ns - self.view.start_ns) / 1e6:,.3f})")
        if self.live:
            text.append(" · ")
            text.append("● LIVE", style("header--live"))
            text.append(" at the newest step" if self.at_tail else " (End: back to the newest step)",
                        style("header--note"))
        if self.playing:
            text.append(f" · ▶ {self.speed} steps/s")
        if self.note:
            text.append(f" · {self.note}", style("header--note"))
        return text


class Explanation(Widget):
    """One sentence: what was decided at this step and why."""

    view: reactive[StepView | None] = reactive(None)

    def render(self) -> Text:
        return Text("" if self.view is None else self.view.explanation)
