"""LANTERN's admitted neighbour mass (docs/theory.md section 6): for an entry (a row and a code x), the mass of the
longest prefix of x's k nearest neighbours whose cumulative target mass stays <= a threshold. One implementation,
``prefix_mass_at``, serves the drafted tokens (a few entries) and the dense rows (every code, ``prefix_mass``), on
numpy, torch and JAX, with the same bits for an entry whichever others are computed with it; ``_prefix_of`` is its
single-block step on numpy (also the level walk's, ``theory.rules.lantern.Lantern.sibling_mass``); ``whole_bounds``
brackets the whole sum ``prefix_rows`` takes from a float64 sum of the same masses (the rank-by-rank level walk
decides from it, ``theory.rules.lantern_walk``).

Shapes: flat rows pf (R V,), entries e (m,) ints = row * V + code, a neighbour table nb (V, >= k) int64 on pf's
device, nearest first."""
from __future__ import annotations

import functools

import array_api_compat

from ..core.xp import Array, expand_masked, namespace

__all__ = ["prefix_mass_at", "prefix_mass", "prefix_rows", "FIRST_BLOCK", "SMALL_BLOCK", "COMPACT", "COLUMNS_ABOVE", "GATHER_LIMIT",
           "whole_bounds", "whole_slack", "SIBLING_BLOCK", "FEW_FIRST", "COLUMNS_LAID_OUT", "TORCH_CPU_ON_NUMPY",
           "WHOLE_FIRST"]

# A code's neighbour masses are summed over blocks of columns [0, w_0), [w_0, w_0 + w_1), ... (each at least twice the
# last, FIRST_BLOCK first): a block by one cumulative sum down its columns, or on a large numpy set column by column. The
# sums are sequential per entry and carried unrounded from block to block (numpy: in the rows' dtype, its cumulative sum
# is sequential; torch: in float64, as its CPU cumulative sum accumulates float32 anyway, and its outer-axis scan is
# sequential per entry on CUDA too), so any block layout gives the same bits: a block may then span every column left
# when it holds at most SMALL_BLOCK (entries x columns); on torch and JAX the drafted tokens' masses come out of one
# gather and one cumulative sum, with no read-back; on numpy (the host) of FEW_FIRST columns first, then the rest for the
# entries that passed them (most prefixes stop in the first). JAX and MPS (no float64) keep the doubling layout. An entry's value does not depend
# on which other entries are computed with it: the mass at the drafted tokens equals the dense row's bit for bit. After
# a block the entries whose prefix stopped leave the active set when it has shrunk by COMPACT, and the loop ends when
# none is left (one read-back per block but the last).
FIRST_BLOCK = 2
SMALL_BLOCK = 1 << 16     # (numpy's column-by-column threshold below: a widened block stays one cumulative sum)
COMPACT = 0.8
COLUMNS_ABOVE = 1 << 16     # numpy: a block of more (entries x columns) is added column by column (the same bits)
GATHER_LIMIT = 1 << 22
SIBLING_BLOCK = 16          # ``Lantern.sibling_mass``: the first block of columns when many entries (then doubling)
FEW_FIRST = 32              # ``prefix_mass_at`` of few entries: the first block's columns (then the rest at once)
COLUMNS_LAID_OUT = 16       # ``prefix_rows``: from this many entries, sums down the transposed block
TORCH_CPU_ON_NUMPY = True   # torch CPU tensors are summed by the numpy code (``_on_numpy``: the same bits, 10x faster)
WHOLE_FIRST = True          # ``prefix_mass`` of numpy rows, a scalar threshold: the whole neighbour sums first


def _sum_dtype(pf, xp):
    """The dtype masses are summed in, and whether block widths may follow the active set (module note above)."""
    if array_api_compat.is_numpy_array(pf):
        return pf.dtype, True
    if array_api_compat.is_torch_array(pf) and pf.device.type != "mps":
        return xp.float64, True
    return pf.dtype, False


def _blocks(k: int, widths=None):
    """The column blocks (start, stop) covering the first k neighbour ranks; ``widths(a, w)`` (optional) may widen
    the block starting at column a beyond its doubling width w."""
    a, w = 0, FIRST_BLOCK
    while a < k:
        b = min(a + (w if widths is None else max(w, widths(a, w))), k)
        yield a, b
        a, w = b, 2 * w


