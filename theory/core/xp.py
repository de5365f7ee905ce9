"""Array-API helpers (numpy, JAX and torch arrays alike): ``namespace`` (the arrays' namespace), ``gather``
(x[..., idx] along the last axis), ``take_last``, ``gather_rows``, ``normalize``, ``positive_part``, ``ratio_min1``,
``sample_categorical`` (inverse-CDF draws from rows), ``mark``, ``put_last``, ``top_m``, ``expand_masked`` and ``any_to``. Everything takes arrays and returns arrays of the same
namespace; no backend is imported. Shapes are in each function's docstring."""
from __future__ import annotations

from typing import Any

import array_api_compat

Array = Any


_NAMESPACES: dict = {}      # numpy's ndarray and torch's Tensor -> their namespace (``namespace``'s cache)


def namespace(*arrays: Array):
    """The array-API namespace of the given arrays (numpy, jax.numpy, torch, ...). Arrays all of type numpy.ndarray,
    or all torch.Tensor, take the namespace found for that type before (the compat layer's look-up costs ~9 us a call,
    and the host verifiers call it per rule call); any other mix asks the compat layer."""
    t = type(arrays[0]) if arrays else None
    ns = _NAMESPACES.get(t)
    if ns is not None and all(type(a) is t for a in arrays):
        return ns
    ns = array_api_compat.array_namespace(*arrays)
    if (t is not None and (t.__module__, t.__name__) in (("numpy", "ndarray"), ("torch", "Tensor"))
            and all(type(a) is t for a in arrays)):
        _NAMESPACES[t] = ns
    return ns


def _is_numpy(x) -> bool:
    """``array_api_compat.is_numpy_array(x)``: an array of exactly numpy's ndarray type (not JAX's float0, kind "V")
    answered at once, anything else asked of the compat layer (its check costs ~0.4 us, several calls a verdict)."""
    t = type(x)
    if t.__name__ == "ndarray" and t.__module__ == "numpy":
        return x.dtype.kind != "V" or array_api_compat.is_numpy_array(x)
    return array_api_compat.is_numpy_array(x)


def _is_torch(x) -> bool:
    """``array_api_compat.is_torch_array(x)``: a tensor of exactly torch's Tensor type answered at once."""
    t = type(x)
    return (t.__name__ == "Tensor" and t.__module__ == "torch") or array_api_compat.is_torch_array(x)


def gather(x: Array, idx: Array, xp=None) -> Array:
    """x[..., idx[...]] along the last axis. x: (..., V), idx: (...,) non-negative ints -> (...,)."""
    return take_last(x, idx[..., None], xp)[..., 0]


def take_last(x: Array, idx: Array, xp=None) -> Array:
    """x[..., idx[..., j]] along the last axis for every j. x: (..., M), idx: (..., J) non-negative ints -> (..., J)."""
    if _is_torch(x):
        # the compat layer's take_along_axis wraps negative indices (remainder + where per call); ours are
        # never negative, and on the engine's per-round path that wrapping was a third of the verifier's time
        return x.gather(-1, idx)
    if _is_numpy(x):  # numpy's own (the compat layer's wrapper and namespace look-up cost
        import numpy as np                  # more than the gather on the walks' (B, K) indices)

        if (getattr(idx, "ndim", -1) == x.ndim >= 1 and idx.shape[:-1] == x.shape[:-1] and idx.dtype.kind in "iu"
                and x.flags.c_contiguous):  # the same gather as rows of a 2-D view (a third of take_along_axis's cost)
            R = idx.size // idx.shape[-1] if idx.shape[-1] else 0
            flat = x.reshape(R, x.shape[-1]) if R else None
            if flat is not None:
                return flat[np.arange(R)[:, None], idx.reshape(R, idx.shape[-1])].reshape(idx.shape)
        return np.take_along_axis(x, idx, axis=-1)
    xp = xp or namespace(x)
    return xp.take_along_axis(x, idx, axis=-1)


