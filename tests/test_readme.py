"""The README's sample output is what the commands print today."""
import pathlib

from tracengine.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent


def readme_block_after(prompt: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index(prompt + "\n") + len(prompt) + 1
    return text[start:text.index("```", start)].splitlines()


def wall_clock(line: str) -> bool:
    words = line.split()
    return "ms" in words or any(w in line for w in ("tokens/s", "requests/s", "between steps"))


def test_stats_sample_matches_the_default_run(capsys):
    # traces/default_mix.trace is the default run (`tracengine generate --record`): its step figures
    # are the sample's; milliseconds are the recording machine's, so only the rows' names are compared
    sample = [" ".join(line.split()) for line in readme_block_after("$ tracengine stats run.trace")[1:]]
    assert main(["stats", str(ROOT / "traces" / "default_mix.trace")]) == 0
    printed = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()[1:]]
    sample = [line for line in sample if "between steps" not in line]   # format 1 records no gaps
    assert [line.split()[:1] for line in sample] == [line.split()[:1] for line in printed]
    assert [line for line in sample if not wall_clock(line)] == [line for line in printed if not wall_clock(line)]