def _column(pf: Array, base: Array, yK: Array, nbf: Array, j: int, dense: Array | None, xp) -> Array:
    """p at the j-th neighbour of each active entry (m,) (flat entry base + code, yK = code * K); ``dense`` the rows
    (R, V) when every entry of them is active (one gather, the table's column as a shared index)."""
    if dense is not None:
        return xp.reshape(xp.take(dense, xp.take(nbf, yK[: dense.shape[1]] + j), axis=1), (-1,))
    S = GATHER_LIMIT   # slices of the entries bound the gathers' memory
    if base.shape[0] <= S:
        return xp.take(pf, base + xp.take(nbf, yK + j))
    return xp.concat([xp.take(pf, base[s:s + S] + xp.take(nbf, yK[s:s + S] + j)) for s in range(0, base.shape[0], S)])


def prefix_mass_at(pf: Array, e: Array, nb: Array, thr, k: int, V: int, dense: Array | None = None, *,
                   sum_dtype=None) -> Array:
    """LANTERN's admitted neighbour mass (section 6) at flat entries: (m,) for e (m,) ints = row * V + code into the
    flat rows ``pf`` (R V,), ``nb`` (V, >= k) int64 on pf's device (nearest first), ``thr`` a scalar (delta, LANTERN)
    or (m,) (the entries' (lam - 1) p(x), LANTERN++). The mass of the longest prefix of the code's k nearest
    neighbours whose cumulative target mass stays <= thr; 0 when the nearest already exceeds it. ``dense``: the rows
    (R, V) when e is every entry of them (``prefix_mass``: the first columns' gathers share the table's index).

    The one implementation: the drafted tokens' p~ (``Lantern.at``, O(k) per token at most) and the dense rows
    (``prefix_mass``, every code) both call it. The masses are added column by column in the rows' dtype (the same
    sums, in the same order, as numpy's cumulative sum over the (..., k) gather); an entry whose next sum exceeds
    its threshold keeps its last one (sums of non-negative masses never decrease, so the prefix is the longest).
    Entries whose prefix stopped leave after their block (``_blocks``) once the active set has shrunk enough; no item
    assignment (``_expand``): numpy, torch and JAX alike."""
    if dense is None and array_api_compat.is_numpy_array(pf) and e.shape[0] * k <= SMALL_BLOCK:
        return _prefix_mass_few(pf, e, nb, thr, k, V, sum_dtype)
    if TORCH_CPU_ON_NUMPY and _torch_cpu(pf, nb, thr):
        return _on_numpy(pf, e, nb, thr, k, V, dense)
    xp = namespace(pf)
    scalar = getattr(thr, "ndim", 0) == 0
    K = nb.shape[1]
    nbf = xp.reshape(nb, (-1,))
    y = e % V
    base, yK, ta = e - y, y * K, thr
    acc, adaptive = _sum_dtype(pf, xp)
    acc = acc if sum_dtype is None else sum_dtype          # (``_on_numpy``: float64 sums of float32 rows)
    c = xp.zeros(e.shape, dtype=acc, device=array_api_compat.device(pf))      # every entry passes 0 <= thr
    alive = None                                                                # None: every active entry alive
    levels = []
    widths = (lambda a, w: SMALL_BLOCK // max(c.shape[0], 1)) if adaptive else None
    for a, b in _blocks(k, widths):   # a loop over column blocks (about log2(k), one for few entries)
        if (c.shape[0] * (b - a) > COLUMNS_ABOVE) and array_api_compat.is_numpy_array(pf):
            for j in range(a, b):   # a loop over the block's neighbour ranks, each vectorised over the active entries
                cn = c + _column(pf, base, yK, nbf, j, None if levels else dense, xp)   # (no compaction yet: all)
                ok = cn <= ta
                if alive is not None:
                    ok = ok & alive
                c = xp.where(ok, cn, c)
                alive = ok
        else:                       # the block at once: one cumulative sum down its columns (the same sums)
            cols = xp.arange(a, b, device=array_api_compat.device(nbf))
            nbs = xp.reshape(xp.take(nbf, xp.reshape(cols[:, None] + yK[None, :], (-1,))), (b - a, -1))   # (w, m)
            g = xp.reshape(xp.take(pf, xp.reshape(nbs + base[None, :], (-1,))), (b - a, -1))
            cs = xp.cumulative_sum(xp.concat([c[None, :], xp.astype(g, acc)], axis=0), axis=0)[1:]   # (b - a, m)
            ok = cs <= (ta if scalar else ta[None, :])   # sums of masses >= 0 never decrease: ok is a prefix
            ok = ok if alive is None else ok & alive[None, :]
            last = xp.sum(xp.astype(ok, xp.int64), axis=0)                           # columns passed (a prefix)
            got = xp.take_along_axis(cs, xp.maximum(last - 1, xp.zeros_like(last))[None, :], axis=0)[0]
            c = xp.where(last > 0, got, c)
            alive = last == (b - a)
        if b >= k:                                  # the last block: no read-back
            break
        n = c.shape[0]
        left = int(xp.sum(xp.astype(alive, xp.int64)))
        if left == 0:
            break
        if left < COMPACT * n:                      # compact: the stopped entries leave (their mass kept for later)
            levels.append((alive, c))
            keep = xp.nonzero(alive)[0]
            c, base, yK = xp.take(c, keep), xp.take(base, keep), xp.take(yK, keep)
            if not scalar:
                ta = xp.take(ta, keep)
            alive = None
    for on, here in reversed(levels):   # back up the blocks: the entries that went on take their later mass
        c = expand_masked(c, on, here, xp)
    return xp.astype(c, pf.dtype, copy=False)


def _torch_cpu(*arrays) -> bool:
    """Whether every array (scalars aside) is a torch tensor on the CPU that autograd does not track, of a dtype numpy
    has (not bfloat16: those take the torch blocks)."""
    ts = [a for a in arrays if getattr(a, "ndim", 0) or array_api_compat.is_torch_array(a)]
    return all(array_api_compat.is_torch_array(a) and a.device.type == "cpu" and not a.requires_grad
               and str(a.dtype) != "torch.bfloat16" for a in ts)


def _on_numpy(pf, e, nb, thr, k: int, V: int, dense):
    """``prefix_mass_at`` of torch CPU tensors by the numpy code on numpy views of them, summing in float64 (module
    note: torch sums in float64, sequentially, and so does the numpy code given ``sum_dtype``: the same sums, then the
    same rounding to pf's dtype, so the same bits as the torch blocks; tests/test_lantern_fast.py), with no copy of
    the rows. numpy's column-by-column adds and single gathers cost a tenth of torch's blocks on the CPU (each a
    cumulative sum down an outer axis, with compactions)."""
    import numpy as np
    import torch

    view = lambda a: a.detach().numpy()                                        # noqa: E731 (CPU: shares memory)
    ta = float(thr) if getattr(thr, "ndim", 0) == 0 else view(thr)
    m = prefix_mass_at(view(pf), e.numpy(), nb.numpy(), ta, k, V, None if dense is None else view(dense),
                       sum_dtype=np.float64)
    return torch.from_numpy(np.ascontiguousarray(m))


def _prefix_mass_few(pf, e, nb, thr, k: int, V: int, sum_dtype=None):
    """``prefix_mass_at`` on numpy for few entries (m k <= SMALL_BLOCK) in plain numpy calls: the masses of the first
    FEW_FIRST neighbours (``_prefix_of``; most prefixes stop there), then the other columns for the entries that passed
    every one of them, carried on from their sums: the same sums in the same order as one block over k columns."""
    import numpy as np

    acc = pf.dtype if sum_dtype is None else sum_dtype
    w = k if k <= 2 * FEW_FIRST else FEW_FIRST
    if e.shape[0] == 1:                                          # one entry (a batch-1 walk's candidate)
        return _prefix_one(pf, int(e[0]), nb, thr, k, V, acc, w)
    y = e % V
    base = (e - y)[:, None]
    m, alive = _prefix_of(pf[base + nb[y, :w]], thr, acc, acc)
    if w < k and alive.any():
        i = np.flatnonzero(alive)
        m[i] = _prefix_of(pf[base[i] + nb[y[i], w:k]], thr if np.ndim(thr) == 0 else np.asarray(thr)[i], acc, acc,
                          carry=m[i])[0]
    return m.astype(pf.dtype, copy=False)


def _prefix_one(pf, e: int, nb, thr, k: int, V: int, acc, w: int):
    """``_prefix_mass_few`` of the one entry e (an int: row * V + code) on a 1-d cumulative sum: the first w
    neighbours' masses summed in ``acc``, and where every sum passed ``thr`` (a scalar or (1,)) all k of them from the
    start (the sum is sequential: its first w values are the same, and carried on from them, the rest are too); the
    same comparisons with thr as ``_prefix_of``'s, the last passing sum plus 0.0 (a -0.0 sum is +0.0), 0 where none
    passes. Returns (1,) in pf's dtype, bit for bit ``_prefix_mass_few``'s (tests/test_prefix_one.py)."""
    import numpy as np

    base = e - e % V
    row = nb[e % V]
    cs = np.cumsum(pf[base + row[:w]], dtype=acc)
    n = np.count_nonzero(cs <= thr)                               # the sums passed (a prefix: they never decrease)
    if n == w < k:
        cs = np.cumsum(pf[base + row[:k]], dtype=acc)
        n = np.count_nonzero(cs <= thr)
    m = cs[n - 1:n] + 0.0 if n else np.zeros(1, acc)
    return m.astype(pf.dtype, copy=False)


def _prefix_of(g, thr, acc, dtype, carry=None):
    """The admitted mass (m,) of neighbour masses g (m, w) numpy, nearest first, against ``thr`` (a scalar or (m,)):
    one cumulative sum in dtype ``acc`` from a leading ``carry`` (m,) (the mass admitted over earlier columns; None:
    0), the longest prefix whose sum is <= thr (sums of masses >= 0 never decrease), the carry when the first
    already exceeds it. Returns (mass (m,) in ``dtype``, alive (m,) bool: every column passed, so later columns may
    add more; continuing from mass in ``acc`` gives the same sums as one pass over all the columns)."""
    import numpy as np

    if carry is None:   # from zero: 0.0 + g_1 is g_1 but for a -0.0, whose sign alone may differ down the sums (a zero
        cs = np.cumsum(g, axis=1, dtype=acc)   # sum's): the + 0.0 below makes it +0.0, as from a zero
        c0 = np.zeros((), acc)
    else:
        c0 = np.asarray(carry, acc)
        cs = np.cumsum(np.concatenate([c0[:, None], g.astype(acc, copy=False)], axis=1), axis=1)[:, 1:]
    ta = thr if getattr(thr, "ndim", 0) == 0 else np.asarray(thr)[:, None]
    if carry is None and (whole := cs[:, -1] <= ta[:, 0] if np.ndim(ta) else cs[:, -1] <= ta).all():
        return (cs[:, -1] + 0.0).astype(dtype, copy=False), whole     # every column passed (the sums never decrease)
    last = np.count_nonzero(cs <= ta, axis=1)                                        # columns passed (a prefix)
    got = cs[np.arange(g.shape[0]), np.maximum(last - 1, 0)]
    if carry is None:
        got += 0.0
    return np.where(last > 0, got, c0).astype(dtype, copy=False), last == g.shape[1]


def prefix_rows(g, thr, dtype):
    """``_prefix_of`` (no carry, summed in ``dtype``; numpy): the admitted mass (m,) of neighbour masses g (m, w), nearest
    first, against ``thr`` (a scalar or (m,)), bit for bit, in fewer passes: an entry whose whole sum stays <= thr takes
    it (sums of masses >= 0 never decrease), the others go through ``_prefix_of``. The whole sums are the cumulative
    sum's last values, plus 0.0 (``_prefix_of`` adds from a zero: a -0.0 sum is +0.0): on few entries the cumulative
    sum itself; on many the sum down the columns of g's transpose, which numpy reduces along its outer axis one row
    after another (two columns or more; one column is reduced pairwise), the same additions in the same order, in one
    pass instead of a cumulative sum's (tests/test_lantern_walk.py pins it)."""
    import numpy as np

    g = g.astype(dtype, copy=False)
    if g.shape[0] < COLUMNS_LAID_OUT:
        tot = np.cumsum(g, axis=1)[:, -1] + np.zeros((), dtype)
    else:
        tot = np.add.reduce(np.ascontiguousarray(g.T), axis=0) + np.zeros((), dtype)
    whole = tot <= thr
    if whole.all():
        return tot
    rest = np.nonzero(~whole)[0]
    tot[rest] = _prefix_of(g[rest], thr if np.ndim(thr) == 0 else thr[rest], dtype, dtype)[0]
    return tot


@functools.lru_cache(maxsize=64)
def whole_slack(k: int, dtype) -> float | None:
    """The relative headroom of ``whole_bounds`` for k masses summed in ``dtype``: twice the error bounds, (k + 2) u
    of the dtype's unit roundoff u (a sum of k non-negative masses in any order, each addition rounded to nearest, lies
    within a factor (1 +- u)^(k-1) of the exact sum, subnormal sums being exact) and (k + 2) u64 of a float64 sum of
    k + 1 (any order: within (1 +- k u64)), with room for the float64 operations of the bounds; None when k u > 1e-2
    (the linear bounds would not hold)."""
    import numpy as np

    u = float(np.finfo(dtype).eps) / 2
    return None if k * u > 1e-2 else 2 * (k + 2) * (u + 2.0 ** -52)


def whole_bounds(total, last, slack: float, dtype):
    """Bounds (lo (m,), hi (m,) in ``dtype``; numpy) of the whole sum that ``prefix_rows`` takes of k non-negative
    masses (m, k) in ``dtype`` (its sums, whichever order they take), from ``total`` (m,) float64, a float64 sum of
    those k and one more mass ``last`` (m,), and ``slack = whole_slack(k, dtype)``: lo <= the sum <= hi (rounding
    to ``dtype`` is monotone, so the bounds hold after it). A NaN in ``total`` gives NaN bounds (no comparison with
    them holds)."""
    return (total * (1.0 - slack) - last).astype(dtype), (total * (1.0 + slack)).astype(dtype)


def prefix_mass(p: Array, nb: Array, thr, k: int) -> Array:
    """``prefix_mass_at`` at every code of rows p (..., V): (..., V). ``thr`` a scalar or (..., V).

    numpy rows with a scalar threshold (LANTERN's delta: most codes' k neighbours fit under it) and ``WHOLE_FIRST``:
    the whole sums of every code's k neighbours first, one sparse product (``neighbors.neighbor_sum``: sequential
    sums from 0 in the table's column order, the adds' order, so the same bits as the last of the prefix sums; plus
    0.0, as those start from +0.0), taken where they are <= thr (sums of masses >= 0 never decrease: every prefix
    passed), and ``prefix_mass_at`` of the other entries alone (an entry's value does not depend on the others)."""
    xp = namespace(p)
    V = p.shape[-1]
    if WHOLE_FIRST and getattr(thr, "ndim", 0) == 0 and array_api_compat.is_numpy_array(p) \
            and array_api_compat.is_numpy_array(nb) and p.size:
        import numpy as np

        from .neighbors import neighbor_sum

        pf = p.reshape(-1)
        S = neighbor_sum(pf.reshape(-1, V), np.ascontiguousarray(nb[:, :k]), np.ones((), bool)).reshape(-1) + 0.0
        rest = np.flatnonzero(~(S <= thr))
        if rest.size:
            S[rest] = prefix_mass_at(pf, rest, nb, thr, k, V)
        return S.astype(p.dtype, copy=False).reshape(p.shape)
    pf = xp.reshape(p, (-1,))
    e = xp.arange(pf.shape[0], device=array_api_compat.device(p))
    ta = thr if getattr(thr, "ndim", 0) == 0 else xp.reshape(xp.broadcast_to(thr, p.shape), (-1,))
    return xp.reshape(prefix_mass_at(pf, e, nb, ta, k, V, xp.reshape(p, (-1, V))), p.shape)