def gather_rows(x: Array, idx: Array, xp=None) -> Array:
    """Row idx of the second-to-last axis. x: (..., N, V), idx: (...,) non-negative ints -> (..., V)."""
    V = x.shape[-1]
    if _is_torch(x):  # as in ``gather``
        return x.gather(-2, idx[..., None, None].expand(*idx.shape, 1, V))[..., 0, :]
    if _is_numpy(x):  # numpy's own broadcasting gather: no (..., 1, V) index array built
        import numpy as np

        idx = np.asarray(idx)
        if x.ndim == 3 and idx.ndim == 1 and idx.shape[0] == x.shape[0] and idx.dtype.kind in "iu":
            return x[np.arange(idx.shape[0]), idx]         # the same rows by fancy indexing (a third of the cost)
        return np.take_along_axis(x, idx[..., None, None], axis=-2)[..., 0, :]
    xp = xp or namespace(x)
    index = xp.broadcast_to(idx[..., None, None], (*idx.shape, 1, V))
    return xp.take_along_axis(x, index, axis=-2)[..., 0, :]


def normalize(w: Array, fallback: Array, xp=None, host: bool = False) -> Array:
    """Norm(w) = w / sum(w) over the last axis; rows with zero mass get `fallback` (same shape).

    The zero-mass test is exact (sum == 0): callers clip to non-negative values first, so a row
    sums to zero only if it is identically zero. ``host=True``: w is a torch CPU tensor whose sums may be read on the
    host (no device sync): with no empty row, the division alone (the same bits, without the two selections).
    """
    if _is_numpy(w):      # numpy's own functions: the same operations, without the compat
        import numpy as np                      # layer's per-call cost (the walks' rejections call this per step)

        s = np.add.reduce(w, axis=-1, keepdims=True)   # np.sum's own reduction, without its dispatch
        # no empty row (the usual case): the division alone, the same bits; the test is min(s) > 0 (one reduction:
        # a NaN sum makes it False and takes the generic formula below, which does not read it)
        if s.size and np.minimum.reduce(s, axis=None) > 0:
            r = w / s
            if (fallback is w or (type(fallback) is np.ndarray and fallback.shape == r.shape     # (the usual
                                  and fallback.dtype == r.dtype)                                # case, at once)
                    or (np.broadcast_shapes(r.shape, np.shape(fallback)) == r.shape
                        and np.result_type(fallback, r) == r.dtype)):
                return r
        empty = s <= 0
        return np.where(empty, fallback, w / np.where(empty, np.ones_like(s), s))
    xp = xp or namespace(w)
    s = xp.sum(w, axis=-1, keepdims=True)
    if host and not (s.numpy() <= 0).any():
        return w / s
    empty = s <= 0
    return xp.where(empty, fallback, w / xp.where(empty, xp.ones_like(s), s))


def positive_part(x: Array, xp=None) -> Array:
    """[x]_+ elementwise."""
    if _is_numpy(x):
        import numpy as np

        if x.dtype.kind == "f":                 # floats: fmax drops NaN (-> 0) and adding +0.0 turns -0.0 into +0.0:
            r = np.asarray(np.fmax(x, 0.0))     # the where's bits, 10x faster (tests/test_xp_fast.py)
            r += 0.0
            return r
        return np.where(x > 0, x, np.zeros_like(x))     # numpy's own functions, as in ``normalize``
    if _is_torch(x) and x.is_floating_point():   # the same bits (tests/test_xp_fast.py): NaN -> 0,
        # -0.0 -> +0.0 (the + 0.0), +inf kept; a torch CPU where over a row costs 40x a clamp
        return x.clamp_min(0).nan_to_num_(0.0, posinf=float("inf")).add_(0.0)
    xp = xp or namespace(x)
    return xp.where(x > 0, x, xp.zeros_like(x))


def sample_categorical(w: Array, u: Array, xp=None) -> Array:
    """Inverse-CDF draw from unnormalised non-negative weights.

    w: (..., V) weights with positive row sums; u: (...,) uniforms in [0, 1) -> (...,) int64 indices.
    The index is the number of cumulative sums <= u * total, which always lands on a token with
    w > 0; a guard maps any float round-off landing elsewhere to the row's argmax.
    """
    if _is_numpy(w):      # numpy's own functions: the same operations without the compat
        return _sample_numpy(w, u)              # layer's per-call cost (~4x on the engine's (B, V) host rows)
    xp = xp or namespace(w)
    c = xp.cumulative_sum(w, axis=-1)
    t = u * c[..., -1]
    idx = xp.sum(xp.astype(c <= t[..., None], xp.int64), axis=-1)
    idx = xp.clip(idx, 0, w.shape[-1] - 1) if hasattr(xp, "clip") else xp.minimum(idx, w.shape[-1] - 1)
    ok = gather(w, idx, xp) > 0
    return xp.where(ok, idx, xp.astype(xp.argmax(w, axis=-1), xp.int64))


