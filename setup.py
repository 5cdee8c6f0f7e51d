"""The compiled core (tracengine/compiled.py): its modules compiled by mypyc from their Python
source, the block hasher by Cython (its C types in the .pxd beside it), where mypyc, Cython and a
C compiler are present; the pure-Python package where not (said once). The build records each
compiled source's hash and stamp, which `import tracengine` compares against the sources (an edited
module never runs stale compiled code)."""
import os
import runpy
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
# the list and the names, from their one definition (stdlib only), without importing the package
CORE = runpy.run_path(os.path.join(ROOT, "tracengine", "compiled.py"))
CORE_HASHES, CORE_MODULES, PURE_ENV, GROUP = CORE["CORE_HASHES"], CORE["CORE_MODULES"], CORE["PURE_ENV"], CORE["GROUP"]
CYTHON_MODULES, source_hash, record_line = CORE["CYTHON_MODULES"], CORE["source_hash"], CORE["record_line"]
PATHS = [os.path.join(*module.split(".")) + ".py" for module in CORE_MODULES]
MYPYC_PATHS = [path for module, path in zip(CORE_MODULES, PATHS) if module not in CYTHON_MODULES]
CYTHON_PATHS = [path for module, path in zip(CORE_MODULES, PATHS) if module in CYTHON_MODULES]
NATIVE = os.path.join("tracengine", "engine", "native.py")


def say(message: str):
    print(f"tracengine: {message}", file=sys.stderr)


def first_line(error: BaseException, limit: int = 160) -> str:
    """What went wrong, in one short line (a compiler's error carries its whole command line)."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= limit else text[:limit] + "..."


def core_extensions() -> list:
    """The core modules' extensions, mypyc's and Cython's, or none (and why, once) where they cannot be built."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        say(f"{PURE_ENV}=1: installing the pure-Python core, not compiling it")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        say("mypyc is not installed: installing the pure-Python core (pip install mypy, then reinstall, to compile it)")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        say("Cython is not installed: installing the pure-Python core (pip install cython, then reinstall, to compile it)")
        return []
    try:
        # only the core is read: what it imports from elsewhere is dynamic to it (Any), so a change there never
        # leaves stale compiled types behind, and the build reads no third-party package (torch)
        # (native.py and the Cython modules too, read and not compiled by mypyc: called as Python modules)
        extensions = mypycify(["--follow-imports=skip", "--ignore-missing-imports", *PATHS, NATIVE],
                              only_compile_paths=MYPYC_PATHS, opt_level="3", group_name=GROUP)
    except BaseException as error:     # mypyc reports a type error by exiting
        say(f"mypyc could not compile the core ({first_line(error)}): installing the pure-Python core")
        return []
    try:
        # the .pxd beside each module gives its C types; the .py's annotations are for mypy
        return extensions + cythonize(CYTHON_PATHS, quiet=True, build_dir=os.path.join("build", "cython"),
                                      compiler_directives={"language_level": 3, "annotation_typing": False,
                                                           "boundscheck": False, "wraparound": False})
    except BaseException as error:
        say(f"Cython could not compile the core ({first_line(error)}): installing the pure-Python core")
        return []


class BuildCore(build_ext):
    """build_ext that falls back to the pure-Python core when the C compiler fails, and records
    the hash and stamp of each compiled source beside the extensions."""

    def run(self):
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as error:
            say(f"the C compiler could not build the core ({first_line(error)}): installing the pure-Python core")
            self.remove_outputs()
            return
        package = ROOT if self.inplace else self.build_lib
        with open(os.path.join(package, "tracengine", CORE_HASHES), "w") as f:
            f.writelines(record_line(module, BUILT_HASHES[module]) + "\n" for module in CORE_MODULES)

    def remove_outputs(self):
        for ext in self.extensions:
            path = self.get_ext_fullpath(ext.name)
            if os.path.exists(path):
                os.remove(path)
        self.extensions = []

    def get_outputs(self):
        outputs = super().get_outputs()
        if outputs and not self.inplace:
            outputs.append(os.path.join(self.build_lib, "tracengine", CORE_HASHES))
        return outputs


# The sources' hashes before mypyc and Cython read them (in core_extensions): a source edited
# during the build is then not the one recorded, and runs as Python.
BUILT_HASHES = {module: source_hash(module) for module in CORE_MODULES}
setup(ext_modules=core_extensions(), cmdclass={"build_ext": BuildCore})
