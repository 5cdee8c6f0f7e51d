"""One sequence's whole life: arrival, prefill chunks, first token,
preemptions and recomputation, the drafts each step verified and what it
kept (speculative decoding), finish. Picking a line goes to its step."""
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList, Static

from tracengine.tui.trace_index import Milestone


def life_summary(seq, milestones: list[Milestone] = ()) -> str:
    parts = [f"seq {seq.seq_id}: {seq.num_prompt_tokens} prompt + {seq.num_tokens - seq.num_prompt_tokens} "
             f"completion tokens", f"arrived at step {seq.arrival_step}"]
    if seq.first_token_step >= 0:
        parts.append(f"first token at step {seq.first_token_step} "
                     f"({seq.first_token_step - seq.arrival_step} steps to first token)")
    if seq.num_preemptions:
        parts.append(f"preempted {seq.num_preemptions}×")
    verifies = [m for m in milestones if m.kind == "verify"]
    if verifies:
        drafted, kept = sum(m.num_tokens for m in verifies), sum(m.num_accepted for m in verifies)
        parts.append(f"{drafted} drafts verified in {len(verifies)} steps, {kept} kept"
                     + (f" ({kept / drafted:.0%})" if drafted else ""))
    if seq.finish_step >= 0:
        parts.append(f"finished at step {seq.finish_step} ({seq.finish_reason})")
    else:
        parts.append(f"{seq.status} at the last step")
    return "; ".join(parts)


def life_lines(seq_id: int, milestones: list[Milestone], last_step: int) -> list[tuple[int, str]]:
    """(step, what happened) in order; a running stretch is one line."""
    lines = []
    preempted = False
    for i, m in enumerate(milestones):
        match m.kind:
            case "arrive":
                lines.append((m.step, f"arrives with {m.num_tokens} prompt tokens (max_tokens {m.max_tokens}), "
                                      f"at the waiting tail"))
            case "prefill":
                what = "recompute" if preempted else "prefill"
                cached = f", {m.num_cached_tokens} tokens from the prefix cache" if m.is_first_chunk and m.num_cached_tokens else ""
                if m.is_first_chunk and m.is_last_chunk:
                    text = f"{what}: all {m.num_tokens} tokens{cached}; moves to running"
                elif m.is_first_chunk:
                    text = f"{what}: first chunk of {m.num_tokens} tokens{cached} (chunked prefill)"
                elif m.is_last_chunk:
                    text = f"{what}: last chunk of {m.num_tokens} tokens; moves to running"
                else:
                    text = f"{what}: next chunk of {m.num_tokens} tokens, {m.num_cached_tokens + m.num_tokens} done"
                lines.append((m.step, text))
                if m.is_last_chunk:
                    preempted = False
                    end = milestones[i + 1].step if i + 1 < len(milestones) else last_step + 1
                    if end > m.step + 1:
                        lines.append((m.step + 1, f"running: decodes one token per decode step until step {end - 1}"))
            case "preempt":
                preempted = True
                who = ("itself, as no other seq was left to preempt" if m.other_seq_id == seq_id
                       else f"seq {m.other_seq_id} (it is the running tail)")
                lines.append((m.step, f"preempted for {who}: {m.num_tokens} computed tokens dropped, "
                                      f"back to the head of waiting"))
            case "verify":
                drafts = f" {_ids(m.draft_token_ids)}" if m.draft_token_ids else ""
                appended = f": appends {_ids(m.kept_token_ids)}" if m.kept_token_ids else ""
                lines.append((m.step, f"verifies {m.num_tokens} draft{'s' if m.num_tokens != 1 else ''}{drafts}, "
                                      f"keeps {m.num_accepted}{appended}"))
            case "finish":
                lines.append((m.step, f"finishes ({m.reason}) with {m.num_tokens} completion tokens; blocks freed"))
    return lines


def _ids(token_ids) -> str:
    return "[" + " ".join(map(str, token_ids)) + "]"


class SeqScreen(ModalScreen[int | None]):
    """Dismissed with the step of the picked line, or None."""
    BINDINGS = [Binding("escape,q,o", "cancel", "Close")]

    def __init__(self, summary: str, lines: list[tuple[int, str]]):
        super().__init__()
        self.summary = summary
        self.lines = lines

    def compose(self) -> ComposeResult:
        with Vertical(id="seq-life"):
            yield Static(self.summary, id="seq-summary")
            yield OptionList(*(f"{step:>7}  {text}" for step, text in self.lines), id="seq-steps")
            yield Label("Enter: go to that step · Esc: close", classes="hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.lines[event.option_index][0])

    def action_cancel(self) -> None:
        self.dismiss(None)
