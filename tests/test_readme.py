"""The README's commands run, in order, on a fresh clone, as a newcomer types them after the
set-up line (issue 34, item 11; hardening items 14-17), and its sample output is what the
commands print today."""
import os
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


# Commands the run-through parses but does not run, and why: interactive, a server, a checkpoint of your own.
NOT_RUN = {"tui": "interactive", "serve": "a server", "bench-serve": "needs a server"}
# The set-up line (the README's first block): it installs, then runs the main job on the embedded
# model and records run.trace, which the Commands block goes on from.
SETUP_LINE = 'pip install torch==2.13.0 && pip install -e ".[dev]" && tracengine generate --record run.trace'


def readme_shell_lines() -> list[str]:
    """Every command of the README's shell blocks (```bash and plain ones), in order, as typed:
    continuation lines joined, each part of an `a && b` line a command of its own, comments
    dropped. A line that is not a command (a sample of output) is left out."""
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"^```(?:bash)?\n(.*?)^```", text, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split(" && "):
                if part.split()[:1] in (["tracengine"], ["pip"], ["python"], ["mkdir"]):
                    lines.append(re.sub(r"\s+#.*", "", part).strip())
    return lines


def as_typed(line: str) -> list[str]:
    """A command's arguments, its optional `[...]` parts left out as a newcomer leaves them."""
    return shlex.split(re.sub(r"\s\[[^]]*\](?:\s\[[^]]*\])*", "", line), comments=True)


def readme_commands() -> list[list[str]]:
    """The arguments of every `tracengine` command of the README's shell blocks, in order."""
    return [as_typed(line)[1:] for line in readme_shell_lines() if line.startswith("tracengine ")]


def is_run(argv: list[str]) -> bool:
    return argv[0] not in NOT_RUN and not any(a.startswith("~") for a in argv)    # not a checkpoint of yours


def test_the_set_up_line_installs_and_records_run_trace_once():
    """The set-up line installs and records run.trace; the Commands block goes on from it and
    never records run.trace again (a second record of it is refused without --force)."""
    lines = readme_shell_lines()
    assert " && ".join(lines[:3]) == SETUP_LINE
    assert lines[3] == "python -m pytest -q"
    assert not [line for line in lines[4:] if as_typed(line)[:4] == ["tracengine", "generate", "--record", "run.trace"]]


@pytest.mark.model
def test_the_readme_commands_run_in_order_as_typed_on_a_fresh_clone(tmp_path, monkeypatch, capsys):
    """Each command of the README's blocks, after the set-up line, in order, in one folder
    holding what a clone has: exactly the arguments shown (no flag added), exit 0 (diff: 1,
    the divergence it reports), no traceback."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")     # what a clone has
    monkeypatch.chdir(tmp_path)
    lines = readme_shell_lines()
    ran, printed = [], {}
    for line in lines:
        argv = as_typed(line)
        if argv[0] == "pip" or argv[:3] == ["python", "-m", "pytest"]:
            continue       # installs (the set-up line; the snapshot section's, in a project of yours) and the tests
        if argv[:2] == ["mkdir", "-p"]:
            os.makedirs(argv[2], exist_ok=True)
            continue
        assert argv[0] == "tracengine", line
        if not is_run(argv[1:]):
            continue
        code = main(argv[1:])
        out, err = capsys.readouterr()
        assert code in ((0, 1) if argv[1] == "diff" else (0,)), (line, err)
        assert "Traceback" not in err, (line, err)
        ran.append(argv[1:])
        printed[line] = out
    assert ran[0] == ["generate", "--record", "run.trace"]
    assert ["replay", "run.trace", "--sweep", "num_kvcache_blocks=24,48,96", "--slo", "ttft=200ms"] in ran
    assert {"run.trace", "whatif.trace", "online.trace", "steptime.json", "sim.trace", "out.json"} <= \
        {p.name for p in tmp_path.iterdir()}
    assert_the_examples_show_what_they_describe(printed)


def assert_the_examples_show_what_they_describe(printed: dict):
    """The capacity search finds each config's capacity on the example workload (a rate, not
    the search's ceiling), and the Mooncake example's flags each change the run."""
    [search] = [out for line, out in printed.items() if "--search request_rate" in line]
    rows = [line.split() for line in search.splitlines() if line.split()[:1] in (["64"], ["256"])]
    assert len(rows) == 2 and "never saturated" not in search, search
    assert all(0 < float(row[1].replace(",", "")) < 1000 for row in rows), search   # requests/s
    [(line, out)] = [(line, out) for line, out in printed.items() if "--workload examples/mooncake.jsonl" in line
                     and line.startswith("tracengine generate")]
    argv = as_typed(line)
    max_requests = int(argv[argv.index("--max-requests") + 1])
    assert len(pathlib.Path("examples/mooncake.jsonl").read_text().splitlines()) > max_requests   # it cuts
    summary = dict(re.findall(r"^(\w+) +(.*)$", out, re.M))
    assert summary["requests"].startswith(f"{max_requests} ")
    assert "decode 0 tok/s" not in summary["throughput"] and "TPOT p50 - ms" not in summary["latency"], out


def test_the_commands_not_run_parse_as_written():
    """The interactive, server and checkpoint commands of the blocks, and the commands the
    prose shows with arguments, are each a valid command line."""
    from tracengine.cli.main import build_parser
    inline = [shlex.split(span)[1:] for span in re.findall(r"`(tracengine [^`]*)`", (ROOT / "README.md").read_text())]
    parser = build_parser()
    for argv in [a for a in readme_commands() if not is_run(a)] + [a for a in inline if len(a) > 1]:
        assert parser.parse_args(argv).command == argv[0]


def code_block_after(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("```", text.index(marker))
    start = text.index("\n", start) + 1
    return text[start:text.index("```", start)]


def test_the_snapshot_sections_install_line_installs_the_testing_extra(tmp_path):
    pip_lines = [line for line in code_block_after("In your own project").splitlines() if line.startswith("pip ")]
    # the CPU torch first, as the set-up line has it: else the extra's torch>=2.4 resolves a CUDA build
    assert shlex.split(pip_lines[0], comments=True) == shlex.split(SETUP_LINE.split(" && ")[0])
    argv = shlex.split(pip_lines[1], comments=True)
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
