"""Stamped inputs of the exact-law tuner (docs/theory.md section 8c): the teacher-forced rows of plain-AR images and
the recorded vanilla rounds, each with the stamp of the model and processing that produced them.

* ``ARRows``: rows of n images drawn from the target P (plain AR, or a lossless vanilla SD run: its images are
  distributed as P too): p (n, T, V), q (n, T, V) (an offset-independent draft) or (n, T, L, V) (an EAGLE
  drafter, ``real.decode.score``), tokens (n, T), and a ``stamp``. ``load_ar_rows`` reads the npz format
  (``FORMAT``): arrays ``p``, ``q``, ``tokens`` and ``stamp`` (a JSON string), written by
  ``coolsd.rowfiles.save_ar_rows``.
* ``StampedRecord``: chain rounds recorded by ``coolsd generate --record`` (``theory.likelihood.recorded.Rows``) with
  the tokens generated before each round (``start``) and the run's stamp, as the speed model needs them
  (``theory.likelihood.speed``). ``load_record`` reads it (a record without a stamp: ValueError, or the plain Rows
  with ``legacy=True``).

The stamp is a JSON object; the fields in ``STAMP_FIELDS`` (model, draft kind, processing = {temperature, top_k,
top_p, cfg_scale}, L, convention, T, V) must agree between the AR rows, the record and the rule being tuned
(``check_stamps``). Other fields are provenance (images, seed, source, method, per_row, format).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from ..core import checks
from .chain import CONVENTIONS, round_masks
from .recorded import Rows, load_rows

__all__ = ["FORMAT", "RECORD_FORMAT", "STAMP_FIELDS", "ARRows", "StampedRecord", "load_ar_rows", "load_record",
           "check_stamps", "ar_rows_arrays"]

FORMAT = "coolsd-ar-rows/1"
RECORD_FORMAT = "coolsd-record/1"
STAMP_FIELDS = ("model", "draft", "processing", "L", "convention", "T", "V")


def _check_stamp(name: str, stamp) -> dict:
    if not isinstance(stamp, dict):
        raise ValueError(f"{name}: the stamp must be a JSON object, got {type(stamp).__name__}")
    missing = [k for k in STAMP_FIELDS if k not in stamp]
    if missing:
        raise ValueError(f"{name}: the stamp lacks {missing} (fields {list(STAMP_FIELDS)} are required)")
    if stamp["convention"] not in CONVENTIONS:
        raise ValueError(f"{name}: stamp convention must be one of {CONVENTIONS}, got {stamp['convention']!r}")
    for k in ("L", "T", "V"):
        if isinstance(stamp[k], bool) or not isinstance(stamp[k], int) or stamp[k] < 1:
            raise ValueError(f"{name}: stamp {k} must be an int >= 1, got {stamp[k]!r}")
    return stamp


def check_stamps(a: dict, b: dict, what: str, L: int | None = None) -> None:
    """ValueError (one line naming the first field that differs and both values) unless stamps ``a`` and ``b`` agree
    on ``STAMP_FIELDS``, and, when given, the rule's draft length ``L`` is the stamps' L."""
    checks.instance(f"{what}: the first stamp", a, dict, "a stamp (dict)")
    checks.instance(f"{what}: the second stamp", b, dict, "a stamp (dict)")
    for k in STAMP_FIELDS:
        if a.get(k) != b.get(k):
            raise ValueError(f"{what}: the stamps differ in {k!r} ({a.get(k)!r} vs {b.get(k)!r}); rows and rounds must "
                             "come from the same model, draft, processing, L and image size")
    if "conditions" in a and "conditions" in b and a["conditions"] != b["conditions"]:   # stamped since issue 50
        raise ValueError(f"{what}: the stamps differ in 'conditions' ({a['conditions']!r} vs {b['conditions']!r}); the "
                         "rows and rounds must be made under the same conditions (class ids, prompts)")
    if L is not None and a.get("L") != L:
        raise ValueError(f"{what}: the rule has L = {L} draft positions but the rows were made with L = {a.get('L')}")


@dataclass
class ARRows:
    """Rows of n AR images (module docstring). Arrays keep their dtype (model rows: float32); ``image`` (n,) ids."""
    p: np.ndarray
    q: np.ndarray
    tokens: np.ndarray
    stamp: dict
    image: np.ndarray | None = None
    name: str = "AR rows"
    checked: bool = field(default=False, repr=False)

    def __post_init__(self):
        nm = self.name
        self.stamp = _check_stamp(nm, self.stamp)
        for k in ("p", "q", "tokens"):          # lists (and other array-likes) converted, as documented
            v = getattr(self, k)
            if v is None or isinstance(v, (str, bytes, dict)):
                raise TypeError(f"{nm}: {k} must be an array, got {type(v).__name__}")
            if not isinstance(v, np.ndarray):
                a = np.asarray(v)
                setattr(self, k, a.astype(np.float64) if k != "tokens" and a.dtype.kind in "iub" else a)
        self.tokens = np.asarray(self.tokens)
        if self.p.ndim != 3 or self.tokens.shape != self.p.shape[:2]:
            raise ValueError(f"{nm}: expected p (n, T, V) and tokens (n, T); got p {self.p.shape}, tokens "
                             f"{self.tokens.shape}")
        n, T, V = self.p.shape
        L = self.stamp["L"]
        if (T, V) != (self.stamp["T"], self.stamp["V"]):
            raise ValueError(f"{nm}: rows are (T, V) = {(T, V)} but the stamp says {(self.stamp['T'], self.stamp['V'])}")
        if self.q.shape not in ((n, T, V), (n, T, L, V)):
            raise ValueError(f"{nm}: q must be (n, T, V) = {(n, T, V)} or (n, T, L, V) = {(n, T, L, V)}, got {self.q.shape}")
        if n < 2:
            raise ValueError(f"{nm}: need at least 2 images, got {n}")
        for k, a in (("p", self.p), ("q", self.q)):
            if a.dtype not in (np.float32, np.float64):
                raise ValueError(f"{nm}: {k} must be float32 or float64, got {a.dtype}")
        if not np.issubdtype(self.tokens.dtype, np.integer):
            raise ValueError(f"{nm}: tokens must be integers, got {self.tokens.dtype}")
        self.tokens = self.tokens.astype(np.int64)
        self.image = np.arange(n) if self.image is None else np.asarray(self.image, np.int64)
        if self.image.shape != (n,):
            raise ValueError(f"{nm}: image ids must be (n,) = ({n},), got {self.image.shape}")
        ids, counts = np.unique(self.image, return_counts=True)
        if np.any(counts > 1):        # copies: a "held-out" image would repeat a fitted one (issue 50)
            raise ValueError(f"{nm}: image ids must be distinct (one row set per image); id {int(ids[counts > 1][0])} "
                             f"occurs {int(counts.max())} times ({int((counts > 1).sum())} ids repeated)")
        if not self.checked:
            self.check_rows()

    def check_rows(self, chunk: int = 64) -> None:
        """The rows the law reads are distributions (finite, >= 0, summing to 1 within float32 rounding) and the
        tokens lie in [0, V): one-line ValueError otherwise (``log_likelihood``'s checks, chunk by chunk)."""
        checks.check_tokens_xp(f"{self.name}: tokens", self.tokens, self.V, np)
        draft, _ = round_masks(self.T, self.L, self.convention)
        used = draft[:, :self.L] if self.per_offset else draft[:, :self.L].any(axis=1)
        for a in range(0, self.n, chunk):      # chunks of images: bounded temporaries
            checks.check_rows_xp(f"{self.name}: p", self.p[a:a + chunk], np)
            q = self.q[a:a + chunk]
            tol = checks.rows_tol_xp(q)
            ok = np.all(q >= 0, axis=-1) & (np.abs(np.sum(q, axis=-1, dtype=np.float64) - 1) <= tol)
            if not np.all(ok | ~used):
                raise ValueError(f"{self.name}: q rows that are read must be distributions (finite, >= 0, summing to 1 "
                                 f"within {tol:g}); found one that is not")
        self.checked = True

    n = property(lambda self: self.p.shape[0])
    T = property(lambda self: self.p.shape[1])
    V = property(lambda self: self.p.shape[2])
    L = property(lambda self: int(self.stamp["L"]))
    convention = property(lambda self: self.stamp["convention"])
    per_offset = property(lambda self: self.q.ndim == 4)

    def subset(self, idx) -> "ARRows":
        idx = np.asarray(idx)
        return ARRows(self.p[idx], self.q[idx], self.tokens[idx], dict(self.stamp), self.image[idx], self.name,
                      checked=self.checked)


def ar_rows_arrays(rows: ARRows) -> dict:
    """The arrays of the npz format (``FORMAT``) for ``rows``: what ``coolsd.rowfiles.save_ar_rows`` writes."""
    return {"p": rows.p, "q": rows.q, "tokens": rows.tokens, "image": rows.image,
            "stamp": np.array(json.dumps({**rows.stamp, "format": FORMAT}))}


def load_ar_rows(path, name: str = "--ar-rows") -> ARRows:
    """``ARRows`` from an npz of the ``FORMAT`` (``coolsd tune --save-ar-rows``, ``coolsd.rowfiles``): read whole and
    checked now; a missing, damaged or malformed file, or one without a stamp, is one ValueError line."""
    hint = "make it with coolsd tune --model M --ar-images N --save-ar-rows FILE"
    z = checks.npz_arrays(name, path, ("p", "q", "tokens", "stamp"), hint)
    try:
        stamp = json.loads(str(z["stamp"]))
    except ValueError:
        raise ValueError(f"{name}: {os.fspath(path)!r} has a stamp that is not JSON; {hint}") from None
    if not isinstance(stamp, dict) or stamp.get("format") != FORMAT:
        raise ValueError(f"{name}: {os.fspath(path)!r} is not an AR-rows file (format {FORMAT!r}); {hint}")
    return ARRows(z["p"], z["q"], z["tokens"], stamp, z.get("image"), name)


@dataclass
class StampedRecord:
    """Recorded chain rounds with the tokens generated before each round and the run's stamp (module docstring).
    ``per_row``: tokens per image row for the row-wise survival estimate (``theory.likelihood.speed``)."""
    rows: Rows
    start: np.ndarray
    stamp: dict

    def __post_init__(self):
        self.stamp = _check_stamp("record", self.stamp)
        self.start = np.asarray(self.start, np.int64)
        if self.start.shape != (self.rows.R,):
            raise ValueError(f"record: start must be (R,) = ({self.rows.R},), got {self.start.shape}")
        if self.rows.L != self.stamp["L"] or self.rows.p.shape[-1] != self.stamp["V"]:
            raise ValueError(f"record: rows have L = {self.rows.L}, V = {self.rows.p.shape[-1]} but the stamp says "
                             f"L = {self.stamp['L']}, V = {self.stamp['V']}")
        if np.any(self.start < 0) or np.any(self.start + self.rows.n_drafted >= self.stamp["T"]):
            raise ValueError("record: round starts must lie in [0, T - n_drafted)")
        if np.any(self.rows.image < 0):
            raise ValueError("record: rounds need their image index (coolsd generate --record stores one)")

    T = property(lambda self: int(self.stamp["T"]))
    L = property(lambda self: self.rows.L)
    per_row = property(lambda self: int(self.stamp.get("per_row") or self.stamp["T"]))
    first_single = property(lambda self: self.stamp["convention"] == "eagle")

    def subset(self, idx) -> "StampedRecord":
        idx = np.asarray(idx)
        return StampedRecord(self.rows.subset(idx), self.start[idx], dict(self.stamp))


def load_record(path, name: str = "--record", legacy: bool = False):
    """A chain record of ``coolsd generate --record`` with its stamp -> ``StampedRecord``. A tree record is refused
    (the exact law of tree drafting is not implemented: one ValueError line); a record without a stamp (written
    before stamps) is refused too, or returned as plain ``Rows`` when ``legacy``."""
    hint = "record it with coolsd generate --method vanilla --record FILE (chain drafting)"
    z = checks.npz_arrays(name, path, ("p", "q"), hint)
    if "dynamic" in z or "tree_paths" in z:
        raise ValueError(f"{name}: {os.fspath(path)!r} holds tree rounds; the exact-law tuner needs chain rounds (the "
                         "exact likelihood of tree drafting is not implemented: a separate issue); record a chain run")
    if "stamp" not in z or "start" not in z:
        if legacy:
            return load_rows(path, name=name)
        raise ValueError(f"{name}: {os.fspath(path)!r} has no stamp (recorded before stamps were written); {hint}")
    try:
        stamp = json.loads(str(z["stamp"]))
        rows = Rows(z["p"], z["q"], z["drafts"], z.get("n_drafted"), z.get("image"))
    except (ValueError, TypeError, KeyError) as e:
        msg = str(e).removeprefix("rows: ")
        raise ValueError(f"{name}: {os.fspath(path)!r} does not hold a stamped chain record ({msg}); {hint}") from None
    return StampedRecord(rows, z["start"], stamp)
