"""Input files checked before they are opened (issue 41): the one helper every command and API entry point that
reads a file calls (``coolsd.io.check_input_file`` re-exports it for the commands). A path must exist, be a regular
file (a FIFO, a device or a directory is refused without being opened: nothing blocks, nothing reads without end),
be at most the size its kind may have, not be empty, and look like its format ("npz": a zip archive, and a NumPy .npy
is named as such; "json": parses to an object or a list). Every failure is one ValueError line naming the option, the
file and the format expected.
"""
from __future__ import annotations

import os

__all__ = ["input_file", "INPUT_LIMITS", "NPZ_UNPACKED_LIMIT"]

# the largest file each kind of input may be (bytes): a schedule or a report is small JSON; arrays and checkpoints
# are large but finite; a device such as /dev/zero is refused before these apply (not a regular file)
INPUT_LIMITS = {"json": 64 * 2**20, "text": 64 * 2**20, "toml": 16 * 2**20, "npz": 64 * 2**30,
                "checkpoint": 1 << 40, "any": 1 << 40}
# the most an .npz archive may inflate to (bytes, the sum of its members' uncompressed sizes, read from the zip's
# directory without inflating anything): every reader loads an archive whole, so this is a memory bound (issue 50: a
# 4.8 MB archive that inflates to 4.2 GB passed the file-size limit)
NPZ_UNPACKED_LIMIT = 2 * 2**30
_MAGIC = {"npz": b"PK\x03\x04"}
_FORMAT_NAMES = {"json": "a JSON file", "text": "a text file", "toml": "a TOML file", "npz": "an .npz archive",
                 "checkpoint": "a checkpoint", "any": "a file"}


def input_file(option: str, path, kind: str = "any", *, max_bytes: int | None = None, hint: str = ""):
    """The file ``option`` reads, checked before it is opened: it exists, is a regular file (a FIFO, a device or a
    directory is refused without being opened, so nothing blocks or reads without end), is at most ``max_bytes``
    (default ``INPUT_LIMITS[kind]``) and not empty, and looks like ``kind`` ("npz": a zip archive, a NumPy .npy named
    as such; "json": parses to an object or a list). Returns the path as a str; the parsed object for "json".
    One-line ValueError naming the option, the file and the format expected."""
    import stat

    if path is None or str(path) == "":
        raise ValueError(f"{option}: empty path")
    p = os.path.expanduser(os.fspath(path))
    want = _FORMAT_NAMES.get(kind, kind)
    tail = f"; {hint}" if hint else ""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ValueError(f"{option}: {p!r} does not exist (expected {want}){tail}") from None
    except OSError as e:
        raise ValueError(f"{option}: {p!r} cannot be read ({e.strerror or e}){tail}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{option}: {p!r} is a directory, not {want}{tail}")
    if not stat.S_ISREG(st.st_mode):
        what = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a device" if
                (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file")
        raise ValueError(f"{option}: {p!r} is {what}, not {want} (only regular files are read){tail}")
    limit = INPUT_LIMITS.get(kind, INPUT_LIMITS["any"]) if max_bytes is None else max_bytes
    if st.st_size > limit:
        raise ValueError(f"{option}: {p!r} is {st.st_size} bytes, above the {limit} bytes {want} may have{tail}")
    if st.st_size == 0:
        raise ValueError(f"{option}: {p!r} is empty (0 bytes), not {want}{tail}")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{option}: {p!r} is not readable{tail}")
    if kind == "npz":
        with open(p, "rb") as fh:
            head = fh.read(6)
        if not head.startswith(_MAGIC["npz"]):
            what = "a NumPy .npy array" if head.startswith(b"\x93NUMPY") else f"a file starting with {head[:4]!r}"
            raise ValueError(f"{option}: {p!r} is {what}, not an .npz archive (np.savez){tail}")
        _npz_unpacked(option, p, tail)
    if kind in ("toml", "text"):
        with open(p, "rb") as fh:
            head = fh.read(1 << 16)
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start < len(head) - 4:                # not a character cut at the block's end: binary data
                what = "a zip / .npz archive" if head.startswith(_MAGIC["npz"]) else "binary data"
                raise ValueError(f"{option}: {p!r} is {what}, not {want} (UTF-8 text){tail}") from None
    if kind == "json":
        import json

        with open(p, "rb") as fh:
            head = fh.read(6)
        if head.startswith(b"\x93NUMPY") or head.startswith(_MAGIC["npz"]):
            what = "a NumPy .npy array" if head.startswith(b"\x93NUMPY") else "a zip / .npz archive"
            raise ValueError(f"{option}: {p!r} is {what}, not a JSON file{tail}")

        try:
            with open(p, encoding="utf-8") as fh:
                obj = json.load(fh)
        except (UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"{option}: {p!r} is not JSON ({str(e).splitlines()[0][:80]}){tail}") from None
        if not isinstance(obj, (dict, list)):
            raise ValueError(f"{option}: {p!r} holds a JSON {type(obj).__name__}, not an object or a list{tail}")
        return obj
    return p


def _npz_unpacked(option: str, p: str, tail: str) -> None:
    """An .npz's zip directory read (nothing inflated): a truncated archive (no directory) and one whose members
    inflate past ``NPZ_UNPACKED_LIMIT`` (a decompression bomb) are refused, one line naming the option and file."""
    import zipfile

    try:
        with zipfile.ZipFile(p) as z:
            total = sum(i.file_size for i in z.infolist())
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise ValueError(f"{option}: {p!r} is damaged or truncated (not a readable .npz archive: "
                         f"{str(e).splitlines()[0][:80] if str(e) else type(e).__name__}){tail}") from None
    if total > NPZ_UNPACKED_LIMIT:
        raise ValueError(f"{option}: {p!r} inflates to {total} bytes, above the {NPZ_UNPACKED_LIMIT} bytes an .npz "
                         f"may unpack to (it is read whole){tail}")
