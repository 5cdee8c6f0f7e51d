"""What a command says where it used to say nothing or the wrong thing: each exit code of
--help on its own line, a trace with no step to replay, a router without replicas, a step
or sequence the trace lacks, two traces of different workloads. (Elsewhere: bench-serve's
progress in test_serve.py, a Mooncake row's extra hash ids in test_workloads.py, a sweep
stopped in test_sweep_signals.py.)"""
import json
import re
from pathlib import Path

import pytest

from tests.helpers import SLOW_DEVICE, SWEEP_MODEL
from tracengine.cli import main
from tracengine.cli.common import (EXIT_BAD_INPUT, EXIT_FAILED_CHECK, EXIT_INTERRUPTED, EXIT_NOT_ENDED,
                                   EXIT_NOT_INSTALLED, EXIT_OK, EXIT_PIPE_CLOSED, EXIT_RUN_FAILED, EXIT_TERMINATED)
from tracengine.cli.main import build_parser
from tracengine.engine.config import Config
from tracengine.trace.tracelog import TraceReader, TraceWriter, make_header

TRACES = Path(__file__).resolve().parent.parent / "traces"

EXIT_STATUSES = (EXIT_OK, EXIT_FAILED_CHECK, EXIT_BAD_INPUT, EXIT_NOT_ENDED, EXIT_RUN_FAILED, EXIT_NOT_INSTALLED,
                 EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_PIPE_CLOSED)


def exit_code_lines(help_text: str) -> dict[int, list[str]]:
    """The lines of the exit-status epilog, by the code each starts with."""
    epilog = help_text[help_text.index("exit status:"):].splitlines()[1:]
    found: dict[int, list[str]] = {}
    for line in epilog:
        head = re.match(r"  (\d+) ", line)
        if head:
            found.setdefault(int(head.group(1)), []).append(line)
    return found


def test_each_exit_code_of_every_help_is_on_its_own_line():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in [("tracengine", parser), *sub.choices.items()]:
        text = command.format_help()
        lines = exit_code_lines(text)
        assert sorted(lines) == sorted(EXIT_STATUSES), (name, text)
        for code, [line] in lines.items():
            others = [c for c in EXIT_STATUSES if c != code and re.search(rf"\s{c}\s\s", line)]
            assert not others, (name, line)


# --- replay of a trace with no step ---------------------------------------------------------------

def header_only(path):
    TraceWriter(path, make_header(Config(num_kvcache_blocks=8, kvcache_block_size=4))).close()
    return path


def torn_in_its_first_step(path):
    data = (TRACES / "preemption.trace").read_bytes()
    with TraceReader(TRACES / "preemption.trace") as reader:
        first_step = reader.frames()[1].offset
    path.write_bytes(data[:first_step + 12])
    return path


