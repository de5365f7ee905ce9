"""Input validation shared by every package (``theory``, ``sim``, ``real``, the CLI).

One place for each check, so that the same bad input gets the same message wherever it enters:

* scalars: :func:`integer`, :func:`count`, :func:`seed`, :func:`real` accept Python and numpy numbers
  alike and reject ``bool`` (a ``True`` is not a draft length), complex numbers, strings and NaN;
* arrays: :func:`float_array` (float64 copy; rejects complex, object and empty arrays),
  :func:`stochastic` (non-negative, finite, rows summing to 1 within :func:`row_sum_tol` of the
  *input* dtype, so float32 rows that are stochastic in float32 pass), :func:`acceptance_tables`
  (F (L, V, V) in [0, 1]) and :func:`resampling_tables` (G, row-stochastic, shape of F);
* array-API rows (numpy, torch, JAX): :func:`check_rows_xp`, :func:`check_tokens_xp`,
  :func:`check_uniforms_xp`, with one host synchronisation when the input is valid;
* sizes: :func:`check_memory` refuses an allocation larger than a budget *before* it is made, with the
  estimated memory in the message.

Every error is a ``ValueError`` (``SizeError`` for the memory guard, a subclass) whose message starts
with the offending argument's name.
"""
from __future__ import annotations

import math
import numbers
import sys

import numpy as np

__all__ = [
    "ROW_SUM_TOL", "MAX_BYTES", "SizeError", "integer", "count", "seed", "real", "float_array",
    "finite_nonneg", "stochastic", "row_sum_tol", "acceptance_tables", "resampling_tables",
    "check_rows_xp", "check_tokens_xp", "check_uniforms_xp", "rows_ok_xp", "rows_tol_xp", "tokens_ok_xp",
    "uniforms_ok_xp",
    "check_memory", "fmt_bytes", "instance", "boolean", "brief", "TRUE_WORDS", "FALSE_WORDS",
]

ROW_SUM_TOL = 1e-8          # |sum of a row - 1| allowed for float64 P, Q, G rows and start laws
MAX_BYTES = 2 * 2**30       # default memory budget of the size guards (2 GiB)
SEED_MAX = 2**64 - 1        # torch.manual_seed and numpy accept seeds up to here


class SizeError(ValueError):
    """A computation was refused before allocation because it would need more memory than allowed."""


# --------------------------------------------------------------------------- scalars

def _is_bool(x) -> bool:
    return isinstance(x, (bool, np.bool_))


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")


def boolean(name: str, x) -> bool:
    """A documented boolean: True / False, 0 / 1, or (environment text, any case) one of ``TRUE_WORDS`` /
    ``FALSE_WORDS``; anything else ("banana", "no " + typo, 2) is a one-line ValueError naming ``name``."""
    if isinstance(x, bool):
        return x
    if isinstance(x, (int, np.integer)) and int(x) in (0, 1):
        return bool(x)
    if isinstance(x, str) and x.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return x.strip().lower() in TRUE_WORDS
    raise ValueError(f"{name} must be a boolean (True / False, or one of {', '.join(w for w in TRUE_WORDS)} / "
                     f"{', '.join(w or repr(w) for w in FALSE_WORDS)}), got {brief(x)}")


def instance(name: str, x, types, what: str | None = None):
    """``x`` if it is an instance of ``types``, else a one-line TypeError naming ``name``, what it must be and what
    it got (the public API's first check on an object argument: never an AttributeError further in)."""
    if not isinstance(x, types):
        want = what or " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise TypeError(f"{name} must be {want}, got {type(x).__name__}")
    return x


def brief(x, limit: int = 80) -> str:
    """A one-line description of a value for a message: an array by its shape and dtype, else its repr cut to
    ``limit`` characters (a message never spans lines)."""
    if hasattr(x, "shape") and hasattr(x, "dtype") and getattr(x, "ndim", 0) > 0:
        return f"an array of shape {tuple(x.shape)} ({x.dtype})"
    r = " ".join(repr(x).split())
    return r if len(r) <= limit else r[:limit - 3] + "..."


