"""What each figure of `tracengine stats` is, said on its line (issue 34, item 9): gaps
between steps as a total and a mean per step, which rates are over step time and which over
the run's wall time, the KV peak's step apart from the pool's size; and, piped, a line per
figure with no wrapping and no trailing spaces."""
import os
import subprocess
import sys
from pathlib import Path

from tracengine.analysis.stats import render, stats
from tracengine.analysis.tables import table_text

ROOT = Path(__file__).resolve().parent.parent
ONLINE = ROOT / "traces" / "online.trace"      # 50 steps with idle gaps (arrivals over time)


def text_of(path) -> tuple[dict, list[str]]:
    s = stats(path)
    return s, table_text(render(s)).splitlines()


def line_with(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(start))


def test_gaps_between_steps_are_a_total_and_a_mean_per_step():
    s, lines = text_of(ONLINE)
    st = s["steps"]
    assert st["mean_gap_s"] == st["gap_s"] / st["num_steps"]
    assert line_with(lines, "gaps between steps") == (
        f"gaps between steps: {st['gap_s'] * 1e3:,.3f} ms in all, {st['mean_gap_s'] * 1e3:,.3f} ms mean per step; "
        f"{st['idle_s'] * 1e3:,.3f} ms of it idle (waiting for arrivals)")
    assert line_with(lines, f"{st['num_steps']} steps").endswith(
        f" in {st['total_s'] * 1e3:,.3f} ms (the run's wall time, idle included)")


def test_token_rates_say_what_time_they_are_over():
    s, lines = text_of(ONLINE)
    tp = s["throughput"]
    assert line_with(lines, "tokens/s").split(None, 1)[1] == (
        f"prefill {tp['prefill_tokens_per_s']:,.0f}, decode {tp['decode_tokens_per_s']:,.0f} (over their steps' "
        f"time); completion {tp['completion_tokens_per_s']:,.0f}, all {tp['total_tokens_per_s']:,.0f} "
        f"(over the run's wall time)")


def test_the_kv_peak_step_does_not_read_as_a_step_count():
    s, lines = text_of(ROOT / "traces" / "default_mix.trace")
    kv = s["kv_blocks"]
    assert (kv["num_blocks"], kv["peak_step"]) == (48, 3)
    assert line_with(lines, "KV blocks").split(None, 2)[2] == "48 blocks, utilisation mean 71.9%, peak 100.0% " \
                                                             "(first at step 3)"


def test_piped_stats_are_a_line_per_figure_whatever_the_terminal_width():
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="40")
    out = subprocess.run([sys.executable, "-c", "import sys; from tracengine.cli import main; sys.exit(main())",
                          "stats", str(ONLINE)], env=env, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert all(line == line.rstrip() for line in lines)
    s, expected = text_of(ONLINE)
    assert lines[1:] == expected                     # the title, then render's lines unwrapped
    assert max(len(line) for line in lines) > 80


TEXTS = ["plain 1,234 figures", "a:smile:b", ":+1: and :thumbs_up:", "x:smile-emoji:y", "12:30:45", ":no_such_code:",
         "[bold]a[/bold]:smile:", ":smi[bold]le:", "\\[bold]:smile:", "a: :smile :", "path/to:the:file", "::", ""]


def test_a_table_prints_emoji_codes_as_rich_does():
    """table_text replaces emoji codes only in a string that could hold one: every string reads
    as rich's own Console prints it, in a cell, a title and alone."""
    from rich.console import Console
    from tracengine.analysis.tables import console_text, make_table

    for text in TEXTS:
        renderables = (text, make_table(["name", text], [[text, "1"]], title=text))
        assert table_text(*renderables) == console_text(Console, renderables), text
    assert table_text("a:smile:b") != "a:smile:b"


def test_tables_without_emoji_codes_leave_rich_s_table_of_them_unloaded():
    code = ("import sys; from tracengine.analysis.stats import render, stats; "
            "from tracengine.analysis.tables import table_text; "
            f"table_text(render(stats({str(ONLINE)!r}))); print('rich._emoji_codes' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.split() == ["False"]
