"""The CPU tier beside the KV block map (a trace run with `kv_offloading_size`): what the fold
says the tier holds after the cursor's step, out of its capacity, the loads in flight (the
sequences set aside until their blocks are back on the GPU), and what the step itself did: the
blocks it stored (copied at the next step's start) and evicted, the blocks its hits load, the
loads that ended."""
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from tracengine.engine.config import Config
from tracengine.trace.events import TraceHeader
from tracengine.tui.trace_index import StepView

BAR_WIDTH = 20
MAX_LOADS_LISTED = 4


def tier_capacity(header: TraceHeader) -> int:
    """The blocks the trace's tier holds (0: it has none), as the engine sized it."""
    config = header.config
    return Config(kv_offloading_size=config.get("kv_offloading_size", 0.0),
                  kv_bytes_per_token=config.get("kv_bytes_per_token", 0),
                  kvcache_block_size=config.get("kvcache_block_size", 16)).num_cpu_blocks


class CpuTierPanel(Widget):
    COMPONENT_CLASSES = {"cpu-tier--bar", "cpu-tier--empty", "cpu-tier--label"}
    DEFAULT_CSS = """
    CpuTierPanel > .cpu-tier--bar { color: $success; }
    CpuTierPanel > .cpu-tier--empty { color: $text-disabled; }
    CpuTierPanel > .cpu-tier--label { color: $text-muted; }
    """

    view: reactive[StepView | None] = reactive(None)

    def __init__(self, capacity: int, **kwargs):
        super().__init__(**kwargs)
        self.capacity = capacity
        self.border_title = "CPU tier"

    def lines(self) -> list[str]:
        """The panel's text, line by line (what a test reads)."""
        if self.view is None:
            return ["no complete step yet"]
        cpu = self.view.state.cpu
        share = cpu.num_blocks / self.capacity if self.capacity else 0.0
        loading = sorted(cpu.loading.items())
        stored, evicted, hit, started, ended = self.view.cpu_step
        lines = [f"held   {cpu.num_blocks:,} of {self.capacity:,} blocks ({share:.1%})",
                 f"loads in flight  {len(loading)} ({sum(n for _, (_, n) in loading):,} blocks)"]
        lines += [f"  s{seq_id}  blocks {first}–{first + n - 1}" for seq_id, (first, n) in loading[:MAX_LOADS_LISTED]]
        if len(loading) > MAX_LOADS_LISTED:
            lines.append(f"  and {len(loading) - MAX_LOADS_LISTED} more")
        lines += [f"this step  stored {stored:,}, evicted {evicted:,}",
                  f"           hit {hit:,} in {started} loads, {ended} ended"]
        return lines

    def render(self) -> Text:
        style = self.get_component_rich_style
        text = Text()
        if self.view is not None and self.capacity:
            filled = round(BAR_WIDTH * min(1.0, self.view.state.cpu.num_blocks / self.capacity))
            text.append("█" * filled, style("cpu-tier--bar"))
            text.append("░" * (BAR_WIDTH - filled), style("cpu-tier--empty"))
            text.append("\n")
        text.append("\n".join(self.lines()))
        return text
