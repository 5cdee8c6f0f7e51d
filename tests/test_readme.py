"""The README's commands run, in order, on a fresh clone (issue 34, item 11), and its sample
output is what the commands print today."""
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

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


# Commands the run-through leaves out, and why: interactive, a server, a checkpoint of your own.
NOT_RUN = {"tui": "interactive", "serve": "a server", "bench-serve": "needs a server"}


def readme_commands() -> list[list[str]]:
    """Every `tracengine ...` line of the README's plain code blocks, in order: comments and
    optional `[...]` parts dropped, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"^```(?:bash)?\n(.*?)^```", text, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if not line.startswith("tracengine "):
                continue
            argv = shlex.split(re.sub(r"\s\[[^]]*\](?:\s\[[^]]*\])*", "", line), comments=True)[1:]
            if argv[0] not in NOT_RUN and not any(a.startswith("~") for a in argv):   # not a checkpoint of yours
                commands.append(argv)
    return commands


@pytest.mark.model
def test_the_readme_commands_run_in_order_on_a_fresh_clone(tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")     # what a clone has
    monkeypatch.chdir(tmp_path)
    commands = readme_commands()
    assert ["generate", "--record", "run.trace"] == commands[0]
    assert ["replay", "run.trace", "--sweep", "num_kvcache_blocks=24,48,96", "--slo", "ttft=200ms"] in commands
    for argv in commands:
        if "tests/traces/run.trace" in argv:
            (tmp_path / "tests" / "traces").mkdir(parents=True)    # the snapshot section's mkdir -p
        code = main(argv + (["--quiet"] if argv[0] in ("generate", "simulate") else []))
        err = capsys.readouterr().err
        assert code in ((0, 1) if argv[0] == "diff" else (0,)), (argv, err)
        assert "Traceback" not in err, (argv, err)
    assert {"run.trace", "whatif.trace", "online.trace", "steptime.json", "sim.trace", "out.json"} <= \
        {p.name for p in tmp_path.iterdir()}


def code_block_after(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("```", text.index(marker))
    start = text.index("\n", start) + 1
    return text[start:text.index("```", start)]


def test_the_snapshot_sections_install_line_installs_the_testing_extra(tmp_path):
    line = next(line for line in code_block_after("In your own project").splitlines() if line.startswith("pip "))
    argv = shlex.split(line, comments=True)
    assert argv[:2] == ["pip", "install"] and argv[2] == "path/to/tracengine[testing]"
    # what it does from a clone: resolve this repository with its testing extra (no download)
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
                          "--no-index", argv[2].replace("path/to/tracengine", str(ROOT))],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and "Would install tracengine" in out.stdout, out.stderr
    assert "does not provide the extra" not in out.stderr


@pytest.mark.model
def test_the_snapshot_section_works_in_a_project_of_ones_own(tmp_path):
    """The section's recorded run, conftest and test file, in a fresh folder: the first
    `pytest --snapshot-update` stores the tables (and reports them), then `pytest` passes."""
    (tmp_path / "tests" / "traces").mkdir(parents=True)
    argv = next(a for a in readme_commands() if "tests/traces/run.trace" in a)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-c", "import sys; from tracengine.cli import main; sys.exit(main(sys.argv[1:]))"]
    subprocess.run(run + argv + ["--quiet"], cwd=tmp_path, env=env, check=True, capture_output=True)
    (tmp_path / "tests" / "conftest.py").write_text(code_block_after("`tests/conftest.py`:"))
    (tmp_path / "tests" / "test_scheduling.py").write_text(code_block_after("`tests/test_scheduling.py`:"))
    pytest_argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    first = subprocess.run(pytest_argv + ["--snapshot-update"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert first.returncode == 1 and "4 passed" in first.stdout, first.stdout    # the new tables reported
    second = subprocess.run(pytest_argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert second.returncode == 0 and "4 passed" in second.stdout, second.stdout
