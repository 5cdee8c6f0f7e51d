"""The import rules, checked two ways: each part imported in a fresh
interpreter (what is in sys.modules afterwards), and every import statement
of its modules and of the project modules they reach, read with ast (so an
import inside a function, run only later, counts too).

- the scheduler, block manager, sequence and config import no torch and no I/O
  module, and call no open/print/input;
- replay, analysis and the TUI import no model, no runner and no torch;
- the event vocabulary imports nothing of the project;
- simulation imports nothing of replay (replay runs the simulator, not the other way);
- model/ imports nothing of runner/ (the runner plugs its attention backends into the model's layers);
- nothing outside cli/ imports argparse (flags become plain values there);
- optional extras (vLLM, Ray, matplotlib) are imported inside functions only."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "tracengine"

TORCH = {"torch", "transformers", "safetensors", "tokenizers", "triton", "flash_attn"}
IO = {"os", "io", "pathlib", "shutil", "socket", "subprocess", "tempfile", "glob", "mmap", "fcntl", "select",
      "urllib", "http", "sqlite3", "pickle", "json", "logging", "tracengine.trace.tracelog"}
MODEL_SIDE = {"tracengine.model", "tracengine.runner", "tracengine.engine.llm"}

CORE = [f"tracengine.engine.{name}" for name in ("scheduler", "block_manager", "block_pool", "prefix_cache", "sequence",
                                                 "cpu_tier", "offload_scheduling",
                                                 "config", "request", "policies")
        if (PACKAGE / "engine" / f"{name}.py").exists()]


def modules_of(part: str) -> list[str]:
    folder = PACKAGE / part
    return sorted(f"tracengine.{part}." + ".".join(p.relative_to(folder).with_suffix("").parts)
                  for p in folder.rglob("*.py") if p.name != "__init__.py")


MODEL_FREE = {part: modules_of(part) for part in ("replay", "sim", "analysis", "tui")}

# rule: (modules, what none of them may reach)
RULES = {"core": (CORE, TORCH | IO), **{part: (mods, TORCH | MODEL_SIDE) for part, mods in MODEL_FREE.items()},
         "sim below replay": (modules_of("sim"), {"tracengine.replay"}),
         "model below runner": (modules_of("model"), {"tracengine.runner"}),
         "workload": (modules_of("workload"), TORCH | {"argparse"})}
EXTRAS = {"vllm", "sglang", "ray", "matplotlib", "flash_attn"}


def source_of(module: str) -> Path | None:
    path = ROOT.joinpath(*module.split("."))
    if path.with_suffix(".py").exists():
        return path.with_suffix(".py")
    return None     # a package (its __init__ imports lazily, in __getattr__) or not ours


def imports_in(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)   # `from pkg import module`
    return names


def reached(module: str) -> dict[str, str]:
    """Every name imported by `module` and by the project modules it reaches: name -> the module importing it."""
    seen, todo, found = {module}, [module], {}
    while todo:
        current = todo.pop()
        for name in imports_in(source_of(current)):
            found.setdefault(name, current)
            if name.startswith("tracengine.") and source_of(name) is not None and name not in seen:
                seen.add(name)
                todo.append(name)
    return found


def forbidden(name: str, rule: set[str]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in rule)


@pytest.mark.parametrize("part", RULES)
def test_the_import_rules_hold_in_every_statement(part):
    modules, rule = RULES[part]
    assert modules
    broken = [f"{module} reaches {name} (imported by {by})"
              for module in modules for name, by in sorted(reached(module).items()) if forbidden(name, rule)]
    assert broken == []


def test_the_core_calls_no_io():
    for module in CORE:
        for node in ast.walk(ast.parse(source_of(module).read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in {"open", "print", "input"}, f"{module}:{node.lineno} calls {node.func.id}"


@pytest.mark.parametrize("part", RULES)
def test_the_import_rules_hold_in_a_fresh_interpreter(part):
    modules, rule = RULES[part]
    already = sorted(set(sys.stdlib_module_names) & {r for r in rule if "." not in r}
                     & set(subprocess.run([sys.executable, "-c", "import sys; print(*sys.modules)"],
                                          capture_output=True, text=True, check=True).stdout.split()))
    # modules the interpreter loads before any of ours (io, os) cannot be told apart at run time: ast checks them
    code = (f"import sys\nrule = {sorted(set(rule) - set(already))!r}\n"
            f"for module in {modules!r}:\n"
            "    __import__(module)\n"
            "    bad = sorted(m for m in sys.modules if any(m == r or m.startswith(r + '.') for r in rule))\n"
            "    assert not bad, f'{module} brings in {bad}'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1]


def test_the_event_vocabulary_imports_nothing_of_the_project():
    # tracengine.compiled: the package's own import decides which core runs (stdlib only)
    assert not [name for name in imports_in(source_of("tracengine.trace.events")) if name.startswith("tracengine")]
    code = ("import sys, tracengine.trace.events\n"
            "ours = sorted(m for m in sys.modules if m.startswith('tracengine'))\n"
            "assert ours == ['tracengine', 'tracengine.compiled', 'tracengine.engine', 'tracengine.engine.core_choice', "
            "'tracengine.trace', 'tracengine.trace.events'], ours\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("module", ["tracengine", "tracengine.engine.scheduler", "tracengine.engine.llm_engine",
                                    "tracengine.cli", "tracengine.workload.sources"])
def test_no_torch(module):
    code = f"import sys, {module}; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def top_level_imports(path: Path) -> set[str]:
    """The modules a file imports at its top (not inside a function)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


