"""The compiled core against its Python (tracengine/compiled.py): random workloads, each run by
both in a process of its own (a process imports one core or the other), must give the same
events. The workloads mix prefix hits, preemptions (few blocks), chunked prefill (small token
budgets), both policies, both block rules of `mixed`, hash-id prompts and aborts; each also runs in
simulated time, its events folded live, which must give the same events and figures. Also: which
core runs, and that an edited core module runs its Python (never stale compiled code)."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tracengine.compiled as compiled

ROOT = Path(__file__).parent.parent
NUM_WORKLOADS = 60

# Run in a child: one digest line per seed, of the events of that seed's random run (header aside),
# and of the events and figures of the same workload in simulated time, folded as they come.
CHILD = r"""
import dataclasses, hashlib, random, sys
import msgspec
from tracengine.analysis.stats import stats
from tracengine.analysis.timeline_sink import RequestTimelineSink
from tracengine.engine.config import Config
from tracengine.engine.hash_id_prompt import HashIdPrompt
from tracengine.sim.engine import run_timed
from tracengine.sim.runners import SyntheticRunner, run_workload
from tracengine.sim.steptime import PARTS, PHASES, LinearStepTime
from tracengine.testing import random_workload
from tracengine.trace.sinks import ListSink
from tracengine.trace.tracelog import make_header
from tracengine.trace.views import without_wall_clock

STEP_TIME = LinearStepTime({phase: {part: [20_000.0, 1_234.5, 777.25, 3.3, 0.01] for part in PARTS}
                            for phase in PHASES}, gap_ns=5_000)