def _sample_numpy(w, u):
    """``sample_categorical`` on numpy arrays, step for step."""
    import numpy as np

    c = np.cumsum(w, axis=-1)
    t = np.asarray(u) * c[..., -1]
    if w.ndim == 2 and w.shape[0] == 1 and t.shape == (1,) and t[0] == t[0] and np.minimum.reduce(w, axis=None) >= 0:
        # one row of weights >= 0 (no NaN): c is non-decreasing, so the count of c <= t is the binary search's
        # right insertion point (t not NaN; searchsorted compares in the common dtype, as <= does)
        i = min(int(np.searchsorted(c[0], t[0], side="right")), w.shape[-1] - 1)
        return np.array([i if w[0, i] > 0 else int(np.argmax(w[0]))], np.int64)
    idx = np.minimum(np.add.reduce(c <= t[..., None], axis=-1, dtype=np.int64), w.shape[-1] - 1)
    # w at the drawn codes (rows (B, V): one fancy gather, the same entries as take_last's)
    ok = (w[np.arange(len(idx)), idx] if w.ndim == 2 else take_last(w, idx[..., None])[..., 0]) > 0
    if np.ndim(idx) and ok.all():               # (no round-off landed off the support: the argmax is not read)
        return idx
    return np.where(ok, idx, np.argmax(w, axis=-1).astype(np.int64))


def ratio_min1(num: Array, q: Array, xp=None) -> Array:
    """min(1, num / q) elementwise, with the convention 1 where q = 0 (a token that is never drafted); num and q
    broadcast (num >= 0: masses). The ratio is used only where num < q (so q > 0: no division by zero is read); a NaN
    or negative num is passed through where it is not below q (never read as an acceptance of 1).

    numpy: two passes and two scans (divide, clip at 1 in place; q's sign bits, a NaN scan) instead of the generic
    seven passes. With q >= +0.0 the quotient is the same IEEE division where num < q; where num >= q it is >= 1,
    +inf (q = 0 < num, or an overflow on a denormal q), NaN or -inf (0 / 0, inf / inf, a NaN operand, a negative num
    over q = 0: those few entries take the generic formula), so min(., 1) gives the generic branch's values bit for
    bit (tests/test_xp_fast.py); a q with a sign bit set (negative, or -0.0: not a mass) takes the generic branch
    whole."""
    if _is_numpy(num) and _is_numpy(q):   # numpy's own functions (the
        import numpy as np                                                             # compat layer's cost 5x here)

        if num.size == 1 == q.size:          # one entry each (a walk's step at batch 1): Python floats, where they give
            r = _ratio_min1_one(num, q)      # the same bits
            if r is not None:
                return r
        if np.signbit(q).any():                      # a negative q or -0.0 (not a mass): the generic branch
            return _ratio_min1_generic(num, q, np).astype(np.result_type(num, q), copy=False)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            r = np.asarray(np.divide(num, q, dtype=np.result_type(num, q)))
            np.minimum(r, 1, out=r)
            # NaN, or -inf (a negative num over q = 0): np.minimum's reduction is NaN or -inf iff one entry is
            if r.size and not np.minimum.reduce(r, axis=None) > -np.inf:
                odd = ~(r > -np.inf)
                r[odd] = _ratio_min1_generic(np.broadcast_to(num, r.shape)[odd], np.broadcast_to(q, r.shape)[odd],
                                             np)
        return r
    return _ratio_min1_generic(num, q, xp or namespace(num, q))


def _ratio_min1_one(num, q):
    """``ratio_min1`` of one entry each (numpy arrays or scalars of one element, any shapes: the result has the
    broadcast shape, all ones), float32 / float64 only, as Python floats: num < q with q != 0 divides (float64's IEEE
    division, the same as numpy's in float64; for float32 the float64 quotient rounded once more to float32, the
    correctly rounded float32 quotient since 53 >= 2 * 24 + 2 bits make that double rounding innocuous), num >= q with
    num >= 0 gives 1; anything else (a NaN, a negative num, q = 0 below num) is None: the array formula serves it
    (tests/test_xp_fast.py checks the bits against the generic formula)."""
    import numpy as np

    dn, dq = num.dtype, q.dtype
    if not (dn.kind == dq.kind == "f" and dn.itemsize in (4, 8) and dq.itemsize in (4, 8)):
        return None
    r = ratio_min1_floats(num.item(), q.item(), False)          # (the float64 quotient, rounded to the dtype below)
    if r is None:
        return None
    shape = num.shape if num.ndim >= q.ndim else q.shape
    return np.array(r, dn if dn is dq or dn == dq else np.promote_types(dn, dq)).reshape(shape)


