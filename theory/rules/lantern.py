"""LANTERN / LANTERN++ (docs/theory.md section 6): latent-neighbourhood acceptance, the resampling laws
after a rejection (as released in jadohu/LANTERN, and our renormalised variant), and the neighbour table.

Array-API code (numpy, JAX, torch). Shapes: rows p, q (..., V); a neighbour table ``neighbors`` (V, K) of
ints, row x listing the other codes by increasing latent distance (the code itself excluded, as in the
release's table); rejected tokens (...,) ints.

Facts from the release (jadohu/LANTERN, ``models/ea_model_llamagen.py`` and
``entrypoints/generate_codebook.py``), re-implemented here:

* neighbour table: Euclidean distance between the raw codebook vectors (the VQ's embedding weights, no
  l2-normalisation), the code itself excluded, nearest first;
* acceptance: p~(x) = p(x) + the longest prefix of the k nearest neighbours whose cumulative mass is
  <= delta (delta <= 1, LANTERN) or <= (lambda - 1) p(x) (LANTERN++); accept x with prob. min(1, p~(x)/q(x)).
  "A neighbour was admitted" means the first neighbour passes the test, even when its mass is 0;
* after rejecting x on the static tree (LANTERN++, ``variant="q"``): q' = the current draft row (earlier
  rejected siblings removed and renormalised: the tree walk's q_j) with, only if a neighbour was admitted,
  the k+1 nearest neighbours of x zeroed WITHOUT renormalising (x itself kept); next residual
  Norm([p - q']_+), uniform if empty;
* after rejecting x on the dynamic path (LANTERN, ``variant="p"``): Norm(p with x zeroed and, only if a
  neighbour was admitted, its k+1 nearest neighbours zeroed), uniform if empty.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import array_api_compat

from ..core.xp import (Array, any_to, expand_masked, gather, mark, namespace, normalize, positive_part, put_last,
                       ratio_min1, take_last)
from .neighbors import check_neighbors, lantern_neighbors, neighbor_matrix, neighbor_sum
from .resampling import point_residual

__all__ = ["Lantern", "LanternResample", "lantern_neighbors", "check_neighbors", "LANTERN_LAWS"]

LANTERN_LAWS = ("released", "renormalised")


def _table(neighbors, cols: int, device, xp) -> Array:
    """The table as int64 on ``device`` (no copy when it is already), of which the caller reads the first ``cols``
    columns: the whole table, not a column slice (a strided view would be copied by the gathers that read it)."""
    return xp.astype(xp.asarray(neighbors, device=device), xp.int64, copy=False)


# A code's neighbour masses are summed over blocks of columns [0, w_0), [w_0, w_0 + w_1), ... (each at least twice the
# last, FIRST_BLOCK first): a block by one cumulative sum down its columns, or on a large numpy set column by column. The
# sums are sequential per entry and carried unrounded from block to block (numpy: in the rows' dtype, its cumulative sum
# is sequential; torch: in float64, as its CPU cumulative sum accumulates float32 anyway, and its outer-axis scan is
# sequential per entry on CUDA too), so any block layout gives the same bits: a block may then span every column left
# when it holds at most SMALL_BLOCK (entries x columns); the drafted tokens' masses come out of one gather and one
# cumulative sum, with no read-back. JAX and MPS (no float64) keep the doubling layout. An entry's value does not depend
# on which other entries are computed with it: the mass at the drafted tokens equals the dense row's bit for bit. After
# a block the entries whose prefix stopped leave the active set when it has shrunk by COMPACT, and the loop ends when
# none is left (one read-back per block but the last).
FIRST_BLOCK = 2
SMALL_BLOCK = 1 << 16     # (numpy's column-by-column threshold below: a widened block stays one cumulative sum)
COMPACT = 0.8
COLUMNS_ABOVE = 1 << 16     # numpy: a block of more (entries x columns) is added column by column (the same bits)
GATHER_LIMIT = 1 << 22
SIBLING_BLOCK = 16          # ``Lantern.sibling_mass``: the first block of columns when many entries (the rest: survivors)
TORCH_CPU_ON_NUMPY = True   # torch CPU tensors are summed by the numpy code (``_on_numpy``: the same bits, 10x faster)


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
    """Whether every array (scalars aside) is a torch tensor on the CPU that autograd does not track."""
    ts = [a for a in arrays if getattr(a, "ndim", 0) or array_api_compat.is_torch_array(a)]
    return all(array_api_compat.is_torch_array(a) and a.device.type == "cpu" and not a.requires_grad for a in ts)


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
    """``prefix_mass_at`` on numpy for few entries (m k <= SMALL_BLOCK): its single block in plain numpy calls (the
    table's rows, ``_prefix_of`` their masses): the same sums in the same order."""
    y = e % V
    return _prefix_of(pf[(e - y)[:, None] + nb[y, :k]], thr, pf.dtype if sum_dtype is None else sum_dtype, pf.dtype)[0]


def _prefix_of(g, thr, acc, dtype, carry=None):
    """The admitted mass (m,) of neighbour masses g (m, w) numpy, nearest first, against ``thr`` (a scalar or (m,)):
    one cumulative sum in dtype ``acc`` from a leading ``carry`` (m,) (the mass admitted over earlier columns; None:
    0), the longest prefix whose sum is <= thr (sums of masses >= 0 never decrease), the carry when the first
    already exceeds it. Returns (mass (m,) in ``dtype``, alive (m,) bool: every column passed, so later columns may
    add more; continuing from mass in ``acc`` gives the same sums as one pass over all the columns)."""
    import numpy as np

    c0 = np.zeros((g.shape[0], 1), acc) if carry is None else np.asarray(carry, acc)[:, None]
    cs = np.cumsum(np.concatenate([c0, g.astype(acc, copy=False)], axis=1), axis=1)[:, 1:]
    ta = thr if getattr(thr, "ndim", 0) == 0 else np.asarray(thr)[:, None]
    last = np.sum(cs <= ta, axis=1, dtype=np.int64)                                  # columns passed (a prefix)
    got = np.take_along_axis(cs, np.maximum(last - 1, 0)[:, None], axis=1)[:, 0]
    return np.where(last > 0, got, c0[:, 0]).astype(dtype, copy=False), last == g.shape[1]


def prefix_mass(p: Array, nb: Array, thr, k: int) -> Array:
    """``prefix_mass_at`` at every code of rows p (..., V): (..., V). ``thr`` a scalar or (..., V)."""
    xp = namespace(p)
    V = p.shape[-1]
    pf = xp.reshape(p, (-1,))
    e = xp.arange(pf.shape[0], device=array_api_compat.device(p))
    ta = thr if getattr(thr, "ndim", 0) == 0 else xp.reshape(xp.broadcast_to(thr, p.shape), (-1,))
    return xp.reshape(prefix_mass_at(pf, e, nb, ta, k, V, xp.reshape(p, (-1, V))), p.shape)


def _entries(p: Array, x: Array, xp):
    """Rows p (..., V) broadcast to tokens x (...,) and flattened, and the flat entries row * V + x: ((R V,), (R,))."""
    V = p.shape[-1]
    shape = tuple(x.shape)
    if tuple(p.shape[:-1]) != shape:
        p = xp.broadcast_to(p, (*shape, V))
    pf = xp.reshape(p, (-1,))
    R = pf.shape[0] // V
    e = xp.arange(R, device=array_api_compat.device(p)) * V + xp.reshape(xp.astype(x, xp.int64), (-1,))
    return pf, e


@dataclass(frozen=True, eq=False)
class Lantern:
    """LANTERN / LANTERN++ latent-neighbourhood acceptance (section 6; the release's formula).

    ``neighbors`` (V, K) ints (see ``check_neighbors``), K >= k. p~(x) = p(x) + mass(A), A the longest
    prefix of the k nearest neighbours whose cumulative target mass is <= delta (absolute, LANTERN) or
    <= (lam - 1) p(x) (relative, LANTERN++, lam >= 1; the LANTERN++ paper's text writes lam p(x), its
    release (lam - 1) p(x), which we follow); f(x) = min(1, p~(x)/q(x)).
    """
    neighbors: Any
    k: int
    delta: float | None = None
    lam: float | None = None

    def __post_init__(self):
        if (self.delta is None) == (self.lam is None):
            raise ValueError("Lantern: give exactly one of delta (absolute) or lam (relative)")
        if self.delta is not None and not (0 <= self.delta):
            raise ValueError(f"Lantern: delta must be >= 0, got {self.delta}")
        if self.lam is not None and not (self.lam >= 1):
            raise ValueError(f"Lantern: lam must be >= 1, got {self.lam}")
        check_neighbors(self.neighbors, "neighbors")
        K = self.neighbors.shape[-1]
        if not 1 <= self.k <= K:
            raise ValueError(f"Lantern: k must be in [1, {K}] (neighbour table width), got {self.k}")

    def _check_rows(self, p):
        if self.neighbors.shape[0] != p.shape[-1]:
            raise ValueError(f"Lantern: neighbour table has {self.neighbors.shape[0]} rows, rows p have V={p.shape[-1]}")

    def _threshold(self, p):
        """delta (a scalar), or (lam - 1) p (p's shape)."""
        return self.delta if self.delta is not None else (self.lam - 1.0) * p

    def aggregated(self, p: Array) -> Array:
        """p~ (..., V): each token's target mass plus its admitted neighbours' mass (``prefix_mass``, every code)."""
        xp = namespace(p)
        self._check_rows(p)
        nb = _table(self.neighbors, self.k, array_api_compat.device(p), xp)
        return p + prefix_mass(p, nb, self._threshold(p), self.k)

    def aggregated_at(self, p: Array, x: Array) -> Array:
        """p~(x) (...,) at tokens x (...,) of rows p (..., V): the k neighbours of x only (``prefix_mass_at``)."""
        xp = namespace(p)
        self._check_rows(p)
        V = p.shape[-1]
        nb = _table(self.neighbors, self.k, array_api_compat.device(p), xp)
        pf, e = _entries(p, x, xp)
        px = xp.take(pf, e)
        m = prefix_mass_at(pf, e, nb, self._threshold(px), self.k, V)
        return xp.reshape(px + m, tuple(x.shape))

    def admits(self, p: Array) -> Array:
        """(..., V) bool: at least one neighbour of x is admitted, i.e. the nearest one passes the threshold
        (the release's test; true even when the admitted mass is 0)."""
        xp = namespace(p)
        self._check_rows(p)
        first = _table(self.neighbors, 1, array_api_compat.device(p), xp)[:, 0]
        return xp.take(p, first, axis=-1) <= self._threshold(p)

    def admits_at(self, p: Array, x: Array) -> Array:
        """``admits`` at tokens x (...,) of rows p (..., V): (...,) bool, from x's nearest neighbour alone."""
        xp = namespace(p)
        self._check_rows(p)
        nb = _table(self.neighbors, 1, array_api_compat.device(p), xp)
        x = xp.astype(x, xp.int64)
        # the tokens' rows of the table, then their first column (a column view of the table would be copied whole)
        first = xp.reshape(xp.take(nb, xp.reshape(x, (-1,)), axis=0)[:, 0], x.shape)
        return gather(p, first, xp) <= self._threshold(gather(p, x, xp))

    memo_key = property(lambda self: ("lantern", id(self.neighbors), self.k, self.delta, self.lam),
                        doc="Equal keys: the same f on the same rows (f ignores i; ``theory.likelihood.chain._laws``).")

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        return ratio_min1(self.aggregated(p), q, xp)

    def at(self, p, q, i, x):
        """f(x) (...,) at tokens x (...,): min(1, p~(x) / q(x)) from x's k neighbours (``theory.rules.accept_at``)."""
        xp = namespace(p, q)
        return ratio_min1(self.aggregated_at(p, x), gather(q, x, xp), xp)

    def sibling_mass(self, pr, c, pc, rank_of, left):
        """The admitted neighbour mass (B, K) of a node's candidates tried in rank order under the point draft law,
        in the units of the node's row, numpy (``theory.rules.walks``' level walk): pr (B, V) the node's target row,
        c (B, K) its candidates, pc (B, K) their masses with repeats of an earlier candidate set to 0, rank_of (B, V)
        int the 1-based rank of each code's first listing among the node's candidates (0: none), left (B, K) the mass
        not yet rejected before each. Candidate j meets the residual pr with the earlier candidates zeroed, over
        left[j]: its neighbours' masses are pr's with those codes zeroed, its threshold (lam - 1) pc[j] (relative:
        the same in any units) or delta left[j] (absolute), and ``_prefix_of`` sums them as ``prefix_mass_at`` does
        (the first candidate's, where nothing is zeroed and left is the row itself, bit for bit)."""
        import numpy as np

        B, K = c.shape
        table = np.asarray(self.neighbors)
        b, j, code = np.repeat(np.arange(B), K), np.tile(np.arange(K), B), np.reshape(c, (-1,))   # entries (B K,)
        thr = np.reshape((self.lam - 1.0) * pc if self.lam is not None else self.delta * left, (-1,))
        w = SIBLING_BLOCK if B * K * self.k > SMALL_BLOCK else self.k   # few entries: one pass (fewer numpy calls)
        mass, alive, a = None, np.ones(B * K, bool), 0
        out = np.zeros(B * K, pr.dtype)
        while a < self.k and alive.any():   # column blocks (the first few, then the rest), as one pass would sum them
            on = np.nonzero(alive)[0]
            nb = table[code[on], a:min(a + w, self.k)]                                  # (m, w) nearest first
            g, r = pr[b[on, None], nb], rank_of[b[on, None], nb]
            g = np.where((r > 0) & (r <= j[on, None]), np.zeros((), g.dtype), g)        # earlier candidates: rejected
            m, more = _prefix_of(g, thr[on], pr.dtype, pr.dtype, None if mass is None else mass[on])
            mass = np.zeros(B * K, pr.dtype) if mass is None else mass
            mass[on], out[on] = m, m
            alive[on] = more
            a, w = a + w, self.k
        return out.reshape(B, K)


@dataclass(frozen=True, eq=False)
class LanternResample:
    """LANTERN's resampling after rejecting x (section 6). N(x) = the k+1 nearest neighbours of x.

    law "released" (default; needs ``accept``, the ``Lantern`` acceptance that decides whether a neighbour
    was admitted for x, adm(x)):
      variant "p" (LANTERN, dynamic path): Norm(p with x zeroed, and N(x) zeroed if adm(x)), uniform if empty;
      variant "q" (LANTERN++, static tree): q' = q with N(x) zeroed if adm(x), not renormalised (x kept);
                   Norm([p - q']_+), uniform if empty (unreachable: a rejection needs p~(x) < q(x)).
    law "renormalised" (our earlier variant), S(x) = {x} + N(x) always removed:
      variant "p": Norm(p with S(x) zeroed), uniform if empty;
      variant "q": q' = Norm(q with S(x) zeroed), then Norm([p - q']_+) (p where that residual is empty).
    With ``rejected=None`` the effective law over rejections is returned,
    G_eff = sum_x q(x) (1 - f(x)) G(.|x) / (1 - beta) (section 6), p where nothing is rejected. Those paths
    form a dense (V, V) neighbourhood mask (meant for the theory's and the recorded rows' moderate V); the
    renormalised "q" law also forms a (..., V, V) mixture (``dense_effective_law``).
    """
    neighbors: Any
    k: int
    variant: str = "p"
    law: str = "released"
    accept: Any = None

    def __post_init__(self):
        if self.variant not in ("p", "q"):
            raise ValueError(f"LanternResample: variant must be 'p' or 'q', got {self.variant!r}")
        if self.law not in LANTERN_LAWS:
            raise ValueError(f"LanternResample: law must be one of {LANTERN_LAWS}, got {self.law!r}")
        if not (isinstance(self.accept, Lantern) and self.accept.neighbors is self.neighbors):  # else checked there
            check_neighbors(self.neighbors, "neighbors")
        K = self.neighbors.shape[-1]
        if self.k + 1 > K:
            raise ValueError(f"LanternResample: needs k+1={self.k + 1} neighbours per token, table has {K}")
        if self.law == "released" and not isinstance(self.accept, Lantern):
            raise ValueError("LanternResample: the released law needs accept=Lantern(...) (it removes the neighbours "
                             "only when one was admitted); law='renormalised' always removes them")
        if self.accept is not None and tuple(self.accept.neighbors.shape)[0] != self.neighbors.shape[0]:
            raise ValueError("LanternResample: accept's neighbour table has a different number of codes")

    @property
    def dense_effective_law(self) -> bool:
        """True when the effective law (``rejected=None``) forms a (..., V, V) array (renormalised "q")."""
        return self.law == "renormalised" and self.variant == "q"

    reads_f = False     # given the rejected token, f is not read (``theory.rules.acceptance.reads_f``)

    def _nb_rows(self, x: Array, device, xp) -> Array:
        """N(x) (..., k+1) int64: the k+1 nearest neighbours of tokens x (...,) (x itself not listed)."""
        nb = _table(self.neighbors, self.k + 1, device, xp)
        # take on flat indices: a 0-d index would give torch's take a (1, K) result
        return xp.reshape(xp.take(nb, xp.reshape(x, (-1,)), axis=0)[:, : self.k + 1], (*x.shape, self.k + 1))

    def _nb_mask(self, x: Array, V: int, xp, device) -> Array:
        """(..., V) bool mask of N(x) (x itself not included) for tokens x (...): O(V + k) per token (``mark``)."""
        return mark(self._nb_rows(x, device, xp), V, xp)

    def _given(self, p, q, x, xp):
        """G(.|x) (..., V) for rejected tokens x (...,): O(V + k) per row (one scatter of x's neighbours, ``mark``);
        the uniform fallback broadcast from (..., 1), not built as a row."""
        V = p.shape[-1]
        dev = array_api_compat.device(p)
        zero = xp.zeros((), dtype=p.dtype, device=dev)
        uniform = xp.ones((*p.shape[:-1], 1), dtype=p.dtype, device=dev) / V
        if self.law == "released":   # a scatter of x's k+1 neighbours into the row: no (..., V) mask
            nb = self._nb_rows(x, dev, xp)                                         # (..., k+1)
            adm = self.accept.admits_at(p, x)[..., None]                           # (..., 1)
            if self.variant == "p":  # p with x, and N(x) if admitted, zeroed (x stands in for N(x) otherwise)
                idx = xp.concat([x[..., None], xp.where(adm, nb, x[..., None])], axis=-1)
                return normalize(put_last(p, idx, zero, xp), uniform, xp)
            # [p - q']_+, q' = q with N(x) zeroed if admitted: [p - q]_+ with [p - 0]_+ = [p]_+ put back at N(x)
            r = positive_part(p - q, xp)
            back = xp.where(adm, positive_part(take_last(p, nb, xp), xp), take_last(r, nb, xp))
            return normalize(put_last(r, nb, back, xp, copy=False), uniform, xp)       # (r is ours)
        S = self._nb_mask(x, V, xp, dev) | mark(x[..., None], V, xp)
        if self.variant == "p":
            return normalize(xp.where(S, zero, p), uniform, xp)
        qn = normalize(xp.where(S, zero, q), xp.zeros_like(q), xp)
        return normalize(positive_part(p - qn, xp), p, xp)

    def point(self, p, c, f_c):
        """``self(p, one-hot(c), f, c)`` on numpy rows (the point draft law), released laws (else None): "q": N(c)
        never lists c, so q' = one-hot(c), G = Norm([p - 1_c]_+) (``point_residual``); "p": p with c (and N(c) if
        admitted) zeroed in place of the masks, then the same Norm; uniform if empty. The same bits."""
        if self.law != "released":
            return None
        import numpy as np
        uniform = np.ones((*p.shape[:-1], 1), p.dtype) / p.shape[-1]
        if self.variant == "q":
            return point_residual(p, c, np.ones((), p.dtype), uniform)
        w, cf = np.array(p, copy=True).reshape(-1, p.shape[-1]), np.reshape(c, (-1,)).astype(np.int64)
        r = np.arange(w.shape[0])
        w[r, cf] = 0
        adm = np.reshape(self.accept.admits_at(p, c), (-1,))
        w[r[adm][:, None], np.asarray(self.neighbors)[cf[adm], : self.k + 1]] = 0
        return normalize(np.reshape(w, p.shape), uniform)

    def __call__(self, p, q, f, rejected=None):
        xp = namespace(p, q, f)
        if rejected is not None:
            return self._given(p, q, xp.astype(rejected, xp.int64), xp)
        w = q * (1 - f)                       # (..., V_x): mass of rejecting x
        tot = xp.sum(w, axis=-1, keepdims=True)
        mix = self._effective(p, q, w, xp)
        empty = tot <= 0
        return xp.where(empty, p, mix / xp.where(empty, xp.ones_like(tot), tot))

    def _effective(self, p, q, w, xp):
        """sum_x w(x) G(.|x) (..., V), vectorised over x with the (V_x, V_y) neighbour mask N."""
        V = p.shape[-1]
        dev = array_api_compat.device(p)
        N = xp.astype(self._nb_mask(xp.arange(V, device=dev), V, xp, dev), p.dtype)   # (V_x, V_y)
        NT = xp.matrix_transpose(N)

        def safe_div(a, Z):
            has = Z > 0
            return xp.where(has, a / xp.where(has, Z, xp.ones_like(Z)), xp.zeros_like(a)), has

        if self.law == "released":
            adm = xp.astype(self.accept.admits(p), p.dtype)                              # (..., V_x)
            if self.variant == "p":
                # kept set of x: all but x (K0), and also all but N(x) when adm(x) (K1); sums of
                # non-negative terms, so an empty kept set gives exactly Z = 0
                K0 = 1 - xp.eye(V, dtype=p.dtype, device=dev)
                K1 = K0 - N                                                                 # N has a zero diagonal
                Z = adm * (p @ xp.matrix_transpose(K1)) + (1 - adm) * (p @ K0)             # K0 is symmetric
                c, has = safe_div(w, Z)
                fallback = xp.sum(xp.where(has, xp.zeros_like(w), w), axis=-1, keepdims=True) / V
                return p * ((c * adm) @ K1 + (c * (1 - adm)) @ K0) + fallback
            # "q": [p - q + adm(x) N(x,.) q]_+ = r + adm(x) N(x,.) (p - r), r = [p - q]_+
            r = positive_part(p - q, xp)
            d = p - r
            R = xp.sum(r, axis=-1, keepdims=True)
            Z = R + adm * (d @ NT)                                                         # (..., V_x)
            c, has = safe_div(w, Z)
            fallback = xp.sum(xp.where(has, xp.zeros_like(w), w), axis=-1, keepdims=True) / V
            return r * xp.sum(c, axis=-1, keepdims=True) + d * ((c * adm) @ N) + fallback
        M = N + xp.eye(V, dtype=p.dtype, device=dev)                                       # S(x) = {x} + N(x)
        if self.variant == "p":
            keep = 1 - M
            Z = p @ xp.matrix_transpose(keep)                                              # (..., V_x)
            c, has = safe_div(w, Z)
            fallback = xp.sum(xp.where(has, xp.zeros_like(w), w), axis=-1, keepdims=True) / V
            return p * (c @ keep) + fallback
        return xp.sum(w[..., :, None] * self._given_dense(p, q, M > 0, xp), axis=-2)

    memo_ok = True      # effective_at takes memo= (``theory.likelihood.chain._laws``)

    def effective_at(self, p, q, f, x, memo=None):
        """G_eff(x) (...,) at one token x (...,) per row, for the released laws (None for "renormalised": use
        ``__call__``). Equal to ``gather(self(p, q, f), x)`` but without the (V, V) neighbourhood mask: O(V (k+1))
        per row at most (``neighbor_sum`` visits only the codes y a rejection can reach, w(y) > 0, with a
        neighbour admitted). p and x may have size-1 axes where q and f have more (``theory.likelihood`` passes
        p (n, 1, V), x (n, 1) and q, f (n, L, V): what depends on p and x alone is computed once for the L
        offsets). Sums of non-negative terms, except the "p" law's Z(y) = sum(p) - p(y) - adm(y) p(N(y)); where
        that subtraction leaves less than 1e-6 of the row's mass (cancellation) Z(y) is recomputed as the direct
        sum over the kept codes, and its zero test is exact (counts of positive entries), so the relative error
        stays below 1e-8."""
        if self.law != "released":
            return None
        xp = namespace(p, q, f)
        dev = array_api_compat.device(p)
        V = p.shape[-1]
        x = xp.astype(x, xp.int64)
        nb = _table(self.neighbors, self.k + 1, dev, xp)[:, : self.k + 1]             # (V, k+1)
        adm = self.accept.admits(p)                                                   # (..., V_y), p's shape
        N = neighbor_matrix(nb, V)                                                    # (V, V) bool, or None
        hit = (xp.any(nb == x[..., None, None], axis=-1) if N is None                 # x in N(y), removed
               else xp.reshape(xp.take(N, xp.reshape(x, (-1,)), axis=1).T, (*x.shape, V))) & adm   # N[y, x]
        _, q, f = xp.broadcast_arrays(p, q, f)
        w = q * (1 - f)                                                               # rejection mass of y
        tot = xp.sum(w, axis=-1)
        reach = w > 0                                                                 # y can be rejected
        if self.variant == "p":
            S = xp.sum(p, axis=-1, keepdims=True)
            Z = S - p - neighbor_sum(p, nb, adm)
            pos = xp.astype(p > 0, xp.int64)
            npos = xp.sum(pos, axis=-1, keepdims=True) - pos - neighbor_sum(pos, nb, adm)
            empty = npos == 0
            Z = self._exact_where_cancelled(p, adm, nb, Z, (~empty) & any_to(reach, p.shape, xp) & (Z < 1e-6 * S), xp)
            c = xp.where(empty, xp.zeros_like(w), w / xp.where(empty, xp.ones_like(Z), Z))
            kept = (~hit) & (xp.arange(V, device=dev) != x[..., None])                 # x survives G(.|y)
            mix = gather(p, x, xp) * xp.sum(xp.where(kept, c, xp.zeros_like(c)), axis=-1)
        else:
            mk = ("lantern-q", id(self.neighbors), self.k)   # r, d, d's neighbour sums: the rows' and table's alone,
            memo = {} if memo is None else memo              # once per chunk for every rule (``memo``, same rows)
            if mk not in memo:
                r = positive_part(p - q, xp)
                memo[mk] = (r, d := p - r, xp.sum(r, axis=-1, keepdims=True),
                            neighbor_sum(d, nb, xp.ones((), dtype=xp.bool)))
            r, d, R, S = memo[mk]
            # Z(y) = R + adm(y) d(N(y)) (sums of non-negatives), needed where w(y) > 0 only (c = w / Z)
            Z = R + xp.where(adm & reach, S, xp.zeros_like(S))
            empty = Z <= 0
            c = xp.where(empty, xp.zeros_like(w), w / xp.where(empty, xp.ones_like(Z), Z))
            xb = xp.broadcast_to(x, tot.shape)
            mix = gather(r, xb, xp) * xp.sum(c, axis=-1) \
                + gather(d, xb, xp) * xp.sum(xp.where(hit, c, xp.zeros_like(c)), axis=-1)
        mix = mix + xp.sum(xp.where(empty, w, xp.zeros_like(w)), axis=-1) / V           # uniform fallback
        has = tot > 0
        return xp.where(has, mix / xp.where(has, tot, xp.ones_like(tot)), gather(p, x, xp))

    def _exact_where_cancelled(self, p, adm, nb, Z, flag, xp):
        """Z (..., V_y) with the flagged entries replaced by the direct sum of p over the codes G(.|y) keeps
        (numpy / torch item assignment; chunks of flagged pairs bound the (m, k+1, V) mask)."""
        if not bool(xp.any(flag)):
            return Z
        V = p.shape[-1]
        dev = array_api_compat.device(p)
        pf, af, Zf = xp.reshape(p, (-1, V)), xp.reshape(adm, (-1, V)), xp.reshape(Z, (-1, V))
        rr, yy = xp.nonzero(xp.reshape(flag, (-1, V)))
        ar = xp.arange(V, device=dev)
        step = max(1, (1 << 24) // (V * (self.k + 1)))
        Zf = xp.asarray(Zf, copy=True)
        for s in range(0, rr.shape[0], step):   # a loop over chunks of the (rare) cancelled pairs
            r, y = rr[s:s + step], yy[s:s + step]
            drop = (ar == y[:, None]) | (af[r, y][:, None] & xp.any(xp.take(nb, y, axis=0)[:, :, None] == ar, axis=1))
            Zf[r, y] = xp.sum(xp.where(drop, xp.zeros_like(pf[r]), pf[r]), axis=-1)
        return xp.reshape(Zf, Z.shape)

    def _given_dense(self, p, q, S, xp):
        """Renormalised "q" law for every x at once, S (V_x, V_y) bool -> (..., V_x, V_y)."""
        V = p.shape[-1]
        zero = xp.zeros((*p.shape[:-1], V, V), dtype=p.dtype, device=array_api_compat.device(p))
        qn = normalize(xp.where(S, zero, q[..., None, :] + zero), zero, xp)
        return normalize(positive_part(p[..., None, :] - qn, xp), p[..., None, :] + zero, xp)
