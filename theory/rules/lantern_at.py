"""LANTERN's acceptance at drafted tokens, on the host: the flat entries of rows without a copy (``entries``), numpy
views of torch CPU tensors (``host_views``), and the decision u < f(x) from bounds, the k neighbours summed only where the
bounds do not decide it (``decide_at``; docs/theory/trees.md section 9b, "The admitted mass where it decides").

Shapes: rows p, q (..., V), tokens x and uniforms u (...,); a neighbour table (V, K >= k) ints, nearest first."""
from __future__ import annotations

import sys
import weakref

import array_api_compat
import numpy as np

from ..core.xp import Array, ratio_min1
from . import prefix_mass as _pm
from .prefix_mass import prefix_mass_at

__all__ = ["entries", "host_table", "host_views", "decide_at", "upper"]


_VIEWS: dict = {}      # id of a torch CPU table -> (a weak reference to it, its int64 numpy view)


def host_table(neighbors) -> np.ndarray:
    """The table as int64 numpy (a view of a torch CPU table, kept while the table lives: the conversion costs more
    than a few tokens' masses; no copy when it is int64)."""
    if isinstance(neighbors, np.ndarray):
        return neighbors.astype(np.int64, copy=False)
    got = _VIEWS.get(id(neighbors))
    if got is not None and got[0]() is neighbors:
        return got[1]
    view = np.asarray(neighbors).astype(np.int64, copy=False)
    if type(neighbors).__module__.startswith("torch"):
        if len(_VIEWS) > 64:
            _VIEWS.clear()
        _VIEWS[id(neighbors)] = (weakref.ref(neighbors), view)
    return view


def host_views(*arrays):
    """numpy views (no copies) of torch CPU tensors (None entries kept), when ``prefix_mass.TORCH_CPU_ON_NUMPY`` holds
    and every array is a plain CPU tensor autograd does not track, of a dtype numpy has (``prefix_mass._torch_cpu``);
    else None. The callers then run numpy's calls on the views: elementwise operations, gathers and scatters give
    torch's bits, the neighbour masses are summed in float64 as ``_on_numpy`` sums them, and sums over a row (a residual's
    normalisation) stay torch's."""
    torch = sys.modules.get("torch")
    if torch is None or not _pm.TORCH_CPU_ON_NUMPY:
        return None
    for a in arrays:    # (a handful of arguments)
        if a is not None and (type(a) is not torch.Tensor or not a.is_cpu or a.requires_grad
                              or a.dtype == torch.bfloat16 or a.is_conj() or a.is_neg()):
            return None
    return tuple(None if a is None else a.numpy() for a in arrays)


