"""Atomic output files: written to a temp file in the same directory, then moved into place (os.replace),
so an interrupted run never leaves a half-written file under the final name."""
from __future__ import annotations

import os
import tempfile
from typing import Callable, IO


def atomic_write(path, write: Callable[[IO], None], binary: bool = True) -> None:
    """Call ``write(f)`` on a temp file next to ``path`` and move it to ``path`` (usual permissions)."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(suffix=os.path.splitext(path)[1], dir=d)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text), binary=False)
