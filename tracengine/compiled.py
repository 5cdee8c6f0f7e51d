"""The compiled core: the hot modules below, compiled by mypyc from this same Python source when
the package is installed (setup.py), the Python staying the reference (tests/test_compiled_core.py
runs both and requires the same events). The block hasher is compiled by Cython instead, its C
types in the .pxd beside it: xxh64 over machine words, which mypyc's integers cannot hold.

An extension module sits before its .py on the import path, so the one that runs is decided here,
when `tracengine` is imported, before any core module is:

- no extension built (no C compiler, mypyc or Cython at install time): the Python, as always;
- TRACENGINE_PURE_PYTHON=1: the Python, the extensions skipped;
- a core .py edited since its extension was built (its hash is not the one the build recorded
  in CORE_HASHES), or extensions without that record: the Python, and one line on stderr saying
  how to rebuild; stale compiled code never runs silently.

The record also holds each source's size and modification time (its stamp), as Python's own
.pyc cache does: a source whose stamp is the recorded one is the source that was hashed, and
only a source whose stamp differs (touched, copied, edited) is read and hashed again, so an
import reads no source and loads no hash library in the common case.

The modules are compiled as one group, which calls across them natively: either all of them run
compiled or none does."""
import importlib.machinery
import importlib.util
import os
import sys
import time

CORE_MODULES = (
    "tracengine.engine.block_hasher",
    "tracengine.sim.synthetic_keys",
    "tracengine.engine.hash_id_blocks",
    "tracengine.engine.block_index",
    "tracengine.engine.free_block_queue",
    "tracengine.engine.block_pool",
    "tracengine.engine.prefix_cache",
    "tracengine.engine.sequence",
    "tracengine.engine.block_manager",
    "tracengine.engine.vllm_block_manager",
    "tracengine.engine.scheduler",
    "tracengine.engine.policies",
    "tracengine.sim.runners",
    "tracengine.analysis.step_figures",
    "tracengine.analysis.timeline",
    "tracengine.sim.clock",
    "tracengine.sim.steptime",
    "tracengine.fleet.replica",
    "tracengine.fleet.engine",
)
CYTHON_MODULES = ("tracengine.engine.block_hasher", "tracengine.sim.synthetic_keys", "tracengine.engine.block_index",
                  "tracengine.engine.prefix_cache")     # of CORE_MODULES: by Cython
# Not engine/hash_id_prompt.py: its HashIdPrompt subclasses collections.abc.Sequence, and mypyc's
# build of that class shares the ABC's registry with it (a list then stopped being a Sequence);
# the hashing of its blocks is engine/hash_id_blocks.py.
# Beside this file, written by the build: "<sha256 of the source>[/<its stamp>] <module>" a line (a build
# before stamps wrote none; one that reads no stamps finds the hash not the source's, and runs the Python)
CORE_HASHES = "compiled_core.txt"
PURE_ENV = "TRACENGINE_PURE_PYTHON"
GROUP = "tracengine_core"     # mypyc's group: one shared library beside the package, which every module's extension loads
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def source_path(module: str) -> str:
    return os.path.join(os.path.dirname(PACKAGE_DIR), *module.split(".")) + ".py"


def source_paths(module: str) -> tuple[str, str]:
    """The module's source: its .py, and the .pxd beside it that types it where one does."""
    return source_path(module), source_path(module)[:-3] + ".pxd"


def source_hash(module: str) -> str:
    """The hash of the module's source (`source_paths`, those that exist)."""
    import hashlib     # only where a stamp differs: the library costs more to load than the stamps to read
    digest = hashlib.sha256()
    for path in source_paths(module):
        if os.path.exists(path):
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def source_stamp(module: str) -> str:
    """The size and modification time (ns) of each file of the module's source that exists:
    what `source_hash` read, unless a file was written since."""
    stamps = []
    for path in source_paths(module):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        stamps.append(f"{st.st_size}:{st.st_mtime_ns}")
    return ",".join(stamps)


