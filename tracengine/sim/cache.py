"""The result cache: each variant's row stored under a key of what decides it (the sweep's
spec, with its source's digest, the variant, tracengine's version and a digest of
tracengine's own source code), so a sweep run again or extended computes only what is new.

One JSON file per variant, in a directory (default: tracengine/sweeps under the user's
cache directory, $XDG_CACHE_HOME or ~/.cache; TRACENGINE_CACHE_DIR names another). A row
that timed out is not stored: it is no figure of the variant. A file that cannot be read as
a row is a miss, and the run writes it again."""
import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from tracengine.version import __version__
from tracengine.errors import TracengineError
from tracengine.sim.spec import SweepSpec, Variant

FORMAT = 1      # of an entry's file; a new one keys every entry anew


def default_cache_dir() -> str:
    named = os.environ.get("TRACENGINE_CACHE_DIR")
    if named:
        return named
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tracengine", "sweeps")


@lru_cache(maxsize=1)
def code_digest() -> str:
    """tracengine's own source: a change to the code that computes a row is a new key, even
    where the version number is the same (a checkout between releases)."""
    h = hashlib.sha256(__version__.encode())
    root = Path(__file__).parents[1]      # the package's folder
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def variant_key(spec: SweepSpec, variant: Variant) -> str:
    text = json.dumps({"format": FORMAT, "version": __version__, "code": code_digest(),
                       "spec": spec.key(), "overrides": variant.overrides, "request_rate": variant.request_rate},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


class ResultCache:
    """Rows by variant key, one file each under `directory` (made when first written)."""

    def __init__(self, directory: str | None = None):
        self.directory = directory or default_cache_dir()
        self.num_written = 0      # rows stored by this run (what a stopped sweep kept)
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise TracengineError(f"--cache-dir {self.directory}: not a directory")

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".json")

    def get(self, key: str) -> dict | None:
        try:
            with open(self._path(key), encoding="utf-8") as f:
                entry = json.load(f)
        except (OSError, ValueError):
            return None
        row = entry.get("row") if isinstance(entry, dict) else None
        return row if isinstance(row, dict) else None

    def put(self, key: str, spec: SweepSpec, variant: Variant, row: dict):
        path = self._path(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".part")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"spec": spec.key(), "overrides": variant.overrides, "request_rate": variant.request_rate,
                           "row": row}, f)
            os.replace(partial, path)
            self.num_written += 1
        except OSError as exc:
            raise TracengineError(f"--cache-dir {self.directory}: cannot write ({exc.strerror})") from None
