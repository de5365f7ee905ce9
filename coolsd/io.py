"""Output paths checked before any work, and written atomically.

* :func:`check_output_file` / :func:`check_output_dir` validate a ``--save`` / ``--record`` / ``--out``
  path up front (parent directory exists and is writable, the path is not a directory / not a file /
  not a device) and return the path that will actually be written, so a refused run costs nothing.
* :func:`atomic_file` writes through a temporary file in the same directory and ``os.replace``s it
  into place; :func:`atomic_dir` builds a whole report directory in a temporary sibling and swaps it
  in. An interrupted or failed run (including Ctrl-C) leaves the previous complete output or nothing,
  never a partial file or a mixed directory.
"""
from __future__ import annotations

import contextlib
import math
import errno
import os
import pathlib
import shutil
import tempfile
from typing import Iterator

import numpy as np

from theory.core.files import INPUT_LIMITS, input_file as check_input_file   # the one input check (re-exported)

__all__ = ["json_safe", "check_input_file", "INPUT_LIMITS", "check_outputs", "check_output_file", "check_output_dir", "atomic_file", "atomic_path", "atomic_dir", "TMP_PREFIX"]

TMP_PREFIX = ".coolsd-tmp-"

def _check_parent_writable(option: str, parent: pathlib.Path) -> None:
    if not parent.exists():
        raise ValueError(f"{option}: directory {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{option}: {str(parent)!r} is not a directory")
    try:  # os.access is not reliable (root, ACLs, read-only mounts): try to create a file
        fd, probe = tempfile.mkstemp(prefix=TMP_PREFIX, dir=parent)
    except OSError as e:
        raise ValueError(f"{option}: cannot write in {str(parent)!r} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(option: str, path: str | os.PathLike, suffix: str | None = None) -> pathlib.Path:
    """The file that ``option`` will write: ``path`` with ``suffix`` appended when it lacks it (as
    ``numpy.savez`` does), checked now: its directory exists and is writable, and it is not an
    existing directory or a device / pipe (an existing regular file is replaced atomically)."""
    p = pathlib.Path(os.fspath(path)).expanduser()
    if str(path) == "" or p.name in ("", ".", ".."):
        raise ValueError(f"{option}: {str(path)!r} is not a file name")
    if suffix and p.suffix != suffix:
        p = p.with_name(p.name + suffix)
    for q in {pathlib.Path(os.fspath(path)).expanduser(), p}:
        if q.is_symlink():
            try:
                q.stat()
            except OSError as e:                 # a loop (ELOOP) or a dangling link: never followed to write
                why = "loops (it points back to itself)" if e.errno == errno.ELOOP else "points to nothing"
                raise ValueError(f"{option}: {str(q)!r} is a symbolic link that {why}; remove it or give another "
                                 "name") from None
        if q.is_dir():
            raise ValueError(f"{option}: {str(q)!r} is an existing directory; give a file name")
        if q.exists() and not q.is_file():
            raise ValueError(f"{option}: {str(q)!r} exists and is not a regular file")
        if q.is_file() and not _writable(q):
            raise ValueError(f"{option}: {str(q)!r} exists and is read-only; it is not replaced (make it writable or "
                             "give another name)")
    _check_parent_writable(option, p.parent if str(p.parent) else pathlib.Path("."))
    return p


def _writable(path: pathlib.Path) -> bool:
    """Whether the caller may replace the existing file ``path``, as ``cp`` without -f decides, except that root is
    held to the file's write bits too (os.access says True for root whatever the mode): a read-only result is kept."""
    if getattr(os, "geteuid", lambda: -1)() == 0:
        return bool(path.stat().st_mode & 0o222)
    return os.access(path, os.W_OK)


def check_outputs(outputs: dict, inputs: dict) -> None:
    """No output names an input or another output: ``outputs`` / ``inputs`` map a flag to a path (None: not given).
    Paths are compared after resolving links, and existing files by device and inode, so a symbolic or hard link to
    an input is caught too. One-line ValueError naming both flags."""
    def ident(path):
        q = pathlib.Path(os.fspath(path)).expanduser()
        try:
            st = q.stat()
            return ("inode", st.st_dev, st.st_ino)
        except OSError:                      # not there yet, or a link loop: its name, links resolved as far as
            return ("path", os.path.realpath(q))    # they go (realpath never raises on a loop)
    seen = {ident(p): f for f, p in inputs.items() if p is not None}
    for flag, path in outputs.items():
        if path is None:
            continue
        key = ident(path)
        if key in seen:
            what = "the input" if seen[key] in inputs else "also"
            raise ValueError(f"{flag} {str(path)!r} is {what} {seen[key]}: an output may not overwrite an input or "
                             "another output; give another name")
        seen[key] = flag


def check_output_dir(option: str, path: str | os.PathLike, produces: tuple[str, ...] = ()) -> pathlib.Path:
    """A report directory ``option`` will (re)create. Refused: an existing file, or an existing directory
    holding files other than ``produces`` (a previous report is replaced as a whole; other files are
    never deleted). Its parent must exist and be writable."""
    p = pathlib.Path(os.fspath(path)).expanduser()
    if str(path) == "":
        raise ValueError(f"{option}: empty path")
    if p.exists() and not p.is_dir():
        raise ValueError(f"{option}: {str(p)!r} is an existing file, not a directory; give a directory name")
    if p.is_dir():
        other = sorted(x.name for x in p.iterdir() if x.name not in produces)
        if other:
            raise ValueError(f"{option}: {str(p)!r} already holds other files ({', '.join(other[:5])}"
                             f"{' ...' if len(other) > 5 else ''}); give a new or empty directory")
    _check_parent_writable(option, p.resolve().parent)
    return p


def check_store_dir(option: str, path: str | os.PathLike) -> pathlib.Path:
    """A store directory ``option`` creates or resumes (``coolsd sweep --out``): an existing directory is taken as it
    is (the store checks its own manifest); anything else that exists (a file, a FIFO, a device) is refused unopened;
    the parent of a new one must exist and be writable."""
    if str(path).strip() == "":
        raise ValueError(f"{option}: empty path")
    p = pathlib.Path(os.fspath(path)).expanduser()
    if os.path.lexists(p) and not p.is_dir():
        what = "a FIFO" if p.is_fifo() else "a device" if (p.is_char_device() or p.is_block_device()) else "a file"
        raise ValueError(f"{option}: {str(p)!r} is {what}, not a directory; give a new or a sweep's directory")
    if not p.is_dir():
        _check_parent_writable(option, p.resolve().parent)
    return p


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator:
    """Open a temporary file next to ``path`` for writing; on success flush, fsync and
    ``os.replace`` it onto ``path``; on any exception (KeyboardInterrupt included) remove it."""
    with atomic_path(path) as tmp, open(tmp, mode) as fh:
        yield fh
        fh.flush()
        os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Yield a temporary path next to ``path`` with the same suffix, for writers that take a file name
    (``savefig``); on success it is ``os.replace``d onto ``path``, on any exception removed."""
    path = pathlib.Path(os.fspath(path))
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + path.stem + ".", suffix=path.suffix,
                               dir=path.parent if str(path.parent) else ".")
    os.close(fd)
    try:
        yield pathlib.Path(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Yield a fresh temporary directory next to ``path``; on success it replaces ``path`` (a previous
    directory is moved aside, the new one renamed in, the old one deleted), on any exception it is
    removed and ``path`` is left as it was."""
    path = pathlib.Path(os.fspath(path))
    parent = path.resolve().parent
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=TMP_PREFIX + path.name + ".", dir=parent))
    holder = moved = None
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if path.exists():
            holder = pathlib.Path(tempfile.mkdtemp(prefix=TMP_PREFIX + path.name + ".old.", dir=parent))
            moved = holder / path.name
            os.replace(path, moved)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if moved is not None and moved.exists() and not path.exists():
            os.replace(moved, path)          # put the previous report back
        if holder is not None:
            shutil.rmtree(holder, ignore_errors=True)
        raise
    if holder is not None:
        shutil.rmtree(holder, ignore_errors=True)


def json_safe(x):
    """NaN / inf -> None, numpy scalars -> Python, recursively (strict JSON)."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
