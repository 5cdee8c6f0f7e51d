"""The shape of the package, checked: no module past 400 lines, none of the KV-block modules
past 250, and docs/architecture.md naming every part there is and no part there is not."""
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "tracengine"
MAX_MODULE_LINES = 400
MAX_BLOCK_MODULE_LINES = 250     # nano-vllm's whole block manager is 120
BLOCK_MODULES = ["free_block_queue.py", "block_pool.py", "prefix_cache.py", "block_manager.py", "vllm_block_manager.py"]


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_is_over_400_lines():
    too_long = {str(p.relative_to(ROOT)): lines_of(p) for p in PACKAGE.rglob("*.py")
                if lines_of(p) > MAX_MODULE_LINES}
    assert too_long == {}


def test_at_most_five_modules_at_the_top_of_the_package():
    assert len(list(PACKAGE.glob("*.py"))) <= 5, sorted(p.name for p in PACKAGE.glob("*.py"))


def test_the_block_manager_modules_are_each_under_250_lines():
    sizes = {name: lines_of(PACKAGE / "engine" / name) for name in BLOCK_MODULES}
    assert all(size <= MAX_BLOCK_MODULE_LINES for size in sizes.values()), sizes


def test_the_architecture_page_names_every_part_and_only_those():
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)/` \|", text, flags=re.M))
    parts = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert listed == parts


def test_one_place_reads_which_backend_a_trace_header_names():
    # trace/header.backend_of decides; commands ask cli/backends.py for the trace's commands. A
    # backend (fleet/, vllm/) reads its own header's fields: a fleet its spec
    kind = re.compile(r"""\.engine\s*[!=]=\s*["']vllm["']|is_fleet_trace|header\.fleet\s*(:|or\b|and\b|\))""")
    backends = (PACKAGE / "fleet", PACKAGE / "vllm")
    readers = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                     if p != PACKAGE / "trace" / "header.py" and p.parent not in backends and kind.search(p.read_text()))
    assert readers == []
