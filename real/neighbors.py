"""LANTERN's codebook neighbour table (docs/theory.md section 6), built only when a rule reads it, only as wide as it
reads it, in bounded memory, and cached on disk (issue 55).

``NeighborTable(codebook, space, width)`` holds the codebook vectors (V, d) and builds nothing until asked:
``table(K)`` gives the (V, K) int64 numpy table (the K nearest OTHER codes of each code, nearest first, ties by
lower index), from memory, from the disk cache, or computed (``real.models.vq.codebook_neighbors``, chunked above
``CHUNKED_ABOVE`` codes; ``theory.rules.lantern_neighbors`` below) and then saved. ``np.asarray(table)`` gives the
table at its ``width`` (the most any rule of the model reads), so code that wants the whole table still gets it.

The disk cache (``$COOLSD_CACHE`` or ``~/.cache/coolsd``, folder ``neighbors/``) is keyed by the SHA-256 of the
codebook's float64 bytes and the distance space ("raw" as released, or "l2"): a sweep's units and a cluster's ranks
compute a table once. A cached table at least K wide serves K (a prefix of the same nearest-first order). A file
whose key, shape or entries do not match is refused with the reason (never used silently). Writes are atomic.
Tables of at most ``CACHE_MIN_V`` codes are not cached (they take milliseconds).
"""
from __future__ import annotations

import hashlib
import os
import pathlib

import numpy as np

__all__ = ["NeighborTable", "SPACES", "cache_dir", "CACHE_MIN_V", "CHUNKED_ABOVE"]

SPACES = ("raw", "l2")
CACHE_MIN_V = 4096
CHUNKED_ABOVE = 4096


def cache_dir() -> pathlib.Path:
    """The neighbour tables' cache folder: $COOLSD_CACHE/neighbors, else ~/.cache/coolsd/neighbors."""
    root = os.environ.get("COOLSD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "coolsd")
    return pathlib.Path(root) / "neighbors"


class NeighborTable:
    """A lazily built neighbour table of ``codebook`` (V, d) (torch or numpy) in distance ``space``, at most ``width``
    columns wide (default V - 1). Shape (V, width) without building anything; ``table(K)`` builds or loads."""

    def __init__(self, codebook, space: str = "raw", width: int | None = None):
        if space not in SPACES:
            raise ValueError(f"--lantern-neighbors must be one of {SPACES}, got {space!r}")
        import torch

        cb = torch.as_tensor(codebook).detach().to("cpu", torch.float64).contiguous()
        if cb.ndim != 2 or cb.shape[0] < 2:
            raise ValueError(f"the codebook must be (V >= 2, d), got shape {tuple(cb.shape)}")
        if not bool(torch.isfinite(cb).all()):
            raise ValueError("the codebook holds NaN or infinite entries: no neighbour table can be built")
        self._cb = cb
        self.V = int(cb.shape[0])
        self.space = space
        self.width = self.V - 1 if width is None else max(1, min(int(width), self.V - 1))
        self._built: np.ndarray | None = None      # the widest table built or loaded so far
        self._key: str | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.V, self.width)

    @property
    def key(self) -> str:
        """SHA-256 of the codebook's float64 bytes and the space: the cache key."""
        if self._key is None:
            h = hashlib.sha256(self._cb.numpy().tobytes())
            h.update(f"|{self.V}x{self._cb.shape[1]}|{self.space}".encode())
            self._key = h.hexdigest()
        return self._key

    def table(self, K: int | None = None) -> np.ndarray:
        """(V, K) int64, C-contiguous (K defaults to ``width``; at most V - 1)."""
        K = self.width if K is None else int(K)
        if not 1 <= K <= self.V - 1:
            raise ValueError(f"a neighbour table of {self.V} codes has 1 to {self.V - 1} columns; {K} were asked for")
        if self._built is None or self._built.shape[1] < K:
            self._built = self._load(K)
            if self._built is None:
                self._built = self._compute(K)
                self._save(self._built)
        t = self._built
        return t if t.shape[1] == K else np.ascontiguousarray(t[:, :K])

    def __array__(self, dtype=None, copy=None):
        t = self.table()
        return t if dtype is None else t.astype(dtype)

    def __len__(self) -> int:
        return self.V

    def _compute(self, K: int) -> np.ndarray:
        if self.V > CHUNKED_ABOVE:
            from .models.vq import codebook_neighbors

            return codebook_neighbors(self._cb, K, normalize=self.space == "l2").numpy().astype(np.int64, copy=False)
        from theory.rules import lantern_neighbors

        return lantern_neighbors(self._cb.numpy(), K, normalize=self.space == "l2")

    def _path(self) -> pathlib.Path:
        return cache_dir() / f"{self.key[:24]}-{self.space}.npz"

    def _load(self, K: int) -> np.ndarray | None:
        """The cached table if one at least K wide is there; ValueError naming the file when it does not match."""
        if self.V <= CACHE_MIN_V:
            return None
        path = self._path()
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                key, space, t = str(z["key"]), str(z["space"]), z["table"]
        except Exception as e:   # a truncated or foreign file
            raise ValueError(f"neighbour cache {path}: unreadable ({type(e).__name__}: {e}); delete it to rebuild") from None
        if key != self.key or space != self.space:
            raise ValueError(f"neighbour cache {path}: made for another codebook or space ({space}); delete it to rebuild")
        if t.dtype != np.int64 or t.ndim != 2 or t.shape[0] != self.V or not 1 <= t.shape[1] <= self.V - 1:
            raise ValueError(f"neighbour cache {path}: a {t.dtype} table of shape {t.shape}, not (V = {self.V}, K) "
                             "int64; delete it to rebuild")
        if int(t.min()) < 0 or int(t.max()) >= self.V or bool((t[:, 0] == np.arange(self.V)).any()):
            raise ValueError(f"neighbour cache {path}: entries out of range or a code listed as its own neighbour; "
                             "delete it to rebuild")
        return t if t.shape[1] >= K else None

    def _save(self, t: np.ndarray) -> None:
        """Atomic write of the table (only ever widening what the cache holds); a read-only cache is skipped."""
        if self.V <= CACHE_MIN_V:
            return
        path = self._path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as fh:
                np.savez(fh, table=t, key=np.asarray(self.key), space=np.asarray(self.space))
            os.replace(tmp, path)
        except OSError:
            pass
