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

import math
import sys
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np

from ..core.xp import (Array, divide_or_zero, gather, mark, namespace, normalize, positive_part, put_last,
                       ratio_min1, take_last)
from .neighbors import check_neighbors, lantern_neighbors, neighbor_matrix, neighbor_scatter, neighbor_sum
from . import lantern_effective as _le
from . import prefix_mass as _pm
from .prefix_mass import _prefix_of, prefix_mass, prefix_mass_at
from .lantern_at import decide_at as _decide_at, entries as _entries, host_table as _host_table
from .lantern_at import host_views as _host_views
from .resampling import point_residual

__all__ = ["Lantern", "LanternResample", "lantern_neighbors", "check_neighbors", "LANTERN_LAWS"]

LANTERN_LAWS = ("released", "renormalised")


def _table(neighbors, cols: int, device, xp) -> Array:
    """The table as int64 on ``device`` (no copy when it is already), of which the caller reads the first ``cols``
    columns: the whole table, not a column slice (a strided view would be copied by the gathers that read it)."""
    return xp.astype(xp.asarray(neighbors, device=device), xp.int64, copy=False)


def _check_table(neighbors, cols) -> None:
    """``check_neighbors`` on the first ``cols`` columns, those a rule reads (the whole table when it has fewer, or
    ``cols`` is not a count: the caller's range check then names the width). A sort of the read columns, not of
    the (V, V - 1) table the model builds (V log V per code, at every rule's construction)."""
    shape = getattr(neighbors, "shape", None)
    K = int(shape[-1]) if shape is not None and len(shape) == 2 else None
    ok = K is not None and isinstance(cols, (int, np.integer)) and 1 <= cols <= K
    check_neighbors(neighbors, "neighbors", int(cols) if ok else None)


_UNIFORM: dict = {}     # (lead shape, dtype, V) -> the uniform fallback (..., 1) of a released law on torch CPU rows


