"""Import a repository file that is not a package module (scripts/, benchmarks/) by its path, for tests."""
from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load(relpath: str, name: str | None = None):
    """The module at ROOT / relpath (e.g. "scripts/docs_reference.py"), executed once per call."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
