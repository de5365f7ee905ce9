"""Resampling rules G_i (T1, T5, section 1 of docs/theory.md), written once against the array API.

A resampling rule is called as ``G = rule(p, q, f, rejected=None)`` and returns G (..., V), the law of the token
drawn after a rejection. Rules that depend on the rejected token (LANTERN's own resampler,
``theory.rules.lantern``) use ``rejected`` (...,) ints when given; with ``rejected=None`` they return the
effective law G_eff = sum_x q(x) (1 - f(x)) G(.|x) / (1 - beta) (section 6), which the theory (T3-T9) needs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.xp import _is_numpy, gather, namespace, normalize, positive_part, put_last
from .acceptance import Greedy

__all__ = ["Residual", "Optimal", "Target", "Argmax", "point_residual"]


def point_residual(p, c, m, fallback):
    """Norm([p - m 1_c]_+) (..., V) for rows p (..., V), tokens c (...,), m (...,) (or a scalar) the mass taken off c,
    ``fallback`` (..., V) or (..., 1) where the residual is empty: the residual of a rule whose draft row is the point
    mass at c (the point draft law, q = one-hot(c): Norm([p - q]_+) with m = 1, G* Norm([p - q f]_+) with m = f(c)).
    Every entry is [p(y) - 0]_+ = [p(y)]_+ but c's; the same sums and the same division as the dense formula, hence
    the same bits (tests/test_sparse_accept.py), in a handful of operations on the row (numpy: its own calls; other
    arrays: ``positive_part`` and a scatter, no one-hot row and no acceptance row). The walks call it through a
    resampling rule's ``point(p, c, f_c)``."""
    import numpy as np

    if not isinstance(p, np.ndarray):
        xp = namespace(p)
        c = xp.astype(c, xp.int64)
        m = xp.astype(m, p.dtype) if getattr(m, "ndim", 0) else m                   # (...,) f(c), or a number
        d = positive_part(gather(p, c, xp) - m, xp)
        w = put_last(positive_part(p, xp), c[..., None], d[..., None], xp, copy=False)   # (a new row: ours)
        return normalize(w, fallback, xp)
    m = np.asarray(m, p.dtype) if isinstance(m, (int, float)) else np.asarray(m)     # a Python number: p's dtype
    dt = np.result_type(p.dtype, m.dtype)
    V = p.shape[-1]
    w = np.where(p > 0, p, np.zeros((), p.dtype)).astype(dt, copy=False)     # a new C-ordered array (written below)
    at = np.arange(w.size // V) * V + np.reshape(np.asarray(c, np.int64), (-1,))   # c's flat entries, row by row
    d = np.reshape(p, (-1,))[at].astype(dt, copy=False) - np.reshape(np.broadcast_to(m.astype(dt), np.shape(c)), (-1,))
    np.reshape(w, (-1,))[at] = np.where(d > 0, d, np.zeros((), dt))
    return normalize(w, fallback)

# --------------------------------------------------------------------------- resampling rules

@dataclass(frozen=True)
class Residual:
    """Vanilla residual G^van = Norm([p - q]_+)  (T1); p itself where p = q."""
    reads_f = False     # f is not read (``theory.rules.acceptance.reads_f``)

    def __call__(self, p, q, f, rejected=None):
        # numpy rows: no namespace look-up (``normalize`` and ``positive_part`` take their numpy paths first; the
        # host walks and verdicts call this once per rejection)
        xp = None if _is_numpy(p) and _is_numpy(q) else namespace(p, q)
        return normalize(positive_part(p - q, xp), p, xp)

    def point(self, p, c, f_c):
        """``self(p, one-hot(c), f, c)`` (the point draft law): Norm([p - 1_c]_+) (``point_residual``)."""
        return point_residual(p, c, 1.0, p)


@dataclass(frozen=True)
class Optimal:
    """G* = Norm([p - q f]_+)  (T5). Zero residual mass means beta = 1: G is never used; return p."""

    def __call__(self, p, q, f, rejected=None, memo=None):
        xp = namespace(p, q, f)
        return normalize(positive_part(p - q * f, xp), p, xp)

    memo_ok = True      # __call__ and effective_at take memo= (effective_at w= too; both unread): ``theory.likelihood``

    def effective_at(self, p, q, f, x, memo=None, w=None):
        """G*(x) (...,) at tokens x (...,), p, q, f broadcast (..., V): [p(x) - q(x) f(x)]_+ / sum [p - q f]_+, and
        p(x) / sum p where that sum is 0 (``__call__``'s fallback, normalised): ``gather(self(p, q, f), x)`` over
        the row's sum, without forming the normalised row (the same residual and sum; one division at x)."""
        xp = namespace(p, q, f)
        s = xp.sum(positive_part(p - q * f, xp), axis=-1)                              # (...,)
        sp = xp.sum(p, axis=-1)                                                        # (p's own rows, once)
        p, q, f = xp.broadcast_arrays(p, q, f)                                         # (views: gathers at x)
        xb = xp.broadcast_to(x, s.shape)
        px = gather(p, xb, xp)
        num = positive_part(px - gather(q, xb, xp) * gather(f, xb, xp), xp)
        has = s > 0
        return xp.where(has, num / xp.where(has, s, xp.ones_like(s)), px / sp)

    def point(self, p, c, f_c):
        """``self(p, one-hot(c), f, c)`` (the point draft law): Norm([p - f(c) 1_c]_+), f_c (...,) the acceptance at c
        (``point_residual``)."""
        return point_residual(p, c, f_c, p)


@dataclass(frozen=True)
class Target:
    """Resample from the target row itself: G = p (a G_i of section 1; not optimal, T5)."""
    reads_f = False

    def __call__(self, p, q, f, rejected=None):
        return p


@dataclass(frozen=True)
class Argmax:
    """Greedy correction (a G_i of section 1): G = one-hot at argmax p."""
    reads_f = False

    def __call__(self, p, q, f, rejected=None):
        return Greedy()(p, q, 1)


