"""Which core runs in this process: the compiled one (True) or the Python (False), as
tracengine/compiled.py decided when `tracengine` was imported, before any core module.
engine/native.py reads it to pick the arrays the core runs on; it imports nothing, so the core
reaches no more than this by reading it."""
COMPILED = False