def ratio_min1_floats(a: float, b: float, f32: bool):
    """``ratio_min1`` of one entry on Python floats a (num) and b (q), its bits (``_ratio_min1_one``'s cases): a < b
    with b != 0 divides (float64's IEEE division; with ``f32`` rounded once more to float32, the correctly rounded
    float32 quotient), a >= b with a >= 0 gives 1.0; None elsewhere (a NaN, a negative a, b = 0 below a), where the
    array formula serves. A test u < f of the host's scalar paths then compares exact values, as numpy's does."""
    if a < b:
        if b == 0.0:
            return None
        if f32:                             # (numpy imported here, as in this module's other numpy paths)
            import numpy as np

            return float(np.float32(a / b))
        return a / b
    return 1.0 if a >= 0.0 else None


def divide_or_zero(num: Array, den: Array, xp=None):
    """(num / den where den > 0, else 0; the mask den <= 0, or None where no entry has den <= 0), num and den
    broadcast, den >= 0 (a mass). numpy: one division, then the few empty entries zeroed (the same bits as the
    guarded division); other namespaces: the guarded division."""
    if _is_numpy(num) and _is_numpy(den):
        import numpy as np

        empty = den <= 0
        if not empty.any():
            return num / den, None
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.asarray(num / den)
        out[np.broadcast_to(empty, out.shape)] = 0
        return out, empty
    xp = xp or namespace(num, den)
    empty = den <= 0
    out = num / xp.where(empty, xp.ones_like(den), den)
    return xp.where(empty, xp.zeros_like(out), out), empty


def _ratio_min1_generic(num, q, xp):
    """``ratio_min1`` in the array namespace ``xp``: it divides only where num < q."""
    lt = num < q                                     # ratio below 1 (so q > 0): the only place it divides
    one = xp.ones_like(xp.where(lt, num, q))         # (the broadcast shape and dtype)
    return xp.where(lt, num / xp.where(lt, q, one), xp.where(num >= 0, one, num))


def mark(idx: Array, V: int, xp=None) -> Array:
    """(..., V) bool, True at the codes listed in ``idx`` (..., m) (non-negative ints < V, repeats allowed): the mask
    of a set of codes in O(V + m) per row (a scatter: numpy ``put_along_axis``, torch ``scatter``, JAX ``.at``),
    instead of the O(V m) comparison with every code (kept as the fallback for other namespaces)."""
    import numpy as np

    shape = (*idx.shape[:-1], V)
    if isinstance(idx, np.ndarray):
        out = np.zeros(shape, dtype=bool)
        np.put_along_axis(out, idx.astype(np.int64, copy=False), True, axis=-1)
        return out
    if _is_torch(idx):
        import torch

        return torch.zeros(shape, dtype=torch.bool, device=idx.device).scatter_(-1, idx.long(), True)
    xp = xp or namespace(idx)
    if array_api_compat.is_jax_array(idx):
        lead = tuple(xp.meshgrid(*[xp.arange(s) for s in idx.shape[:-1]], indexing="ij")) if idx.ndim > 1 else ()
        lead = tuple(a[..., None] for a in lead)
        return xp.zeros(shape, dtype=xp.bool).at[(*lead, idx)].set(True)
    ar = xp.arange(V, device=array_api_compat.device(idx))
    return xp.any(idx[..., :, None] == ar, axis=-2)