@pytest.mark.parametrize("make, detail", [(header_only, ""), (torn_in_its_first_step, " (torn last frame: ")])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_trace_with_no_complete_step_is_no_replay(tmp_path, capsys, make, detail, as_json):
    path = make(tmp_path / "no_step.trace")
    code = main(["replay", str(path), *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == EXIT_BAD_INPUT and out == ""
    assert err.startswith(f"tracengine: error: {path}: the trace has no complete step to replay{detail}")
    assert err.count("\n") == 1


# --- simulate: a router needs replicas --------------------------------------------------------------

@pytest.fixture
def roofline(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SWEEP_MODEL))
    return str(path)


@pytest.mark.parametrize("flags, named", [
    (["--router", "least_loaded"], "--router goes"),
    (["--router", "least_loaded", "--router-seed", "3"], "--router, --router-seed go"),
    (["--prefix-weight", "2"], "--prefix-weight goes"),
    (["--router", "least_loaded", "--sweep", "max_num_seqs=1,2", "--no-cache"], "--router goes"),
])
def test_a_router_without_replicas_is_refused(roofline, capsys, flags, named):
    code = main(["simulate", "--num-prompts", "4", "--roofline", roofline, *SLOW_DEVICE, "--set",
                 "num_kvcache_blocks=400", "--quiet", *flags])
    out, err = capsys.readouterr()
    assert code == EXIT_BAD_INPUT and out == "", out
    assert err.startswith(f"tracengine: error: {named} with a fleet: give --replicas N") and err.count("\n") == 1


def test_a_router_with_replicas_routes_and_one_replica_is_one_engine(roofline, capsys):
    argv = ["simulate", "--num-prompts", "4", "--roofline", roofline, *SLOW_DEVICE, "--set", "num_kvcache_blocks=400",
            "--quiet", "--router", "least_loaded"]
    assert main([*argv, "--replicas", "2"]) == EXIT_OK
    assert "2 replicas, router least_loaded" in capsys.readouterr().out
    assert main([*argv, "--replicas", "1"]) == EXIT_OK        # docs/cluster.md: one replica, with any router
    assert "simulated run" in capsys.readouterr().out


# --- render: a step or sequence the trace lacks ------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--steps", "99999"], "--steps 99999: not in {path}, which has steps 0..44"),
    (["--steps", "45:"], "--steps 45:: not in {path}, which has steps 0..44"),
    (["--seq", "999"], "--seq 999: not in {path}, which has sequences 0..3"),
    (["--steps", "30:", "--seq", "0"], "--seq 0: no step of --steps 30: has an event of sequence 0, "
                                       "which is in steps 0..23"),
])
def test_render_of_a_step_or_sequence_the_trace_lacks_says_so(capsys, flags, message):
    path = TRACES / "preemption.trace"
    code = main(["render", str(path), *flags])
    out, err = capsys.readouterr()
    assert code == EXIT_BAD_INPUT and out == ""
    assert err == f"tracengine: error: {message.format(path=path)}\n"


def test_render_of_steps_partly_in_the_trace_shows_those_it_has(capsys):
    assert main(["render", str(TRACES / "preemption.trace"), "--steps", "43:100", "--seq", "3"]) == EXIT_OK
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines() if not line.startswith("#")] == \
        ["43", "44"]


# --- diff of two workloads ---------------------------------------------------------------------------

def simulated(tmp_path, roofline, name: str, *flags) -> str:
    path = str(tmp_path / f"{name}.trace")
    assert main(["simulate", "--roofline", roofline, *SLOW_DEVICE, "--set", "num_kvcache_blocks=64", "--quiet",
                 "--max-tokens", "4", "--record", path, *flags]) == EXIT_OK
    return path


@pytest.mark.parametrize("flags_b, difference", [
    (["--prompt-lens", "30,9"], "request s1's prompt differs (a: 8 tokens, b: 9)"),
    (["--prompt-lens", "30,8", "--seed", "1"], "request s0's prompt differs (both 30 tokens, not the same ones)"),
    (["--prompt-lens", "30,8,5"], "a has 2 requests, b 3; request s2 is only in b"),
])
def test_diff_of_two_workloads_says_so_before_the_divergence(tmp_path, roofline, capsys, flags_b, difference):
    a = simulated(tmp_path, roofline, "a", "--prompt-lens", "30,8")
    b = simulated(tmp_path, roofline, "b", *flags_b)
    capsys.readouterr()
    code = main(["diff", a, b])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"the two traces ran different workloads: {difference}"
    main(["diff", a, b, "--json"])
    assert json.loads(capsys.readouterr().out)["workload_difference"] == difference
    assert code in (EXIT_OK, EXIT_FAILED_CHECK)


def test_diff_of_one_workload_under_two_configs_names_no_workload(tmp_path, roofline, capsys):
    a = simulated(tmp_path, roofline, "a", "--prompt-lens", "30,8,20")
    b = simulated(tmp_path, roofline, "b", "--prompt-lens", "30,8,20", "--set", "max_num_seqs=1")
    capsys.readouterr()
    assert main(["diff", a, b]) == EXIT_FAILED_CHECK
    out = capsys.readouterr().out
    assert "different workloads" not in out and out.startswith("config: max_num_seqs 512 vs 1")
