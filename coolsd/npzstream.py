"""An ``.npz`` written batch by batch in bounded memory (``coolsd generate --record``: docs/records.md).

``NpzStream(path)`` is a context manager; ``append(arrays)`` adds one batch: every array of ndim >= 1 is appended
along its first axis (its dtype and trailing shape fixed by the first batch that holds it), every 0-d array (a JSON
stamp) is kept once and must be the same in every batch. The batches' bytes go to one spool file per array in a
temporary directory beside ``path``; on a clean exit the ``.npz`` (a zip of ``.npy`` members, as ``np.savez`` and
``np.savez_compressed`` write) is assembled from the spools in chunks of ``CHUNK`` bytes and moved onto ``path``
atomically (``coolsd.io.atomic_file``). Peak memory: one batch plus one chunk, whatever the number of batches.
``np.load`` reads the result as it reads ``np.savez``'s.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import zipfile

import numpy as np

from coolsd.io import atomic_file

__all__ = ["NpzStream", "CHUNK", "savez"]

CHUNK = 1 << 24          # bytes copied from a spool into the zip at a time
COMPRESSLEVEL = 1        # deflate's fastest: probability rows hardly compress, their zeros and uniform rows do
STORED_FLOATS = 1 << 20  # float members of at least this many bytes are stored, not deflated (recorded float32 rows:
                         # 7% smaller deflated, at about 20 MB/s of one core)


def _method(dtype, nbytes: int, compress: bool) -> int:
    """The zip method of one member: deflated when ``compress``, except large float arrays (``STORED_FLOATS``)."""
    big_floats = np.issubdtype(np.dtype(dtype), np.floating) and nbytes >= STORED_FLOATS
    return zipfile.ZIP_DEFLATED if compress and not big_floats else zipfile.ZIP_STORED


class NpzStream:
    """Write an ``.npz`` at ``path`` batch by batch (module docstring); ``compress``: deflate the members (as
    ``np.savez_compressed``, at level ``COMPRESSLEVEL``)."""

    def __init__(self, path, compress: bool = True):
        self.path, self.compress = os.fspath(path), bool(compress)
        self._dir = None
        self._meta: dict[str, list] = {}        # name -> [dtype, trailing shape, rows]
        self._scalars: dict[str, np.ndarray] = {}

    def __enter__(self) -> "NpzStream":
        parent = os.path.dirname(os.path.abspath(self.path))
        self._dir = tempfile.mkdtemp(prefix=".coolsd-spool.", dir=parent)
        return self

    def append(self, arrays: dict) -> None:
        """Add one batch's arrays {name: array} (module docstring); ValueError when a name's dtype or trailing
        shape differs from its earlier batches', or a 0-d array from its earlier value."""
        if self._dir is None:
            raise ValueError("NpzStream.append outside its with-block")
        for name, a in arrays.items():
            a = np.asarray(a)
            if a.ndim == 0:
                old = self._scalars.setdefault(name, a)
                if old.dtype != a.dtype or old.item() != a.item():
                    raise ValueError(f"record array {name!r}: batches disagree ({old.item()!r} vs {a.item()!r})")
                continue
            meta = self._meta.setdefault(name, [a.dtype, a.shape[1:], 0])
            if a.size == 0 and a.ndim == 1 and meta[2] == 0 and meta[1] == ():
                meta[0] = a.dtype               # an empty placeholder (e.g. release-mode q) stays empty
                continue
            if meta[2] == 0 and meta[1] != a.shape[1:]:
                meta[0], meta[1] = a.dtype, a.shape[1:]
            if a.dtype != meta[0] or a.shape[1:] != meta[1]:
                raise ValueError(f"record array {name!r}: a batch holds {a.dtype} {a.shape[1:]} rows, earlier "
                                 f"batches {meta[0]} {meta[1]}")
            with open(os.path.join(self._dir, name), "ab") as f:
                f.write(np.ascontiguousarray(a).tobytes())
            meta[2] += a.shape[0]

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._write()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _write(self) -> None:
        comp = zipfile.ZIP_DEFLATED if self.compress else zipfile.ZIP_STORED
        with atomic_file(self.path) as fh, zipfile.ZipFile(fh, "w", compression=comp, allowZip64=True,
                                                           compresslevel=COMPRESSLEVEL) as zf:
            for name, (dtype, tail, rows) in self._meta.items():
                zf.compression = _method(dtype, rows * int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize,
                                         self.compress)
                with zf.open(name + ".npy", "w", force_zip64=True) as out:
                    _header(out, dtype, (rows, *tail))
                    spool = os.path.join(self._dir, name)
                    if os.path.exists(spool):
                        with open(spool, "rb") as f:
                            shutil.copyfileobj(f, out, CHUNK)
            zf.compression = comp
            for name, a in self._scalars.items():
                with zf.open(name + ".npy", "w") as out:
                    np.lib.format.write_array(out, a, allow_pickle=False)


def savez(fh, arrays: dict, compress: bool = True) -> None:
    """Write arrays {name: array} as an ``.npz`` to the binary file object ``fh``, as ``np.savez_compressed`` does
    but at deflate level ``COMPRESSLEVEL`` and with large float arrays stored (``_method``; ``compress=False``: every
    member stored, as ``np.savez``): ``np.load`` reads either."""
    with zipfile.ZipFile(fh, "w", allowZip64=True, compresslevel=COMPRESSLEVEL) as zf:
        for name, a in arrays.items():
            a = np.asanyarray(a)
            zf.compression = _method(a.dtype, a.nbytes, compress)
            with zf.open(name + ".npy", "w", force_zip64=True) as out:
                np.lib.format.write_array(out, a, allow_pickle=False)


def _header(fh, dtype: np.dtype, shape: tuple) -> None:
    """The ``.npy`` header of a C-ordered array of ``dtype`` and ``shape`` (format 1.0, or 2.0 when it must)."""
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    try:
        np.lib.format.write_array_header_1_0(fh, d)
    except ValueError:
        np.lib.format.write_array_header_2_0(fh, d)
