"""The command line: `main` is the `tracengine` entry point."""
from tracengine.cli.main import main

__all__ = ["main"]