def integer(name: str, x, lo: int | None = None, hi: int | None = None) -> int:
    """``x`` as an int: Python or numpy integers (not bools, not floats such as 3.0), in [lo, hi]."""
    if _is_bool(x) or not isinstance(x, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {brief(x)} ({type(x).__name__})")
    v = int(x)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else (f"<= {hi}" if lo is None else f"in [{lo}, {hi}]")
        raise ValueError(f"{name} must be an integer {rng}, got {v}")
    return v


def count(name: str, n) -> int:
    """A positive count (an integer >= 1)."""
    return integer(name, n, lo=1)


def seed(x, name: str = "seed") -> int | None:
    """A random seed: None or an integer in [0, 2^64 - 1] (what numpy and torch both accept)."""
    if x is None:
        return None
    if _is_bool(x) or not isinstance(x, numbers.Integral) or not 0 <= int(x) <= SEED_MAX:
        raise ValueError(f"{name} must be a non-negative integer <= 2**64 - 1 (or None), got {brief(x)}")
    return int(x)


def real(name: str, x, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
         hi_open: bool = False, finite: bool = True) -> float:
    """``x`` as a float: Python or numpy reals (not bools, not complex, not NaN), in the given interval.
    ``finite=False`` allows +-inf (still subject to the bounds)."""
    if _is_bool(x) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {brief(x)} ({type(x).__name__})")
    v = float(x)
    if math.isnan(v) or (finite and math.isinf(v)):
        raise ValueError(f"{name} must be a finite number, got {v}")
    bad_lo = lo is not None and (v <= lo if lo_open else v < lo)
    bad_hi = hi is not None and (v >= hi if hi_open else v > hi)
    if bad_lo or bad_hi:
        lo_s = "" if lo is None else f"{'>' if lo_open else '>='} {lo:g}"
        hi_s = "" if hi is None else f"{'<' if hi_open else '<='} {hi:g}"
        raise ValueError(f"{name} must be {' and '.join(s for s in (lo_s, hi_s) if s)}, got {v:g}")
    return v


# --------------------------------------------------------------------------- numpy arrays

def float_array(name: str, a, ndim: int | None = None, allow_empty: bool = False,
                copy: bool = True) -> tuple[np.ndarray, np.dtype]:
    """(float64 version of ``a``, the input's float dtype). Rejects complex, non-numeric and empty arrays
    and, when given, a wrong number of dimensions. The input dtype sets the row-sum tolerance.
    ``copy=False``: a float64 input comes back as is (no full-array copy) for callers that only read it."""
    arr = array(name, a)
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a real-valued array, got dtype {arr.dtype}")
    if arr.dtype.kind == "b":
        raise ValueError(f"{name} must hold probabilities (real numbers), got a bool array")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    if arr.size == 0 and not allow_empty:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    src = arr.dtype if arr.dtype.kind == "f" else np.dtype(np.float64)
    return arr.astype(np.float64, copy=copy), src


def row_sum_tol(dtype, V: int) -> float:
    """Allowed |row sum - 1| for rows of length V stored in ``dtype`` (numpy, torch or JAX dtype).

    float64: ROW_SUM_TOL (1e-8, unchanged). Lower precision: a row is made by a softmax or a renormalisation,
    whose normaliser is itself a sum of V terms computed in the dtype, in whatever order the kernel takes (blocked,
    vectorised lanes: not pairwise), and every entry inherits its relative error. Rounding errors of such sums grow
    like a random walk: |error| <= lambda sqrt(V) eps except with probability about 2 exp(-lambda^2 / 2) (Higham &
    Mary's probabilistic bound, SIAM J. Sci. Comput. 2019); lambda = 4 gives 4 sqrt(V) eps, and at small V the
    deterministic pairwise bound eps (1 + ceil(log2 V)) when it is larger. float32: 7.6e-6 at V = 256, 6.1e-5 at
    16,384 (a torch softmax row there sums to 1 within ~3e-6), 1.2e-4 at 65,536: a row off by 1e-3 (a missing
    renormalisation, a dropped entry) is still refused."""
    eps, n = _eps(dtype), max(int(V), 2)
    return max(ROW_SUM_TOL, eps * max(1 + math.ceil(math.log2(n)), 4.0 * math.sqrt(n)))


def _eps(dtype) -> float:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return float(torch.finfo(dtype).eps) if dtype.is_floating_point else float(np.finfo(np.float64).eps)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return float(np.finfo(np.float64).eps)
    if dt.kind != "f":
        return float(np.finfo(np.float64).eps)
    try:
        return float(np.finfo(dt).eps)
    except ValueError:  # extension floats (bfloat16 from ml_dtypes, used by JAX)
        import ml_dtypes

        return float(ml_dtypes.finfo(dt).eps)


# IEEE-754 float64 bit patterns read as uint64: with the sign bit clear they are ordered like the values,
# and every pattern with the sign bit set (negatives, -0.0) exceeds them all; NaN patterns exceed +inf's.
# So one read-only max over the patterns decides "all in [+0, 1]" or "all finite and >= +0" (the fast
# paths below); anything else (including a legal -0.0) goes to the exact float comparisons.
_ONE_BITS = int(np.array(1.0).view(np.uint64))
_INF_BITS = int(np.array(np.inf).view(np.uint64))


def _max_bits(a: np.ndarray) -> int | None:
    """max of the float64 bit patterns of ``a`` (one vectorised read, no temporary), or None when ``a``
    is not a C-contiguous float64 array (the caller then uses the float comparisons)."""
    if a.dtype != np.float64 or not a.flags.c_contiguous or a.size == 0:
        return None
    return int(a.reshape(-1).view(np.uint64).max())


def tables_block_ok(f: np.ndarray, g: np.ndarray | None, tol: float) -> bool:
    """Fast predicate for one row block of the tables (C-contiguous float64, as ``_max_bits`` needs):
    f in [0, 1] (bit patterns <= those of 1.0: no NaN, no negative, -0.0 included), g finite and >= 0
    with rows summing to 1 within ``tol``. True means ``acceptance_tables`` / ``resampling_tables``
    accept the block; False means they are to be called for the verdict and its message (a block of
    -0.0 entries is refused here and accepted there, so False is not an error by itself)."""
    if int(f.reshape(-1).view(np.uint64).max()) > _ONE_BITS:
        return False
    if g is None:
        return True
    if int(g.reshape(-1).view(np.uint64).max()) >= _INF_BITS:
        return False
    return bool(np.all(np.abs(g.sum(-1) - 1.0) <= tol))


def finite_nonneg(name: str, a: np.ndarray) -> None:
    """All entries finite and >= 0 (one vectorised read when they are)."""
    bits = _max_bits(a)
    if bits is not None and bits < _INF_BITS:
        return
    if np.all(a >= 0) and np.isfinite(a.sum()):  # NaN fails `>= 0`, inf fails the sum
        return
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite entries")
    raise ValueError(f"{name} has negative entries (min {a.min():.3g})")


def stochastic(name: str, a: np.ndarray, dtype=np.float64) -> None:
    """Rows of ``a`` (..., V) are probability vectors: finite, >= 0, summing to 1 within
    ``row_sum_tol(dtype, V)`` (``dtype``: the dtype the caller received the array in). A valid
    C-contiguous float64 array costs two vectorised reads (the signs, ``finite_nonneg``, and the row sums)."""
    finite_nonneg(name, a)
    tol = row_sum_tol(dtype, a.shape[-1])
    sums = a.sum(-1)
    err = np.abs(sums - 1.0)
    if np.any(err > tol):
        bad = np.unravel_index(np.argmax(err), err.shape)
        raise ValueError(f"{name} is not row-stochastic: row {tuple(int(b) for b in bad)} sums to "
                         f"{sums[bad]:.12g} (tolerance {tol:g})")


def acceptance_tables(F, V: int, name: str = "F", copy: bool = True) -> np.ndarray:
    """F (L, V, V) acceptance probabilities f_i(x | s) in [0, 1], L >= 1 (section 4); float64 (a copy
    unless ``copy=False``). A valid float64 table costs one vectorised read."""
    F, _ = float_array(name, F, allow_empty=True, copy=copy)
    if F.ndim != 3 or F.shape[1:] != (V, V):
        raise ValueError(f"{name} must have shape (L, {V}, {V}), got {F.shape}")
    if F.shape[0] < 1:
        raise ValueError(f"{name} must cover L >= 1 draft positions")
    bits = _max_bits(F)
    if bits is not None and bits <= _ONE_BITS:
        return F
    if not np.all((F >= 0) & (F <= 1)):  # NaN fails both comparisons
        if not np.all(np.isfinite(F)):
            raise ValueError(f"{name} contains NaN or infinite entries")
        raise ValueError(f"acceptance probabilities {name} must lie in [0, 1]; found values in "
                         f"[{F.min():.6g}, {F.max():.6g}]")
    return F


def resampling_tables(G, F: np.ndarray, name: str = "G", copy: bool = True) -> np.ndarray:
    """G (L, V, V) resampling laws, row-stochastic, of the same shape as F (section 4); float64 (a copy
    unless ``copy=False``). A valid float64 table costs two vectorised reads (``stochastic``)."""
    G, src = float_array(name, G, allow_empty=True, copy=copy)
    if G.shape != F.shape:
        raise ValueError(f"{name} must have the same shape as F {F.shape}, got {G.shape}")
    stochastic(name, G, src)
    return G


# --------------------------------------------------------------------------- array-API rows

def rows_tol_xp(a) -> float:
    """Row-sum tolerance for model rows a (..., V): that of their dtype, but never below float32's.
    Rows from a model are computed in float32 at best and are often upcast to float64 afterwards, so
    their sums carry float32 rounding (measured: 2.6e-7 for V = 256); the estimators that read them
    (T10, T11, verification) are Lipschitz in the rows, so such errors move results by as much."""
    V = a.shape[-1]
    return max(row_sum_tol(a.dtype, V), row_sum_tol(np.float32, V))


def rows_ok_xp(a, xp):
    """0-d bool array: rows a (..., V) are >= 0 and sum to 1 within rows_tol_xp (NaN and inf fail)."""
    return xp.all(a >= 0) & xp.all(xp.abs(xp.sum(a, axis=-1) - 1) <= rows_tol_xp(a))


def tokens_ok_xp(t, V: int, xp):
    """0-d bool array: every token lies in [0, V)."""
    return xp.all((t >= 0) & (t < V))


def uniforms_ok_xp(u, xp):
    """0-d bool array: every uniform lies in [0, 1) (NaN fails)."""
    return xp.all((u >= 0) & (u < 1))


def check_rows_xp(name: str, a, xp) -> None:
    """Rows a (..., V) of any array-API namespace are finite, >= 0 and sum to 1 (dtype-aware tolerance).
    One host synchronisation when valid; the detailed message is computed only on failure."""
    if bool(rows_ok_xp(a, xp)):
        return
    if not bool(xp.all(xp.isfinite(a))):
        raise ValueError(f"{name} contains NaN or infinite entries")
    if not bool(xp.all(a >= 0)):
        raise ValueError(f"{name} has negative entries (min {float(xp.min(a)):.3g})")
    sums = xp.reshape(xp.sum(a, axis=-1), (-1,))
    worst = float(sums[int(xp.argmax(xp.abs(sums - 1)))])
    raise ValueError(f"{name} rows must sum to 1: found a row summing to {worst:.12g} "
                     f"(tolerance {rows_tol_xp(a):g})")


def check_tokens_xp(name: str, t, V: int, xp) -> None:
    """Integer tokens in [0, V) (an index outside would wrap or fail deep inside a gather)."""
    if not xp.isdtype(t.dtype, "integral"):
        raise ValueError(f"{name} must be integer tokens, got dtype {t.dtype}")
    if math.prod(t.shape) and not bool(tokens_ok_xp(t, V, xp)):
        raise ValueError(f"{name} must lie in [0, V={V}); found values in [{int(xp.min(t))}, {int(xp.max(t))}]")


def check_uniforms_xp(name: str, u, xp) -> None:
    """Uniform variates in [0, 1) (NaN fails)."""
    if math.prod(u.shape) and not bool(uniforms_ok_xp(u, xp)):
        raise ValueError(f"{name} must lie in [0, 1) (uniform variates); found values outside [0, 1) or NaN")


# --------------------------------------------------------------------------- sizes

def fmt_count(n) -> str:
    """A count (a Python int of any size) in 3 significant digits: 1.23e+45, or 10^12345.6 beyond floats."""
    try:
        return f"{float(n):.3g}"
    except OverflowError:
        return f"10^{math.log10(n):.1f}"


def fmt_bytes(n: float) -> str:
    if not isinstance(n, float) and n > 2**1000:          # huge Python ints (V^(L+1) sequences): no float
        return f"10^{math.log10(n):.1f} B"
    for unit, k in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.3g} {unit}"
    return f"{int(n)} B"