def _uniform(lead, dtype, V):
    """The uniform row's value 1 / V as a (*lead, 1) torch CPU tensor of numpy ``dtype`` (ones / V: the bits of a
    built row), made once per shape (``normalize`` only reads it)."""
    key = (tuple(lead), np.dtype(dtype), V)
    got = _UNIFORM.get(key)
    if got is None:
        if len(_UNIFORM) > 64:
            _UNIFORM.clear()
        got = _UNIFORM[key] = sys.modules["torch"].from_numpy(np.ones((*lead, 1), dtype) / V)
    return got


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
        _check_table(self.neighbors, self.k)
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

    def aggregated_at(self, p: Array, x: Array, *, sum_dtype=None) -> Array:
        """p~(x) (...,) at tokens x (...,) of rows p (..., V): the k neighbours of x only (``prefix_mass_at``;
        ``sum_dtype``: its masses' accumulator, the host calls on torch's views (``at``) sum in float64 as torch)."""
        self._check_rows(p)
        V = p.shape[-1]
        if isinstance(p, np.ndarray):   # numpy's own calls
            pf, e = _entries(p, x, np)
            px = pf[e]
            m = prefix_mass_at(pf, e, _host_table(self.neighbors), self._threshold(px), self.k, V, sum_dtype=sum_dtype)
            return (px + m).reshape(np.shape(x))
        xp = namespace(p)
        nb = _table(self.neighbors, self.k, array_api_compat.device(p), xp)
        pf, e = _entries(p, x, xp)
        px = xp.take(pf, e)
        m = prefix_mass_at(pf, e, nb, self._threshold(px), self.k, V, sum_dtype=sum_dtype)
        return xp.reshape(px + m, tuple(x.shape))

    def admits(self, p: Array) -> Array:
        """(..., V) bool: at least one neighbour of x is admitted, i.e. the nearest one passes the threshold
        (the release's test; true even when the admitted mass is 0)."""
        xp = namespace(p)
        self._check_rows(p)
        first = _table(self.neighbors, 1, array_api_compat.device(p), xp)[:, 0]
        return xp.take(p, first, axis=-1) <= self._threshold(p)

    def admits_at(self, p: Array, x: Array, first: Array | None = None) -> Array:
        """``admits`` at tokens x (...,) of rows p (..., V): (...,) bool, from x's nearest neighbour alone (``first``
        (...,): those neighbours, when the caller has read them from the table already)."""
        xp = namespace(p)
        self._check_rows(p)
        x = xp.astype(x, xp.int64)
        if first is None:    # the tokens' rows of the table, then their first column (a column view: copied whole)
            nb = _table(self.neighbors, 1, array_api_compat.device(p), xp)
            first = xp.reshape(xp.take(nb, xp.reshape(x, (-1,)), axis=0)[:, 0], x.shape)
        return gather(p, first, xp) <= self._threshold(gather(p, x, xp))

    memo_key = property(lambda self: ("lantern", id(self.neighbors), self.k, self.delta, self.lam),
                        doc="Equal keys: the same f on the same rows (f ignores i; ``theory.likelihood.chain._laws``).")

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        return ratio_min1(self.aggregated(p), q, xp)

    def at(self, p, q, i, x):
        """f(x) (...,) at tokens x (...,): min(1, p~(x) / q(x)) from x's k neighbours (``theory.rules.accept_at``)."""
        host = _host_views(p, q, x)
        if host is not None:    # torch CPU tensors: numpy's calls on their views, the same bits at a third of the cost
            hp, hq, hx = host
            f = ratio_min1(self.aggregated_at(hp, hx, sum_dtype=np.float64), gather(hq, hx, np), np)
            return sys.modules["torch"].from_numpy(f)
        xp = namespace(p, q)
        return ratio_min1(self.aggregated_at(p, x), gather(q, x, xp), xp)

    def decide_at(self, p, q, i, x, u, *, want=None, chain=False):
        """The decisions u < f(x) (...,) bool and f (...,) (NaN where the bounds decided, x's neighbours unread) at
        tokens x, uniforms u (...,): ``theory.rules.lantern_at.decide_at`` (the engine's chains, ``verify_chain``)."""
        return _decide_at(self, p, q, x, u, want=want, chain=chain)

    def sibling_cap(self, pc, left):
        """The bound (B, K) of ``sibling_mass``, its thresholds: (lam - 1) pc (relative) or delta left (absolute), in
        the rows' dtype; the admitted mass lies in [0, it] (a prefix sum <= it, or 0), bit for bit the same values."""
        return (self.lam - 1.0) * pc if self.lam is not None else self.delta * left

    def sibling_mass(self, pr, c, pc, rank_of, left, need=None):
        """The admitted neighbour mass (B, K) of a node's candidates tried in rank order under the point draft law,
        in the units of the node's row, numpy (``theory.rules.walks``' level walk): pr (B, V) the node's target row,
        c (B, K) its candidates, pc (B, K) their masses with repeats of an earlier candidate set to 0, rank_of (B, V)
        int the 1-based rank of each code's first listing among the node's candidates (0: none), left (B, K) the mass
        not yet rejected before each. Candidate j meets the residual pr with the earlier candidates zeroed, over
        left[j]: its neighbours' masses are pr's with those codes zeroed, its threshold (lam - 1) pc[j] (relative:
        the same in any units) or delta left[j] (absolute), and ``_prefix_of`` sums them as ``prefix_mass_at`` does
        (the first candidate's, where nothing is zeroed and left is the row itself, bit for bit). ``need`` (B, K) bool:
        those entries only (the others 0; each entry's bits do not depend on which others are computed)."""
        import numpy as np

        B, K = c.shape
        table = np.asarray(self.neighbors)
        alive = np.ones(B * K, bool) if need is None else np.reshape(need, (-1,)).copy()
        n = B * K if need is None else int(np.count_nonzero(alive))
        b, j = np.divmod(np.arange(B * K), K)                                    # entries (B K,): round, rank
        code, thr = np.reshape(c, (-1,)), np.reshape(self.sibling_cap(pc, left), (-1,))
        w = _pm.SIBLING_BLOCK if n * self.k > _pm.SMALL_BLOCK else self.k   # few entries: one pass (fewer numpy calls)
        mass, a = np.zeros(B * K, pr.dtype), 0
        V = pr.shape[-1]
        while a < self.k and alive.any():   # column blocks (doubling), as one pass would sum them
            on = np.nonzero(alive)[0]
            at = (b[on] * V)[:, None] + table[code[on], a:min(a + w, self.k)]         # (m, w) flat, nearest first
            g, r = pr.reshape(-1)[at], rank_of.reshape(-1)[at]
            g = np.where((r > 0) & (r <= j[on, None]), np.zeros((), g.dtype), g)        # earlier candidates: rejected
            mass[on], alive[on] = _prefix_of(g, thr[on], pr.dtype, pr.dtype, mass[on])  # carried from block to block
            a, w = a + w, 2 * w
        return mass.reshape(B, K)


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
        _check_table(self.neighbors, self.k + 1)
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
        lead = tuple(p.shape[:-1])
        if self.law == "released":   # a scatter of x's k+1 neighbours into the row: no (..., V) mask
            flat = tuple(x.shape) == lead and (q is None or tuple(q.shape) == tuple(p.shape))
            if flat and all(a is None or isinstance(a, np.ndarray) for a in (p, q, x)):    # numpy's own calls
                return normalize(self._released_kept_host(p, q, x), np.ones((*lead, 1), p.dtype) / V)
            host = _host_views(p, q, x) if flat else None
            if host is not None:     # torch CPU tensors: the kept masses by numpy's calls on their views (the same
                torch = sys.modules["torch"]   # bits: elementwise, gathers, a scatter), normalised by torch's own sum
                uniform = _uniform(lead, host[0].dtype, V)
                return normalize(torch.from_numpy(self._released_kept(*host, np)), uniform, xp, host=True)
        dev = array_api_compat.device(p)
        zero = xp.zeros((), dtype=p.dtype, device=dev)
        uniform = xp.ones((*lead, 1), dtype=p.dtype, device=dev) / V
        if self.law == "released":
            return normalize(self._released_kept(p, q, x, xp), uniform, xp)
        S = self._nb_mask(x, V, xp, dev) | mark(x[..., None], V, xp)
        if self.variant == "p":
            return normalize(xp.where(S, zero, p), uniform, xp)
        qn = normalize(xp.where(S, zero, q), xp.zeros_like(q), xp)
        return normalize(positive_part(p - qn, xp), p, xp)

    def _released_kept(self, p, q, x, xp):
        """The released law's row before its normalisation (..., V), for rejected tokens x (...,): O(V + k) per row."""
        if isinstance(p, np.ndarray) and tuple(np.shape(x)) == p.shape[:-1] and (q is None or q.shape == p.shape):
            return self._released_kept_host(p, q, x)
        nb = self._nb_rows(x, array_api_compat.device(p), xp)                          # (..., k+1)
        same = self.accept.neighbors is self.neighbors                                  # (x's nearest, read already)
        adm = self.accept.admits_at(p, x, nb[..., 0] if same else None)[..., None]      # (..., 1)
        if self.variant == "p":  # p with x, and N(x) if admitted, zeroed (x stands in for N(x) otherwise)
            idx = xp.concat([x[..., None], xp.where(adm, nb, x[..., None])], axis=-1)
            return put_last(p, idx, xp.zeros((), dtype=p.dtype, device=array_api_compat.device(p)), xp)
        # [p - q']_+, q' = q with N(x) zeroed if admitted: [p - q]_+ with [p - 0]_+ = [p]_+ put back at N(x)
        r = positive_part(p - q, xp)
        back = xp.where(adm, positive_part(take_last(p, nb, xp), xp), take_last(r, nb, xp))
        return put_last(r, nb, back, xp, copy=False)                                    # (r is ours)

    def _released_kept_host(self, p, q, x):
        """``_released_kept`` on numpy rows p (and q) (..., V), x (...,), by flat entries: the same gathers, the same
        elementwise operations and the same scatter (the rows' own calls, no index grids); one row (batch 1) on its
        scalars, N(x) a view of the table's row (the threshold compared as the arrays' entries are)."""
        V, R = p.shape[-1], math.prod(p.shape[:-1])
        x = np.reshape(x, (-1,)).astype(np.int64, copy=False)
        pf, table = np.reshape(p, (-1,)), _host_table(self.neighbors)
        other = None if self.accept.neighbors is self.neighbors else _host_table(self.accept.neighbors)
        if R == 1:
            xs = int(x[0])
            nb = table[xs, : self.k + 1]                                                # (k+1,) N(x), a view
            adm = pf[nb[0] if other is None else other[xs, 0]] <= self.accept._threshold(pf[xs])
            idx = nb if adm else nb[:0]                                                  # (``Lantern.admits_at``)
        else:
            nb = np.take(table, x, axis=0)[:, : self.k + 1]                             # (R, k+1) N(x)
            at = (np.arange(R) * V)[:, None]
            xs = at[:, 0] + x
            first = nb[:, 0] if other is None else np.take(other, x, axis=0)[:, 0]
            adm = pf[at[:, 0] + first] <= self.accept._threshold(pf[xs])               # ``Lantern.admits_at``
            idx = (at + nb)[adm] if not adm.all() else at + nb                            # the admitted rows' N(x)
        if self.variant == "p":  # p with x, and N(x) if admitted, zeroed
            out = np.array(p, copy=True, order="C")
            of = out.reshape(-1)
            of[xs] = 0
            of[idx] = 0
            return out
        r = np.ascontiguousarray(positive_part(p - q))                                # a new C-ordered row
        r.reshape(-1)[idx] = positive_part(pf[idx])                                    # [p - 0]_+ put back there
        return r

    def point(self, p, c, f_c):
        """``self(p, one-hot(c), f, c)`` (the point draft law), released laws (else None): "q": N(c) never lists c, so
        q' = one-hot(c), G = Norm([p - 1_c]_+) (``point_residual``); "p": the law given c, which does not read q
        (``_given``: p with c, and N(c) if admitted, zeroed; uniform if empty). The same bits."""
        if self.law != "released":
            return None
        xp = namespace(p)
        if self.variant == "q":
            uniform = xp.ones((*p.shape[:-1], 1), dtype=p.dtype, device=array_api_compat.device(p)) / p.shape[-1]
            return point_residual(p, c, 1.0, uniform)
        return self._given(p, None, xp.astype(c, xp.int64), xp)

    def __call__(self, p, q, f, rejected=None, memo=None):
        """G(.|rejected) (..., V), or with ``rejected=None`` the effective law sum_x w(x) G(.|x) / sum w, w = q (1 - f).
        ``memo``: a dict the caller keeps for these same rows (p, q): the released "q" law's r, d and d's neighbour
        sums, which do not depend on the rule's threshold, are kept there (``effective_at``'s entry; rules of one
        table and k share it: ``theory.likelihood.recorded.predict_rounds``)."""
        xp = namespace(p, q, f)
        if rejected is not None:
            return self._given(p, q, xp.astype(rejected, xp.int64), xp)
        w = q * (1 - f)                       # (..., V_x): mass of rejecting x
        tot = xp.sum(w, axis=-1, keepdims=True)
        mix = self._effective(p, q, w, xp, memo)
        empty = tot <= 0
        return xp.where(empty, p, mix / xp.where(empty, xp.ones_like(tot), tot))

    def _effective(self, p, q, w, xp, memo=None):
        """sum_x w(x) G(.|x) (..., V): the released laws ("q" and "p") by neighbour sums and their transpose (O(V k) per
        row, ``neighbor_sum`` / ``neighbor_scatter``); the renormalised ones vectorised over x with the (V_x, V_y)
        neighbour mask N."""
        V = p.shape[-1]
        dev = array_api_compat.device(p)

        def safe_div(a, Z):
            has = Z > 0
            return xp.where(has, a / xp.where(has, Z, xp.ones_like(Z)), xp.zeros_like(a)), has

        if self.law == "released" and self.variant == "q":
            # [p - q + adm(x) N(x,.) q]_+ = r + adm(x) N(x,.) (p - r), r = [p - q]_+: Z(x) = R + adm(x) d(N(x)),
            # the mixture r sum_x c(x) + d (c adm) N (sums of non-negative terms, as ``effective_at``)
            nb = _table(self.neighbors, self.k + 1, dev, xp)[:, : self.k + 1]
            adm = self.accept.admits(p)                                                     # (..., V_x) bool
            r, d, R, S = self._q_parts(p, q, nb, memo, xp)
            Z = R + xp.where(adm, S, xp.zeros_like(d))
            c, has = safe_div(w, Z)
            fallback = xp.sum(xp.where(has, xp.zeros_like(w), w), axis=-1, keepdims=True) / V
            return (r * xp.sum(c, axis=-1, keepdims=True) + d * neighbor_scatter(xp.where(adm, c, xp.zeros_like(c)), nb)
                    + fallback)
        if self.law == "released" and self.variant == "p" and (array_api_compat.is_numpy_array(p)
                                                                 or array_api_compat.is_torch_array(p)):
            # G(.|x) = p with x, and N(x) if adm(x), zeroed, over Z(x) (``lantern_effective.p_weights``):
            # sum_x w(x) G(.|x) = p T (+ the empty kept sets' uniform), T(y) = the sum of c over the x whose G keeps
            # y = C - c(y) - A(y), A = the transpose neighbour sum of c adm: O(V k) per row, no (V, V) mask. Where
            # that subtraction leaves less than 1e-3 of C, T(y) is the direct sum
            # (``lantern_effective.kept_where_cancelled``); Z likewise below 1e-3 of the row's mass: relative errors
            # below about (k + 2) 2^-53 / 1e-3 (tests/test_baselines.py: the brute-force mixture to 1e-12)
            nb = _table(self.neighbors, self.k + 1, dev, xp)[:, : self.k + 1]
            adm = self.accept.admits(p)                                                     # (..., V_x) bool
            c, empty_w = _le.p_weights(self.k, p, adm, nb, w, xp, 1e-3)
            C = xp.sum(c, axis=-1, keepdims=True)
            T = C - c - neighbor_scatter(xp.where(adm, c, xp.zeros_like(c)), nb)
            T = _le.kept_where_cancelled(c, xp.broadcast_to(adm, c.shape), nb, T, (p > 0) & (T < 1e-3 * C), xp)
            return p * T + empty_w[..., None] / V
        N = xp.astype(self._nb_mask(xp.arange(V, device=dev), V, xp, dev), p.dtype)   # (V_x, V_y)
        NT = xp.matrix_transpose(N)
        if self.law == "released":
            adm = xp.astype(self.accept.admits(p), p.dtype)                              # (..., V_x)
            if self.variant == "p":   # (other namespaces, no item assignment: the kept sets as (V, V) products,
                K0 = 1 - xp.eye(V, dtype=p.dtype, device=dev)                           # sums of non-negative terms)
                K1 = K0 - N                                                             # N has a zero diagonal
                Z = adm * (p @ xp.matrix_transpose(K1)) + (1 - adm) * (p @ K0)         # K0 is symmetric
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

    q_memo_key = property(lambda self: ("lantern-q", id(self.neighbors), self.k), doc="``_q_parts``' memo key")

    def _q_parts(self, p, q, nb, memo, xp):
        """The released "q" law's parts that depend on the rows and the table alone, not on the threshold: r = [p - q]_+,
        d = p - r, R = sum r (..., 1) and d's neighbour sums S (..., V); kept in ``memo`` (a dict for these same rows)
        under ("lantern-q", table, k), so every rule of one table and k forms them once per chunk of rows."""
        mk = self.q_memo_key
        got = None if memo is None else memo.get(mk)
        if got is None:
            r = positive_part(p - q, xp)
            d = p - r
            got = (r, d, xp.sum(r, axis=-1, keepdims=True), neighbor_sum(d, nb, xp.ones((), dtype=xp.bool)))
            if memo is not None:
                memo[mk] = got
        return got

    memo_ok = True      # __call__ and effective_at take memo= (effective_at w= too): ``theory.likelihood``

    def effective_at(self, p, q, f, x, memo=None, w=None):
        """G_eff(x) (...,) at one token x (...,) per row, for the released laws (None for "renormalised": use
        ``__call__``). Equal to ``gather(self(p, q, f), x)`` but without the (V, V) neighbourhood mask: O(V (k+1))
        per row at most (``neighbor_sum`` visits only the codes y a rejection can reach, w(y) > 0, with a
        neighbour admitted). p and x may have size-1 axes where q and f have more (``theory.likelihood`` passes
        p (n, 1, V), x (n, 1) and q, f (n, L, V): what depends on p and x alone is computed once for the L
        offsets). Sums of non-negative terms, except the "p" law's Z(y) = sum(p) - p(y) - adm(y) p(N(y)); where
        that subtraction leaves less than 1e-6 of the row's mass (cancellation) Z(y) is recomputed as the direct
        sum over the kept codes, and its zero test is exact (counts of positive entries), so the relative error
        stays below 1e-8. ``w``: q (1 - f) (q and f broadcast), when the caller has formed it."""
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
        w = q * (1 - f) if w is None else w                                           # rejection mass of y
        tot = xp.sum(w, axis=-1)
        if self.variant == "p":
            c, fallback = _le.p_weights(self.k, p, adm, nb, w, xp, 1e-6)
            kept = (~hit) & (xp.arange(V, device=dev) != x[..., None])                 # x survives G(.|y)
            mix = gather(p, x, xp) * xp.sum(xp.where(kept, c, xp.zeros_like(c)), axis=-1)
        else:
            r, d, R, S = self._q_parts(p, q, nb, memo, xp)
            # Z(y) = R + adm(y) d(N(y)) (sums of non-negatives); c = w / Z, 0 where Z = 0 (w(y) = 0 gives 0 either way)
            c, empty = divide_or_zero(w, R + xp.where(adm, S, xp.zeros_like(S)), xp)
            fallback = 0.0 if empty is None else xp.sum(xp.where(empty, w, xp.zeros_like(w)), axis=-1)
            xb = xp.broadcast_to(x, tot.shape)
            mix = gather(r, xb, xp) * xp.sum(c, axis=-1) \
                + gather(d, xb, xp) * xp.sum(xp.where(hit, c, xp.zeros_like(c)), axis=-1)
        mix = mix + fallback / V                                                      # uniform fallback
        has = tot > 0
        return xp.where(has, mix / xp.where(has, tot, xp.ones_like(tot)), gather(p, x, xp))

    def _given_dense(self, p, q, S, xp):
        """Renormalised "q" law for every x at once, S (V_x, V_y) bool -> (..., V_x, V_y)."""
        V = p.shape[-1]
        zero = xp.zeros((*p.shape[:-1], V, V), dtype=p.dtype, device=array_api_compat.device(p))
        qn = normalize(xp.where(S, zero, q[..., None, :] + zero), zero, xp)
        return normalize(positive_part(p[..., None, :] - qn, xp), p[..., None, :] + zero, xp)