def _flat_rows(p: np.ndarray):
    """numpy rows p (..., V) as (pf, offsets): pf a 1-D view of the memory the rows lie in (no copy, read-only), offsets
    (R,) int64 the start of each row in it, rows in p's order (C order of the leading axes); None where the rows do
    not start at multiples of V from p's first entry with a contiguous last axis (then the caller copies). Serves row
    slices (a chain's p[..., :L, :]) and broadcast rows (stride 0) without the copy a reshape would make."""
    V, it = p.shape[-1], p.itemsize
    if p.flags.c_contiguous:
        return p.reshape(-1), np.arange(p.size // max(V, 1), dtype=np.int64) * V
    st = p.strides
    if p.size == 0 or st[-1] != it or any(s < 0 or s % (V * it) for s in st[:-1]):
        return None
    rs = [s // it for s in st[:-1]]
    span = sum((n - 1) * s for n, s in zip(p.shape[:-1], rs)) + V
    pf = np.lib.stride_tricks.as_strided(p, shape=(span,), strides=(it,), writeable=False)
    off = np.zeros((), np.int64)
    for d, (n, s) in enumerate(zip(p.shape[:-1], rs)):   # a loop over the leading axes (a handful)
        off = off[..., None] + np.arange(n, dtype=np.int64) * s if d else np.arange(n, dtype=np.int64) * s
    return pf, np.reshape(off, (-1,))


def entries(p: Array, x: Array, xp):
    """Rows p (..., V) broadcast to tokens x (...,) as flat rows and the flat entries of the tokens: (pf, e (R,)), pf a
    1-D array holding every row (numpy: a view of p's memory where ``_flat_rows`` serves, no copy) and e the entries
    row start + x, rows in the order of x's entries. Flat entries are what ``prefix_mass_at`` reads (row start =
    e - e % V: the rows start at multiples of V)."""
    V = p.shape[-1]
    shape = tuple(x.shape)
    if isinstance(p, np.ndarray):    # numpy's own calls (the compat layer's cost is most of a few tokens' time)
        if p.ndim == 2 and p.shape[0] == 1 and shape == (1,) and p.flags.c_contiguous:   # one row, one token (a
            return p.reshape(-1), np.asarray(x).astype(np.int64, copy=False).reshape(-1)   # walk at batch 1): start 0
        pb = p if p.shape[:-1] == shape else np.broadcast_to(p, (*shape, V))
        fr = _flat_rows(pb)
        pf, off = fr if fr is not None else (pb.reshape(-1), np.arange(pb.size // V, dtype=np.int64) * V)
        return pf, off + np.reshape(x, (-1,)).astype(np.int64, copy=False)
    if tuple(p.shape[:-1]) != shape:
        p = xp.broadcast_to(p, (*shape, V))
    pf = xp.reshape(p, (-1,))
    R = pf.shape[0] // V
    e = xp.arange(R, device=array_api_compat.device(p)) * V + xp.reshape(xp.astype(x, xp.int64), (-1,))
    return pf, e


def upper(px, thr):
    """The bound of p~(x) = p(x) + A in the rows' dtype, A the admitted mass in [0, thr] (a prefix sum <= thr, or 0):
    p(x) + thr rounded as p~(x) is (rounding is monotone, so p~(x) <= it). px (...,), thr a number or px's shape."""
    if type(thr) is type(px) and type(px) is not np.ndarray:                         # numpy scalars of one dtype
        return px + thr
    same = isinstance(thr, (np.ndarray, np.generic)) and thr.dtype == px.dtype         # (numpy scalars: no 0-d array)
    return px + (thr if same else np.asarray(thr, px.dtype))


def decide_at(acc, p, q, x, u, *, want=None, chain: bool = False):
    """The acceptance decisions u < f(x) of ``acc`` (a ``Lantern``) at tokens x, f = min(1, p~(x) / q(x)): (ok (...,)
    bool, f (...,) with NaN where it was not summed) for rows p (..., V) (broadcast to x), q (..., V), x and u (...,).
    The admitted mass A lies in [0, thr] (thr: delta, or (lam - 1) p(x), in the rows' dtype), so where q(x) > 0 f lies
    in [min(1, p(x)/q(x)), (p(x) + thr)/q(x)] (rounding is monotone): u below the first accepts, u at or above the
    second rejects, and only the entries in between read x's k neighbours (``prefix_mass_at``: the same f, bit for bit,
    as ``Lantern.at``). ``want`` (...,) bool: the entries whose decision is read (others: False, NaN). ``chain``: the
    last axis is a chain's drafts, read up to the first rejection: after a row's first sure rejection, the entries the
    bounds leave open are not summed (False). numpy rows, and torch CPU tensors through their numpy views (f summed in float64 as ``Lantern.at``
    does there); other arrays: f at every entry (``Lantern.at``)."""
    if type(p) is type(q) is type(x) is type(u) is np.ndarray and x.size == 1 and p.size == p.shape[-1] == q.size \
            and p.ndim == q.ndim == x.ndim + 1:                              # one entry of numpy rows (batch 1)
        acc._check_rows(p)
        one = _decide_one(acc, p, q, x, u, want)
        if one is not None:
            return one
    host = host_views(p, q, x, u, want)
    if host is not None:
        p, q, x, u, want = host
    elif not all(isinstance(a, np.ndarray) for a in (p, q, x, u)):
        f = acc.at(p, q, None, x)
        ok = u < f
        return (ok if want is None else ok & want), f
    acc._check_rows(p)
    shape, V = np.shape(x), p.shape[-1]
    pf, e = entries(p, x, np)
    qf, eq = entries(q, x, np)
    px, qx, uf = pf[e], qf[eq], np.reshape(u, (-1,))
    thr = acc._threshold(px)
    dt = np.result_type(px, qx)
    # bounds of f = ratio_min1(p~, q) (only their validity matters): where q > 0, min(1, p(x) / q(x)) <= f <= (p(x) +
    # thr) / q(x); elsewhere 0 <= f <= +inf (f = 1 there: the entry is summed if it is wanted)
    pos = qx > 0
    r = np.divide(px, qx, out=np.zeros(px.shape, dt), where=pos)
    ok = uf < np.minimum(r, 1, out=r)                                             # accepted whatever A is
    r = np.divide(upper(px, thr), qx, out=np.full(px.shape, np.inf, dt), where=pos)
    need = (uf < r) & ~ok                                                         # A decides
    if want is not None:
        w = np.reshape(want, (-1,))
        ok &= w
        need &= w
    f = np.full(px.shape, np.nan, dt)
    i = np.flatnonzero(need)
    if chain and i.size:        # after a row's first sure rejection (u >= the upper bound) nothing is read
        sure = ~(ok | need) if want is None else w & ~(ok | need)
        L = shape[-1]
        j = np.flatnonzero(sure)
        if j.size:
            stop = np.full(len(uf) // L, L)
            np.minimum.at(stop, j // L, j % L)
            i = i[i % L < stop[i // L]]
    if i.size:
        m = prefix_mass_at(pf, e[i], host_table(acc.neighbors), thr if np.ndim(thr) == 0 else thr[i], acc.k, V,
                           sum_dtype=np.float64 if host is not None else None)
        num, qi = px[i] + m, qx[i]
        if (qi > 0).all():      # ratio_min1's bits where q > 0: min(1, num / q) (an overflow to +inf clipped to 1)
            fi = np.minimum(num / qi, 1)
        else:
            fi = ratio_min1(num, qi, np)
        f[i] = fi
        ok[i] = uf[i] < fi
    ok, f = ok.reshape(shape), f.reshape(shape)
    if host is not None:
        torch = sys.modules["torch"]
        return torch.from_numpy(ok), torch.from_numpy(f)
    return ok, f


def _decide_one(acc, p, q, x, u, want):
    """``decide_at`` of one entry on its scalars (numpy rows p, q (..., V) holding one row each, x and u numpy arrays
    of one element, x's shape one axis short of p's): (ok, f) as ``decide_at``'s general path gives them, bit for bit;
    None where that path serves it (q(x) = 0 with the neighbours read, or a row not C-ordered). The same operations
    in the same dtypes as the general path's arrays: numpy scalars of p's and q's dtypes for p(x) / q(x), the
    threshold and its upper bound, Python floats (float64) for the comparisons with u, as numpy compares there (exact:
    both convert exactly); where the bounds leave it open, x's neighbours summed by ``prefix_mass_at`` on the same flat
    row, entry and threshold as the general path (``entries``' one-row layout) and f = min(1, (p(x) + A) / q(x))."""
    shape = x.shape
    dt = p.dtype if p.dtype == q.dtype else np.result_type(p.dtype, q.dtype)
    if want is not None and not np.asarray(want).item():
        return np.zeros(shape, bool), np.full(shape, np.nan, dt)
    xi = int(x.item())
    at = (0,) * x.ndim + (xi,)
    px, qx, uf = p[at], q[at], float(u.item())
    if qx > 0:
        r = px / qx
        ok = uf < (1.0 if r > 1 else float(r))                                  # min(1, p(x) / q(x)); NaN: False
        need = not ok and uf < float(upper(px, acc._threshold(px)) / qx)
    else:                                                                       # (f = 1 there: the entry is summed)
        ok, need = uf < 0.0, not uf < 0.0 and uf < np.inf
    if not need:
        return np.array(ok).reshape(shape), np.array(np.nan, dt).reshape(shape)        # (fresh arrays)
    if not (qx > 0 and p.flags.c_contiguous):
        return None
    pf, e = p.reshape(-1), np.array([xi], np.int64)                             # (``entries``: one row, start 0)
    pe = pf[e]
    m = prefix_mass_at(pf, e, host_table(acc.neighbors), acc._threshold(pe), acc.k, p.shape[-1])
    fi = np.minimum((pe + m) / np.asarray(qx), 1)                               # (1,) in dt, as the general path's
    return np.array(uf < float(fi[0])).reshape(shape), fi.reshape(shape)