def check_memory(what: str, nbytes: float, max_bytes: float | None = MAX_BYTES, hint: str = "") -> None:
    """Refuse (SizeError) before allocating when the estimated peak ``nbytes`` exceeds ``max_bytes``
    (None: no limit). The message gives the estimate, the budget and ``hint`` (how to proceed)."""
    if max_bytes is None or nbytes <= max_bytes:
        return
    raise SizeError(f"{what} would need about {fmt_bytes(nbytes)} of memory, above max_bytes={fmt_bytes(max_bytes)}"
                    + (f"; {hint}" if hint else ""))


# --------------------------------------------------------------------------- objects, array-likes, files, cost
# The shared layer of every public entry point (issue 26): the same bad input gets the same message in the
# CLI (coolsd.validate builds on these) and in the API (markov, sim, recorded, tune, real.decode.engine).

__all__ += ["MAX_SECONDS", "verifier", "array", "unit_interval", "fmt_seconds", "CostError", "check_cost",
            "npz_arrays"]
MAX_SECONDS = 600.0         # default run-time budget of the cost guards (10 minutes; max_seconds=None lifts it)


def verifier(v, name: str = "verifier", members: tuple[str, ...] = ("accept", "resample")):
    """A verifier object (``theory.rules.Verifier`` or anything with callable ``members``); a TypeError
    naming ``name`` otherwise (None, a method name such as "cool-sd", a class instead of an instance)."""
    if all(callable(getattr(v, m, None)) for m in members) and not isinstance(v, type):
        return v
    hint = (f"; build it first, e.g. theory.rules.methods.build({v!r}, L) or theory.rules.cool_sd(delta=2)"
            if isinstance(v, str) else "; e.g. theory.rules.vanilla() or theory.rules.cool_sd(delta=2)")
    raise TypeError(f"{name} must be a verifier object (theory.rules.Verifier), got {type(v).__name__} {brief(v)}"[:200]
                    + hint)


