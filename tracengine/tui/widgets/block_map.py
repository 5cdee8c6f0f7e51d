"""The KV block pool at the current step: one cell per block, labelled and
coloured by the sequence that holds it, its whole id (as many digits as the
trace's largest seq id has, two at least). A shared block (ref count above 1)
is marked `+`, a free block that still holds a registered hash (a prefix-cache
hit waiting to happen) is `░░`, a plain free block `··`, and vLLM's null block
(taken at start-up, never free, held by no sequence) `▪▪`. The selected
sequence's blocks stand out. A vLLM hybrid model's KV cache groups share the pool: a sequence's
blocks in every group are its cells, and the title counts each group's."""
from itertools import groupby
from operator import itemgetter

from rich.segment import Segment
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tracengine.tui.trace_index import StepView
from tracengine.tui.widgets.styles import ComponentStyles

NUM_OWNER_COLOURS = 8
GUTTER = 6         # the first block id of the row, then a space


def block_kind(block, state, null_block_id: int = -1) -> str:
    """owned, shared, cached (free, its hash still maps to it), null (vLLM's) or free."""
    if block.owners:
        return "shared" if block.ref_count > 1 else "owned"
    if block.block_id == null_block_id:
        return "null"
    return "cached" if block.hash != -1 and state.hash_to_block_id.get(block.hash) == block.block_id else "free"


def cell_text(block, kind: str, label_width: int = 2) -> str:
    """What a block's cell shows (before styling): the owner's whole id in `label_width` digits
    (StepView.seq_label_width), then a marker."""
    match kind:
        case "owned" | "shared":
            return f"{block.owners[0]:0{label_width}d}" + ("+" if kind == "shared" else " ")
        case "cached":
            return "░" * label_width + " "
        case "null":
            return "▪" * label_width + " "
    return "·" * label_width + " "


def group_counts(state) -> str:
    """The blocks each KV cache group holds, a vLLM hybrid model's (its groups share the pool); "" for one group."""
    if not state.group_tables:
        return ""
    held: dict[int, int] = {}
    for block in state.blocks:
        if block.owners:
            held[block.group] = held.get(block.group, 0) + 1
    return " (" + ", ".join(f"group {g}: {n}" for g, n in sorted(held.items())) + ")"


