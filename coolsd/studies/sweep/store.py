"""The results store of a sweep: one directory, a manifest, one file per work unit.

Layout::

    DIR/manifest.json                 identity (model, draft, grid, seeds, unit size, batch size, ...),
                                      code version, creation time
    DIR/units/<setting slug>/u000003.npz   one unit: tokens, per-image and per-round records, timings
    DIR/report.json, report.md, *.png      written by the merge

Completeness rule (lock-free): a unit is done iff its file exists. Files are written to a temporary
name in the same directory and renamed with ``os.replace`` (atomic on POSIX), so a killed run leaves
either the whole unit or no unit (at most the unit in flight is lost), and a rerun skips done units:
nothing is computed twice, nothing duplicated. A directory whose manifest has another identity (grid,
model, seeds, ...) is refused, never mixed.
"""
from __future__ import annotations

import datetime
import io
import json
import os
import pathlib
import subprocess

import numpy as np

from coolsd.io import atomic_file, json_safe
from coolsd.npzstream import savez

__all__ = ["Store", "code_version", "atomic_write_bytes", "atomic_write_text", "IDENTITY_HELP", "json_safe"]

MANIFEST = "manifest.json"
FORMAT = 1
IDENTITY_HELP = ("start fresh with another --out directory, or delete this one (rm -r {dir}) to discard its "
                 "results")


def code_version() -> str:
    """``git describe --always --dirty`` of the source tree, or "unknown" outside a git checkout."""
    root = pathlib.Path(__file__).resolve().parents[3]
    try:
        r = subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], cwd=root, capture_output=True,
                           text=True, timeout=20)
        return r.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory + os.replace
    (``coolsd.io.atomic_file``)."""
    with atomic_file(path) as fh:
        fh.write(data)


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(pathlib.Path(path), text.encode())


class Store:
    """A sweep directory. ``identity`` is the JSON-able dict that must match for results to be reused."""

    def __init__(self, root, identity: dict):
        self.root = pathlib.Path(root)
        self.identity = json.loads(json.dumps(identity))      # normalised (tuples -> lists)

    # ------------------------------------------------------------------ manifest
    def open(self, create: bool) -> None:
        """Check (and with ``create``, make) the directory and its manifest. Refuses a directory made by
        another sweep, a non-directory, a directory with other files and no manifest, or an unwritable one."""
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"--out {self.root} exists and is not a directory")
        mf = self.root / MANIFEST
        if mf.exists():
            try:
                old = json.loads(mf.read_text())
                if not isinstance(old, dict):
                    raise ValueError(f"a JSON {type(old).__name__}, not an object")
            except (OSError, UnicodeDecodeError, ValueError) as e:
                raise ValueError(f"manifest {str(mf)!r} is damaged ({str(e).splitlines()[0][:100]}); "
                                 + IDENTITY_HELP.format(dir=self.root)) from None
            if old.get("format") != FORMAT or old.get("identity") != self.identity:
                diff = sorted(k for k in set(self.identity) | set(old.get("identity", {}))
                              if old.get("identity", {}).get(k) != self.identity.get(k))
                raise ValueError(f"{self.root} holds a sweep with another configuration (differs in: "
                                 f"{', '.join(diff) or 'format'}); its results cannot be mixed with this one: "
                                 + IDENTITY_HELP.format(dir=self.root))
        elif create:
            if self.root.exists() and any(self.root.iterdir()):
                raise ValueError(f"--out {self.root} is a non-empty directory without a sweep manifest; "
                                 "choose an empty or new directory")
            self.root.mkdir(parents=True, exist_ok=True)
            manifest = {"format": FORMAT, "identity": self.identity, "code_version": code_version(),
                        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
            try:
                atomic_write_text(mf, json.dumps(manifest, indent=1) + "\n")
            except OSError as e:
                raise ValueError(f"cannot write to --out {self.root}: {e.strerror}") from None
        else:
            raise ValueError(f"{self.root} has no {MANIFEST} (rank 0 creates it)")
        if not os.access(self.root, os.W_OK):
            raise ValueError(f"--out {self.root} is not writable")

    def manifest(self) -> dict:
        return json.loads((self.root / MANIFEST).read_text())

    # ------------------------------------------------------------------ units
    def unit_path(self, slug: str, index: int) -> pathlib.Path:
        return self.root / "units" / slug / f"u{index:06d}.npz"

    def done(self, slug: str, index: int) -> bool:
        return self.unit_path(slug, index).exists()

    def write_unit(self, slug: str, index: int, arrays: dict, meta: dict) -> pathlib.Path:
        """Save one unit atomically: ``arrays`` (name -> ndarray) and ``meta`` (JSON) in one .npz."""
        path = self.unit_path(slug, index)
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        savez(buf, {"meta": np.array(json.dumps(meta)), **arrays})       # deflate's fastest level
        atomic_write_bytes(path, buf.getvalue())
        return path

    def read_unit(self, slug: str, index: int) -> tuple[dict, dict]:
        """(arrays, meta) of a done unit; a damaged file (truncated, bit-flipped, empty, not an .npz, bad
        meta) is one ValueError line saying which file to delete (``theory.core.checks.npz_arrays``)."""
        from theory.core import checks

        path = self.unit_path(slug, index)
        hint = "delete it and rerun the same command to recompute it"
        arrays = checks.npz_arrays("unit file", path, ("meta",), hint)
        try:
            meta = json.loads(str(arrays.pop("meta")))
        except ValueError as e:
            raise ValueError(f"unit file: {str(path)!r} has an unreadable meta record ({e}); {hint}") from None
        return arrays, meta

    def check_units(self, units, expect=None) -> int:
        """Open every stored unit of ``units`` (objects with ``slug`` and ``index``) now, before any work, so
        that a damaged one is reported up front, not after the other units ran; with ``expect(unit)`` -> the meta
        the unit must carry (``run.unit_expectation``: setting, block, seed, base seed, image range, identity
        digest), a unit made by another sweep (another seed, setting, block or configuration, copied or moved in)
        is refused naming the file and the field. A unit without the newer fields (stored before they were
        written) is held to its seed, setting, block and image indices. Returns how many exist; the code versions
        of the units are compared with this code's, and a difference is printed (the report lists them too)."""
        n, versions = 0, set()
        for u in units:
            if self.done(u.slug, u.index):
                arrays, meta = self.read_unit(u.slug, u.index)
                if expect is not None:
                    _check_unit(self.unit_path(u.slug, u.index), arrays, meta, expect(u))
                versions.add(str(meta.get("code_version")))
                n += 1
        now = code_version()
        other = sorted(v for v in versions if v != now)
        if other:
            import sys

            print(f"coolsd: warning: {self.root}: stored units were made by code version(s) {', '.join(other[:3])}, "
                  f"this is {now} (listed in the report)", file=sys.stderr)
        return n

    def write_text(self, name: str, text: str) -> pathlib.Path:
        path = self.root / name
        atomic_write_text(path, text)
        return path