def test_only_the_command_line_imports_argparse():
    users = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
             if p.parent.name != "cli" and "argparse" in imports_in(p)]
    assert users == []


def test_optional_extras_are_imported_inside_functions_only():
    at_top = {str(p.relative_to(ROOT)): sorted(n for n in top_level_imports(p) if n.split(".")[0] in EXTRAS)
              for p in PACKAGE.rglob("*.py")}
    assert {path: names for path, names in at_top.items() if names} == {}


def test_a_command_line_that_names_its_command_imports_no_other_command():
    """`tracengine simulate ...` builds simulate's parser only: neither the server's modules nor
    asyncio are imported for it (the full parser, for a command line without one, imports all)."""
    code = ("import sys; from tracengine.cli.main import main; "
            "assert main(['simulate', 'no-such-workload.jsonl', '--num-kvcache-blocks', '8', "
            "'--step-time', 'no-such-model.json']) == 2; "
            "print(*sorted(m for m in sys.modules if m.startswith('tracengine.cli.') or m == 'asyncio'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    modules = set(result.stdout.split())
    assert "tracengine.cli.simulate" in modules
    assert not modules & {"asyncio", "tracengine.cli.serve", "tracengine.cli.generate", "tracengine.cli.tui"}


def test_one_engines_simulation_imports_no_fleet_sweep_or_roofline():
    """A plain `simulate` (one engine, a calibrated step-time model, no --sweep, --search or
    fleet flag) imports only what its run uses: the fleet's spec and routers, the sweep grid and
    the roofline load inside the paths that use them, the trace's reader and writer where a
    trace is read or --record written, the CSV reader for an Azure trace, and rich's emoji codes
    where a table has one (a process's start is part of every run)."""
    code = ("import sys; from tracengine.cli.main import main; "
            f"assert main(['simulate', {str(ROOT / 'tests/data/mooncake_sample.jsonl')!r}, '--quiet', "
            f"'--step-time', {str(ROOT / 'tests/data/fixed_steptime.json')!r}, '--num-kvcache-blocks', '400']) == 0; "
            "print(*sorted(sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    modules = set(result.stdout.splitlines()[-1].split())     # after the run's table
    assert "tracengine.sim.engine" in modules
    assert not modules & ({"tracengine.fleet.spec", "tracengine.fleet.routers", "tracengine.fleet.engine",
                           "tracengine.sim.sweep", "tracengine.sim.spec", "tracengine.sim.search",
                           "tracengine.sim.roofline", "rich._emoji_codes",
                           "tracengine.trace.reader", "tracengine.trace.writer", "csv"} | TORCH)


def project_modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules its statements import (inside functions too)."""
    modules = project_modules()
    return {module: {name for name in imports_in(path) if name in modules and name != module}
            for module, path in modules.items()}


def test_no_import_cycle_anywhere_counting_imports_inside_functions():
    graph = import_graph()
    state: dict[str, int] = {}      # 1: on the path being walked, 2: done
    cycles = []

    def walk(module, path):
        state[module] = 1
        for name in sorted(graph[module]):
            if state.get(name) == 1:
                cycles.append(" -> ".join(path[path.index(name):] + [name]))
            elif name not in state:
                walk(name, path + [name])
        state[module] = 2
    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert cycles == []


# The parts from the bottom up: a part imports only parts below it or beside it on its layer.
# engine/llm.py (LLM: the engine with a model runner) sits above runner/, the rest of engine/ below;
# engine/native.py (what the compiled core's classes say to mypyc, and the forms it keeps per-block
# data in: engine/block_index.py, stdlib only, among them) beside compiled.py, for the core's modules in
# analysis/ and sim/ too.
LAYERS = [["tracengine.errors", "tracengine.version", "tracengine.process", "tracengine.compiled",
           "tracengine.engine.core_choice", "tracengine.engine.native", "tracengine.engine.block_index"],
          ["tracengine.jsonfile", "tracengine.trace"],
          ["tracengine.model", "tracengine.analysis"],
          ["tracengine.engine"],
          ["tracengine.runner"],
          ["tracengine.engine.llm", "tracengine.workload"],
          ["tracengine.sim"],
          ["tracengine.replay"],
          ["tracengine.vllm", "tracengine.sglang", "tracengine.fleet"],
          ["tracengine.serve", "tracengine.tui"],
          ["tracengine.testing"],
          ["tracengine.cli"],
          ["tracengine"]]


def layer_of(module: str) -> int:
    matches = [(len(part), i) for i, layer in enumerate(LAYERS) for part in layer
               if module == part or module.startswith(part + ".")]
    assert matches, f"{module} is in no layer: add its part to LAYERS and docs/architecture.md"
    return max(matches)[1]


def test_the_layers_read_bottom_to_top():
    upward = sorted(f"{module} imports {name}" for module, names in import_graph().items() for name in names
                    if layer_of(name) > layer_of(module))
    assert upward == []