# A source written less than this long before its stamp was read could be written again within
# the same tick of a coarse file clock (FAT's is 2 s), at the same size, and keep that stamp.
RECENT_NS = 2_000_000_000


def record_line(module: str, built_hash: str) -> str:
    """The build's line of CORE_HASHES for `module`, whose extension was built from the source
    that hashed to `built_hash` before the build read it. Read after the build, its stamp is
    recorded where the source is still that one and was written long enough before for any
    later write to change the stamp; without one, every import hashes the source."""
    now = time.time_ns()
    stamp = source_stamp(module)     # before the source is hashed again: a write between changes the stamp
    mtimes = [int(part.split(":")[1]) for part in stamp.split(",") if part]
    if not mtimes or any(now - mtime < RECENT_NS for mtime in mtimes) or source_hash(module) != built_hash:
        return f"{built_hash} {module}"
    return f"{built_hash}/{stamp} {module}"


def built_record() -> dict[str, tuple[str, str | None]] | None:
    """module -> (the hash of the source its extension was built from, that source's stamp or
    None); None when none was built."""
    try:
        with open(os.path.join(PACKAGE_DIR, CORE_HASHES)) as f:
            lines = [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return None
    record = {}
    for stamped, module in lines:
        digest, _, stamp = stamped.partition("/")
        record[module] = (digest, stamp or None)
    if not all(has_extension(module) for module in record) or not has_group_library():
        return None
    return record


def is_built_from_source(module: str, record: dict[str, tuple[str, str | None]]) -> bool:
    """Whether the module's source is the one its extension was built from: its stamp is the
    recorded one, or else its hash is."""
    if module not in record:
        return False
    digest, stamp = record[module]
    return (stamp is not None and source_stamp(module) == stamp) or source_hash(module) == digest


def has_extension(module: str) -> bool:
    base = source_path(module)[:-3]
    return any(os.path.exists(base + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def has_group_library() -> bool:
    base = os.path.join(os.path.dirname(PACKAGE_DIR), GROUP + "__mypyc")
    return any(os.path.exists(base + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES)


class PythonSourceFinder:
    """Imports the core modules from their .py files, past their extensions."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in CORE_MODULES:
            return None
        return importlib.util.spec_from_file_location(name, source_path(name))


CORE = "undecided"     # `decide`'s answer, which `tracengine --version` prints


def decide() -> str:
    """Which core runs, set up before any core module is imported: "yes" (compiled) or "no (why)"."""
    # imported here, not at the top: setup.py runs this file before the package is importable
    import tracengine.engine.core_choice as core_choice
    global CORE
    CORE = choose()
    core_choice.COMPILED = CORE == "yes"
    return CORE


def choose() -> str:
    record = built_record()
    if record is None and not any(has_extension(module) for module in CORE_MODULES):
        return "no (not built: pure-Python install)"
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        reason = f"no ({PURE_ENV}=1)"
    elif record is None:     # extensions with no whole record of the sources they were built from: never run
        print(f"tracengine: the compiled core's build is incomplete (its record {CORE_HASHES} is missing or names "
              f"a module not built): running the pure-Python core; rebuild it with `pip install -e .`", file=sys.stderr)
        reason = "no (incomplete build)"
    else:
        stale = [module for module in CORE_MODULES if not is_built_from_source(module, record)]
        if not stale:
            return "yes"
        path = os.path.relpath(source_path(stale[0]), os.path.dirname(PACKAGE_DIR))
        print(f"tracengine: the compiled core is older than {path} (edited since the build): running the "
              f"pure-Python core; rebuild it with `pip install -e .` (or set {PURE_ENV}=1 to say so)", file=sys.stderr)
        reason = f"no (stale: {path} edited since the build)"
    sys.meta_path.insert(0, PythonSourceFinder())
    return reason


def is_compiled() -> bool:
    """Whether the core modules imported in this process are the extensions."""
    module = sys.modules.get(CORE_MODULES[0])
    return module is not None and not module.__file__.endswith(".py")