def _check_unit(path, arrays: dict, meta: dict, want: dict) -> None:
    """One stored unit against what this sweep expects of it (``Store.check_units``): one ValueError line."""
    hint = (f"it was made by another sweep (copied or moved in?): delete it ({str(path)!r}) and rerun to recompute "
            "it, or use that sweep's own directory")
    for k in ("base_seed", "key", "index", "seed", "images", "identity"):
        if k in meta or k in ("key", "index", "seed"):
            if meta.get(k) != want[k]:
                raise ValueError(f"unit file {str(path)!r}: {k} {meta.get(k)!r} does not match this sweep's "
                                 f"{want[k]!r}; {hint}")
    lo, hi = want["images"]
    idx = arrays.get("image_index")
    toks = arrays.get("tokens")
    if idx is None or toks is None or np.asarray(idx).tolist() != list(range(lo, hi)) or len(toks) != hi - lo:
        got = None if idx is None else (np.asarray(idx).tolist()[:3], len(np.asarray(idx)))
        raise ValueError(f"unit file {str(path)!r}: its images {got} are not images {lo}..{hi - 1} of this block; "
                         f"{hint}")
    _check_unit_shapes(path, arrays, hi - lo, want.get("tokens"))


def _check_unit_shapes(path, arrays: dict, n: int, T: int | None) -> None:
    """A unit's arrays agree with each other (issue 50: tokens cut short failed in the merge with numpy's error, naming
    no file): tokens (n, T) (T the model's image tokens when known), every per-image array (n,) and every per-round
    array of one length. One ValueError line naming the file."""
    where = f"unit file {str(path)!r}"
    toks = np.asarray(arrays["tokens"])
    if toks.ndim != 2 or (T is not None and toks.shape[1] != T):
        raise ValueError(f"{where}: tokens have shape {toks.shape}, not ({n}, {T if T is not None else 'T'}) (damaged "
                         "or cut short?): delete it and rerun to recompute it")
    for k, a in arrays.items():
        if k.startswith("image_") and np.asarray(a).shape[:1] != (n,):
            raise ValueError(f"{where}: {k} has shape {np.asarray(a).shape}, not ({n},): delete it and rerun")
    lens = {k: len(np.asarray(a)) for k, a in arrays.items() if k.startswith("round_")}
    if len(set(lens.values())) > 1:
        raise ValueError(f"{where}: its per-round arrays have different lengths ({lens}): delete it and rerun")