def put_last(x: Array, idx: Array, values: Array, xp=None, *, copy: bool = True) -> Array:
    """x (..., V) with x[..., idx[..., j]] = values[..., j] along the last axis: idx (..., m) non-negative ints < V
    (repeats only with equal values), values (..., m) or a scalar of x's dtype. A copy of x, or (``copy=False``, for
    an x its caller owns) x written in place where the backend can (numpy, torch; JAX always copies). O(V + m) per
    row (a copy and a scatter: numpy ``put_along_axis``, torch ``scatter``, JAX ``.at``), O(m) in place."""
    import numpy as np

    if isinstance(x, np.ndarray):
        out = x.copy() if copy else x
        idx = np.asarray(idx, np.int64)
        if (idx.ndim == out.ndim >= 1 and idx.shape[:-1] == out.shape[:-1] and out.flags.c_contiguous and idx.size
                and np.ndim(values) == 0):     # a scalar into contiguous rows: fancy indexing on a 2-D view
            R = idx.size // idx.shape[-1]
            out.reshape(R, out.shape[-1])[np.arange(R)[:, None], idx.reshape(R, idx.shape[-1])] = values
            return out
        np.put_along_axis(out, idx, values, axis=-1)
        return out
    xp = xp or namespace(x)
    scalar = getattr(values, "ndim", 0) == 0
    if _is_torch(x):
        idx = idx.long()
        src = values if not scalar else xp.asarray(values, dtype=x.dtype, device=x.device).expand(idx.shape)
        return x.scatter(-1, idx, src) if copy else x.scatter_(-1, idx, src)
    if array_api_compat.is_jax_array(x):
        lead = tuple(xp.meshgrid(*[xp.arange(s) for s in idx.shape[:-1]], indexing="ij")) if idx.ndim > 1 else ()
        return x.at[(*tuple(a[..., None] for a in lead), idx)].set(values)
    raise NotImplementedError(f"put_last: a scatter for {type(x).__name__} arrays is not written (numpy, torch, JAX)")


def top_m(x: Array, m: int, xp=None) -> Array:
    """Indices (..., m) int64 of the m largest entries of x (..., V) in decreasing order, ties to the lower index:
    ``argsort(x, descending, stable)[..., :m]`` without sorting all V entries. numpy: ``argpartition`` (O(V)), then
    the m winners ordered by (value desc, index); a row where a tie straddles the m-th place (more than m entries
    >= the m-th value) takes the full stable sort, the only way to know which tied entries are in. torch: ``topk``
    with the same tie rule (two read-backs of tie checks: ``real.decode.drafting.top_m`` calls this on the host
    path and takes the stable sort on devices). Other namespaces: the stable sort."""
    V = x.shape[-1]
    if _is_numpy(x) and 0 < m < V:
        import numpy as np

        flat = np.reshape(x, (-1, V))
        idx = np.argpartition(flat, V - m, axis=-1)[:, V - m:]           # the m largest, in no order
        val = np.take_along_axis(flat, idx, -1)
        amb = np.count_nonzero(flat >= val.min(-1)[:, None], axis=-1) > m
        if amb.any():
            idx[amb] = np.argsort(-flat[amb], axis=-1, kind="stable")[:, :m]
            val[amb] = np.take_along_axis(flat[amb], idx[amb], -1)
        order = np.lexsort((idx, -val), axis=-1)
        return np.reshape(np.take_along_axis(idx, order, -1).astype(np.int64, copy=False), (*x.shape[:-1], m))
    if _is_torch(x) and 0 < m < V:
        import torch

        val, idx = x.topk(m + 1, dim=-1, sorted=True)
        if not bool((val[..., 1:] == val[..., :-1]).any()):               # no tie among the m + 1 largest: topk's
            return idx[..., :m]                                           # order is the one
        if bool((val[..., m - 1] == val[..., m]).any()):                  # a tie straddles the m-th place
            return torch.argsort(x, dim=-1, descending=True, stable=True)[..., :m]
        idx, val = idx[..., :m], val[..., :m]
        idx, o = idx.sort(dim=-1)                                         # by index, then stably by value
        return idx.gather(-1, torch.argsort(val.gather(-1, o), dim=-1, descending=True, stable=True))
    xp = xp or namespace(x)
    return xp.astype(xp.argsort(x, axis=-1, descending=True, stable=True)[..., :m], xp.int64)


def expand_masked(vals: Array, mask: Array, fill: Array, xp) -> Array:
    """Dense (n,) from ``vals`` (m,) at the True entries of ``mask`` (n,) bool (in order, m = their count) and
    ``fill`` (n,) elsewhere; a gather at each entry's running count (no item assignment: any backend)."""
    if vals.shape[0] == 0:
        return fill
    pos = xp.cumulative_sum(xp.astype(mask, xp.int64)) - 1
    return xp.where(mask, xp.take(vals, xp.where(pos < 0, xp.zeros_like(pos), pos)), fill)


def any_to(m: Array, shape, xp) -> Array:
    """m (..., V) bool reduced by "any" to ``shape`` (the same or fewer axes, size 1 where m's are larger)."""
    lead = m.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + a for a, s in enumerate(shape) if s == 1 and m.shape[lead + a] != 1)
    return xp.reshape(xp.any(m, axis=axes, keepdims=True), shape) if axes else m