class BlockMap(ComponentStyles, ScrollView, can_focus=True):
    COMPONENT_CLASSES = {"block-map--free", "block-map--cached", "block-map--null", "block-map--shared",
                         "block-map--selected", "block-map--gutter",
                         *(f"block-map--owner-{i}" for i in range(NUM_OWNER_COLOURS))}
    DEFAULT_CSS = """
    BlockMap > .block-map--free { color: $text-disabled; }
    BlockMap > .block-map--null { color: $text-muted; }
    BlockMap > .block-map--cached { color: $success; }
    BlockMap > .block-map--shared { text-style: bold; }
    BlockMap > .block-map--selected { text-style: bold reverse; }
    BlockMap > .block-map--gutter { color: $text-muted; }
    BlockMap > .block-map--owner-0 { color: #000000; background: #e5c07b; }
    BlockMap > .block-map--owner-1 { color: #000000; background: #61afef; }
    BlockMap > .block-map--owner-2 { color: #000000; background: #98c379; }
    BlockMap > .block-map--owner-3 { color: #000000; background: #c678dd; }
    BlockMap > .block-map--owner-4 { color: #000000; background: #56b6c2; }
    BlockMap > .block-map--owner-5 { color: #000000; background: #e06c75; }
    BlockMap > .block-map--owner-6 { color: #000000; background: #d19a66; }
    BlockMap > .block-map--owner-7 { color: #000000; background: #abb2bf; }
    """

    # the watchers repaint the rows that changed
    view: reactive[StepView | None] = reactive(None, repaint=False)
    selected_seq_id = reactive(-1, repaint=False)

    class Selected(Message):
        """The user clicked a block held by `seq_id`."""

        def __init__(self, seq_id: int):
            super().__init__()
            self.seq_id = seq_id

    def __init__(self, null_block_id: int = -1, **kwargs):
        """`null_block_id`: vLLM's null block in a trace of vLLM's scheduler (-1: none)."""
        super().__init__(**kwargs)
        self.null_block_id = null_block_id
        self._cells: dict[int, tuple] = {}     # row -> cells, for the view and size shown

    @property
    def label_width(self) -> int:
        return self.view.seq_label_width if self.view is not None else 2

    @property
    def cell_width(self) -> int:
        return self.label_width + 1        # the label and a marker

    @property
    def cells_per_row(self) -> int:
        return max(1, (self.scrollable_content_region.width - GUTTER) // self.cell_width)

    def _update_size(self) -> None:
        self._cells.clear()
        num_blocks = self.view.state.num_blocks if self.view is not None else 0
        self.virtual_size = Size(self.scrollable_content_region.width, -(-num_blocks // self.cells_per_row))

    def watch_view(self, view: StepView | None) -> None:
        self._update_size()
        if view is not None:
            state = view.state
            cached = sum(1 for b in state.free_block_ids if state.hash_to_block_id.get(state.hashes[b]) == b)
            has_null = 0 <= self.null_block_id < state.num_blocks
            width = view.seq_label_width
            self.set_titles(f"KV blocks: {state.num_blocks - state.num_free_blocks - has_null} used"
                            f"{group_counts(state)}, "
                            + ("1 null, " if has_null else "")
                            + f"{state.num_free_blocks} free, {cached} of them prefix-cached",
                            f"{'N' * width} seq  + shared  {'░' * width} free, cached  {'·' * width} free"
                            + (f"  {'▪' * width} vLLM's null" if has_null else ""))
        self._refresh_rows()

    def watch_selected_seq_id(self) -> None:
        self._refresh_rows()

    def on_resize(self) -> None:
        self._update_size()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cells.clear()          # styled in the old theme

    def _refresh_rows(self) -> None:
        """Repaint the rows whose cells changed: a step changes a few blocks."""
        self._cells.clear()
        top = round(self.scroll_y)
        keys = tuple(self._row_cells(top + y) for y in range(self.scrollable_content_region.height))
        self.refresh_rows(keys, (self.scrollable_content_region.size, top))

    def _row_cells(self, row: int) -> tuple:
        """(text, style) of each cell of a row; neighbours with one style become one segment."""
        cells = self._cells.get(row)
        if cells is not None:
            return cells
        view = self.view
        if view is None:
            return ()
        state = view.state
        per_row = self.cells_per_row
        first = row * per_row
        if first >= state.num_blocks:
            return ()
        style_of, selected = self.component_style, self.selected_seq_id
        null_block_id, label_width = self.null_block_id, view.seq_label_width
        cells = []
        for block in state.blocks[first:first + per_row]:
            kind = block_kind(block, state, null_block_id)
            text = cell_text(block, kind, label_width)
            if block.owners:
                style = style_of(f"block-map--owner-{block.owners[0] % NUM_OWNER_COLOURS}")
                if selected in block.owners:
                    style += style_of("block-map--selected")
                if kind == "shared":
                    cells += [(text[:-1], style), (text[-1], style + style_of("block-map--shared"))]
                else:
                    cells.append((text, style))
            else:
                cells.append((text, style_of(f"block-map--{kind}")))
        self._cells[row] = cells = tuple(cells)
        return cells

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        row = y + round(self.scroll_y)
        cells = self._row_cells(row) if width > 0 else ()
        if not cells:
            return Strip.blank(width)
        style_of = self.component_style
        segments = [Segment(f"{row * self.cells_per_row:>{GUTTER - 1}} ", style_of("block-map--gutter"))]
        for style, run in groupby(cells, key=itemgetter(1)):
            segments.append(Segment("".join(text for text, _ in run), style))
        return Strip(segments).crop(0, width).extend_cell_length(width)

    def block_at(self, x: int, y: int) -> int | None:
        """The block under a content offset, if any."""
        if x < GUTTER or self.view is None:
            return None
        column = (x - GUTTER) // self.cell_width
        if column >= self.cells_per_row:
            return None
        block_id = (y + round(self.scroll_y)) * self.cells_per_row + column
        return block_id if block_id < self.view.state.num_blocks else None

    def on_click(self, event) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        block_id = self.block_at(offset.x, offset.y)
        if block_id is not None:
            owners = self.view.state.blocks[block_id].owners
            if owners:
                self.post_message(self.Selected(owners[0]))