def array(name: str, a, ndim: int | None = None) -> np.ndarray:
    """``a`` as a numpy array: lists and tuples are converted; None, strings, bytes, dicts and sets are a
    TypeError naming ``name``; ragged lists a ValueError. (Torch / JAX arrays: convert them yourself.)"""
    if a is None or isinstance(a, (str, bytes, dict, set)):
        raise TypeError(f"{name} must be an array (numpy, or a nested list of numbers), got {type(a).__name__}")
    try:
        arr = np.asarray(a)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{name} is not a rectangular array ({str(e).splitlines()[0][:120]})") from None
    if arr.dtype == object:
        raise ValueError(f"{name} must be a rectangular array of numbers, got an object array of shape {arr.shape}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    return arr


def unit_interval(name: str, a) -> np.ndarray:
    """Values (a number or an array-like) in [0, 1] (NaN fails), as a float64 array."""
    if np.isscalar(a):
        arr = np.asarray(real(name, a), np.float64)
    else:
        arr = array(name, a)
        if arr.dtype.kind not in "iuf":          # complex, bool, strings: not levels
            raise ValueError(f"{name} must be real numbers in [0, 1], got dtype {arr.dtype}")
        arr = arr.astype(np.float64)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all((arr >= 0) & (arr <= 1)):
        bad = arr[~((arr >= 0) & (arr <= 1))].ravel()[0]
        raise ValueError(f"{name} must lie in [0, 1], got {brief(bad)}")
    return arr


def fmt_seconds(s: float) -> str:
    if s >= 86400 * 365:
        return f"{s / (86400 * 365):.3g} years"
    for unit, k in (("days", 86400), ("h", 3600), ("min", 60)):
        if s >= k:
            return f"{s / k:.3g} {unit}"
    return f"{s:.2g} s"


class CostError(SizeError):
    """A computation was refused before it started because its estimated run time exceeds the budget."""


def check_cost(what: str, nbytes: float, seconds: float, max_bytes: float | None = MAX_BYTES,
               max_seconds: float | None = MAX_SECONDS, hint: str = "") -> str:
    """Refuse (SizeError / CostError) before any work when the estimated peak memory ``nbytes`` or run time
    ``seconds`` exceeds its budget (None: no limit); the message gives both estimates and ``hint``. Returns
    a one-line estimate ("about 3 s, 12 MiB") for callers that print it before a long run."""
    check_memory(what, nbytes, max_bytes, hint)
    est = f"about {fmt_seconds(seconds)} and {fmt_bytes(nbytes)}"
    if max_seconds is not None and seconds > max_seconds:
        raise CostError(f"{what} would take {est}, above max_seconds={fmt_seconds(max_seconds)}"
                        + (f"; {hint}" if hint else ""))
    return est


def npz_arrays(name: str, path, required: tuple[str, ...] = (), hint: str = "") -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path``, read and decompressed now (CRC checked): a missing, empty,
    non-zip, truncated or bit-flipped file, a pickled array or a missing key ``required`` is one ValueError
    line naming ``name``, the file, what is wrong and ``hint`` (what to do)."""
    import os
    import zipfile
    import zlib

    from .files import input_file

    where = f"{name}: {os.fspath(path)!r}"
    tail = f"; {hint}" if hint else ""
    if not os.path.lexists(path):
        raise ValueError(f"{where} is not an existing file{tail}")
    input_file(name, path, "npz", hint=hint)     # regular (a FIFO / device unopened), size, not empty, a zip header
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in z.files}
    except ValueError as e:
        if "pickle" in str(e):
            raise ValueError(f"{where} holds pickled (object) arrays, which are not loaded{tail}") from None
        raise ValueError(f"{where} is damaged ({str(e).splitlines()[0][:120]}){tail}") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, KeyError, RuntimeError) as e:
        raise ValueError(f"{where} is damaged or truncated ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:120] if str(e) else 'no detail'}){tail}") from None
    missing = sorted(set(required) - set(out))
    if missing:
        raise ValueError(f"{where} lacks the arrays {missing} (has {sorted(out)[:8]}){tail}")
    return out