def workload(seed):
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 8])
    policy = rng.choice(["prefill_first", "mixed"])
    rules = rng.choice(["nano-vllm", "vllm"]) if policy == "mixed" else "auto"
    requests = random_workload(rng, num_requests=rng.randint(1, 14), max_prompt_len=48, block_size=block_size)
    for r in requests:
        if rng.random() < 0.2:       # a client that leaves
            r.abort_step = r.arrival_step + rng.randint(0, 6)
        if rng.random() < 0.15:      # a prompt known by its hash ids (prefix hits by hash id)
            num_ids = rng.randint(1, 3)
            r.prompt = HashIdPrompt([rng.randrange(4) + i for i in range(num_ids)], num_ids * 8 - rng.randrange(8), 8)
    longest = max(len(r.prompt) + r.max_tokens for r in requests)
    config = Config(num_kvcache_blocks=-(-longest // block_size) + rng.randint(0, 12), kvcache_block_size=block_size,
                    max_num_batched_tokens=rng.choice([8, 16, 32, 64, 4096]), max_num_seqs=rng.randint(1, 8),
                    max_model_len=4096, eos=999, scheduling_policy=policy, block_rules=rules,
                    enable_prefix_caching=rng.random() < 0.85)
    return config, requests, policy

encoder = msgspec.msgpack.Encoder()
for seed in map(int, sys.argv[1:]):
    config, requests, policy = workload(seed)
    events = run_workload(config, requests, SyntheticRunner(eos=999, eos_at={0: 3}), policy=policy)[1:]
    print(seed, len(events), hashlib.sha256(encoder.encode([without_wall_clock(e) for e in events])).hexdigest())
    sink = RequestTimelineSink(make_header(config), ListSink())
    timed = [dataclasses.replace(r, arrival_ns=r.arrival_step * 50_000) for r in requests]
    run_timed(config, timed, STEP_TIME, SyntheticRunner(eos=999, eos_at={0: 3}), sink, policy=policy)
    print(seed, hashlib.sha256(encoder.encode(sink.inner.events)).hexdigest(),
          hashlib.sha256(msgspec.json.encode(stats(sink.timeline))).hexdigest())
"""


def run_child(seeds, pure: bool) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), compiled.PURE_ENV: "1" if pure else "0"}
    result = subprocess.run([sys.executable, "-c", CHILD, *map(str, seeds)], capture_output=True, text=True, env=env,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def core_of(env: dict) -> str:
    code = "import tracengine.compiled as c, tracengine.engine.scheduler; print(c.CORE, c.is_compiled())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}).stdout.strip()


needs_build = pytest.mark.skipif(compiled.built_record() is None, reason="the core is not compiled here (no build)")


@needs_build
def test_the_compiled_core_gives_the_events_of_its_python():
    seeds = range(NUM_WORKLOADS)
    ours, reference = run_child(seeds, pure=False), run_child(seeds, pure=True)
    assert len(ours) == 2 * NUM_WORKLOADS
    assert [line for line, ref in zip(ours, reference) if line != ref] == []
    assert ours == reference


@needs_build
def test_pure_python_env_runs_the_python_core():
    assert core_of({compiled.PURE_ENV: "0"}) == "yes True"
    assert core_of({compiled.PURE_ENV: "1"}) == f"no ({compiled.PURE_ENV}=1) False"


@needs_build
@pytest.mark.parametrize("edited", ["block_pool.py", "block_hasher.pxd"])
def test_an_edited_core_module_runs_its_python_and_says_how_to_rebuild(tmp_path, edited):
    """A copy of the package whose block pool (mypyc's), or the C types of whose block hasher
    (Cython's), were edited after the build: the Python runs, and one line on stderr says so;
    the compiled code of the old source never runs."""
    copy = tmp_path / "tracengine"
    shutil.copytree(ROOT / "tracengine", copy, ignore=shutil.ignore_patterns("__pycache__"))
    for lib in ROOT.glob("tracengine_core__mypyc*"):      # the group's shared library, beside the package
        shutil.copy(lib, tmp_path)
    with open(copy / "engine" / edited, "a") as f:
        f.write("\n# edited\n")
    code = "import tracengine.compiled as c, tracengine.engine.block_pool as b; print(c.CORE, c.is_compiled())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(tmp_path), compiled.PURE_ENV: "0"})
    assert result.returncode == 0, result.stderr
    module = edited.split(".")[0] + ".py"
    assert result.stdout.strip() == f"no (stale: tracengine/engine/{module} edited since the build) False"
    assert result.stderr.count("\n") == 1 and "rebuild it with `pip install -e .`" in result.stderr


def copy_of_the_package(tmp_path) -> Path:
    """A copy of the compiled package (its files' sizes and modification times kept) beside its group library."""
    copy = tmp_path / "tracengine"
    shutil.copytree(ROOT / "tracengine", copy, ignore=shutil.ignore_patterns("__pycache__"))
    for lib in ROOT.glob(f"{compiled.GROUP}__mypyc*"):
        shutil.copy(lib, tmp_path)
    return copy


def core_in(tmp_path, code: str = "") -> subprocess.CompletedProcess:
    code += "import tracengine.compiled as c, tracengine.engine.scheduler; print(c.CORE, c.is_compiled())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path), compiled.PURE_ENV: "0"})


@needs_build
def test_a_build_whose_sources_are_untouched_reads_none_of_them(tmp_path):
    """Each source's size and modification time are the ones the record holds: the import hashes
    no source (the hash library cannot even be imported) and runs the compiled core."""
    record = compiled.built_record()
    assert all(compiled.source_hash(module) == digest for module, (digest, _) in record.items())   # built from these
    copy = copy_of_the_package(tmp_path)
    # the copy's record stamped with its own sources' stamps, whenever the build stamped them or not
    # (it stamps none written just before it ended)
    stamped = subprocess.run(
        [sys.executable, "-c", "import tracengine.compiled as c\n"
         "print(''.join(f'{digest}/{c.source_stamp(m)} {m}\\n' for m, (digest, _) in c.built_record().items()), end='')"],
        capture_output=True, text=True, check=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    (copy / compiled.CORE_HASHES).write_text(stamped.stdout)
    result = core_in(tmp_path, "import sys; sys.modules['hashlib'] = None\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "yes True" and result.stderr == ""


@needs_build
@pytest.mark.parametrize("change", ["touched", "same size", "record without stamps"])
def test_a_source_whose_stamp_differs_is_hashed(tmp_path, change):
    """A source touched (its text the same), or a record written before stamps were: the source
    is hashed, and the compiled core runs. A source edited at the same size: its Python runs."""
    copy = copy_of_the_package(tmp_path)
    source = copy / "engine" / "block_pool.py"
    if change == "touched":
        os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))
    elif change == "same size":
        text = source.read_bytes()
        source.write_bytes(text[:-1] + (b" " if text[-1:] != b" " else b"\n"))
    else:
        record = copy / compiled.CORE_HASHES
        record.write_text(re.sub(r"/\S+", "", record.read_text()))
    result = core_in(tmp_path)
    assert result.returncode == 0, result.stderr
    if change == "same size":
        assert result.stdout.strip() == "no (stale: tracengine/engine/block_pool.py edited since the build) False"
        assert result.stderr.count("\n") == 1
    else:
        assert result.stdout.strip() == "yes True" and result.stderr == ""


def test_the_build_records_the_stamp_of_a_source_it_can_tell_from_a_later_write(monkeypatch):
    """A source still the one the build hashed before reading it, written long enough before its
    stamp was read (a later write changes the stamp), is recorded with its stamp; else without."""
    module = "tracengine.engine.block_pool"
    digest = compiled.source_hash(module)
    monkeypatch.setattr(compiled, "RECENT_NS", -10**30)     # every write long enough before
    assert compiled.record_line(module, digest) == f"{digest}/{compiled.source_stamp(module)} {module}"
    assert compiled.record_line(module, "0" * 64) == f"{'0' * 64} {module}"     # edited during the build
    monkeypatch.setattr(compiled, "RECENT_NS", 10**30)      # every write too recent
    assert compiled.record_line(module, digest) == f"{digest} {module}"


@needs_build
@pytest.mark.parametrize("missing", ["record", "group library"])
def test_extensions_without_the_record_of_their_sources_or_their_library_never_run(tmp_path, missing):
    """A copy of the compiled package whose record of the sources it was built from, or whose
    group's shared library, is gone (a build cut short): the Python runs, and one line says so."""
    copy = tmp_path / "tracengine"
    shutil.copytree(ROOT / "tracengine", copy, ignore=shutil.ignore_patterns(
        "__pycache__", *([compiled.CORE_HASHES] if missing == "record" else [])))
    for lib in ROOT.glob(f"{compiled.GROUP}__mypyc*") if missing == "record" else []:
        shutil.copy(lib, tmp_path)
    code = "import tracengine.compiled as c, tracengine.engine.block_pool; print(c.CORE, c.is_compiled())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(tmp_path), compiled.PURE_ENV: "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no (incomplete build) False"
    assert result.stderr.count("\n") == 1 and "build is incomplete" in result.stderr


def test_version_says_which_core_runs():
    result = subprocess.run([sys.executable, "-m", "tracengine.cli", "--version"], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), compiled.PURE_ENV: "1"})
    assert result.stdout.splitlines()[1] == ("compiled core: no (not built: pure-Python install)"
                                             if compiled.built_record() is None else
                                             f"compiled core: no ({compiled.PURE_ENV}=1)")


def test_importing_the_core_leaves_the_standard_abcs_alone():
    """A class mypyc builds from a subclass of an ABC can share the ABC's registry (a list then
    stopped being a collections.abc.Sequence): the core holds none such."""
    code = ("import collections.abc as abc, importlib, tracengine.compiled as c\n"
            "for module in c.CORE_MODULES: importlib.import_module(module)\n"
            "from tracengine.engine.hash_id_prompt import HashIdPrompt\n"
            "print(isinstance([1], abc.Sequence), isinstance([1], HashIdPrompt))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.stdout.split() == ["True", "False"]


def test_setup_reads_the_core_list_where_the_package_cannot_be_imported(tmp_path):
    # pip's build backend runs setup.py with neither the source tree nor site-packages' install of it on the path
    code = f"import runpy; print(len(runpy.run_path({str(ROOT / 'tracengine' / 'compiled.py')!r})['CORE_MODULES']))"
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                            env={name: value for name, value in os.environ.items() if name != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout) == len(compiled.CORE_MODULES)


def test_an_installed_package_holds_the_whole_source_of_each_compiled_module():
    """A .pxd is part of its module's recorded source (compiled.source_paths): `pip install .` must
    install it beside the .py, or the installed core finds its source changed and runs as Python."""
    import tomllib
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for module in compiled.CORE_MODULES:
        pxd = Path(compiled.source_paths(module)[1])
        if pxd.exists():
            package = module.rsplit(".", 1)[0]
            assert any(pxd.match(pattern) for pattern in package_data.get(package, [])), \
                f"{pxd.name} is not in pyproject.toml's package-data for {package}"


def build_in_copy(tmp_path, env: dict) -> subprocess.CompletedProcess:
    """setup.py's build of the core in a copy of the source tree, under `env`."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path)
    shutil.copytree(ROOT / "tracengine", tmp_path / "tracengine",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", compiled.CORE_HASHES))
    base = {name: value for name, value in os.environ.items() if name != compiled.PURE_ENV}   # a build that compiles
    return subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], capture_output=True, text=True,
                          cwd=tmp_path, env={**base, **env})


def fallback_checked(tmp_path, result: subprocess.CompletedProcess, why: str):
    """The build went on without the compiled core, said why once, and left a pure-Python package."""
    assert result.returncode == 0, result.stderr[-2000:]
    said = [line for line in result.stderr.splitlines() if line.startswith("tracengine: ")]
    assert len(said) == 1 and why in said[0], result.stderr[-2000:]
    assert not list((tmp_path / "tracengine").rglob("*.so")) and not (tmp_path / "tracengine" / compiled.CORE_HASHES).exists()
    version = subprocess.run([sys.executable, "-m", "tracengine.cli", "--version"], capture_output=True, text=True,
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert version.stdout.splitlines()[1] == "compiled core: no (not built: pure-Python install)"


@pytest.mark.parametrize("compiler", ["mypyc", "Cython"])
def test_without_a_compiler_package_the_install_goes_on_with_the_python_core_and_says_so_once(tmp_path, compiler):
    hidden = tmp_path / "hidden"        # a compiler package that cannot be imported, first on the path
    (hidden / compiler).mkdir(parents=True)
    (hidden / compiler / "__init__.py").write_text(f"raise ImportError('no {compiler} here')\n")
    (tmp_path / "src").mkdir()
    result = build_in_copy(tmp_path / "src", {"PYTHONPATH": str(hidden)})
    fallback_checked(tmp_path / "src", result, f"{compiler} is not installed: installing the pure-Python core")


@pytest.mark.skipif(importlib.util.find_spec("mypyc") is None, reason="mypyc is not installed")
def test_without_a_c_compiler_the_install_goes_on_with_the_python_core_and_says_so_once(tmp_path):
    result = build_in_copy(tmp_path, {"CC": "false", "LDSHARED": "false"})
    fallback_checked(tmp_path, result, "the C compiler could not build the core")
