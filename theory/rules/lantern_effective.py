"""LANTERN's released "p" law (theory.rules.lantern.LanternResample: the rejected code x, and its k + 1 nearest when one
was admitted, zeroed, renormalised) summed over the rejected codes without a (V, V) mask: the weights c = w / Z of the
codes a rejection reaches (``p_weights``, shared by the effective law and ``effective_at``), and the direct sums of
non-negative terms that replace a subtraction where it cancels (``exact_where_cancelled`` for Z, the mass G(.|x)
keeps; ``kept_where_cancelled`` for T(y), the weight of the codes whose G keeps y). docs/theory/lantern-gsd.md;
tests/test_lantern_effective.py. numpy and torch (item assignment).

Shapes: p (..., V) rows, adm (..., V) bool (the admissions, p's shape), nb (V, k + 1) int64 the neighbour table on
p's device, w (..., V) the rejection masses q (1 - f), broadcast with p."""
from __future__ import annotations

import sys

import array_api_compat

from ..core.xp import any_to
from .neighbors import neighbor_matrix, neighbor_sum

__all__ = ["p_weights", "kept_where_cancelled", "exact_where_cancelled"]

_this = sys.modules[__name__]       # (the helpers call each other through the module: tests replace them)


def p_weights(k: int, p, adm, nb, w, xp, tol: float):
    """The released "p" law's weights over the rejected codes y: (c (..., V_y), the empty codes' weight (...,)),
    c(y) = w(y) / Z(y), Z(y) = sum(p) - p(y) - adm(y) p(N(y)) the mass G(.|y) keeps, 0 where that kept set is
    empty (an exact test: counts of positive entries; G is uniform there, its weight returned apart). Where the
    subtraction leaves less than ``tol`` of the row's mass (cancellation), at codes a rejection reaches (w > 0), Z
    is the direct sum over the kept codes (``exact_where_cancelled``): Z's relative error stays below about
    (k + 2) 2^-53 / tol. p (..., V) and adm (p's shape); w (..., V) broadcast with p (``effective_at``: p (n, 1, V),
    w (n, L, V)). Shared by ``effective_at`` and the effective law (``_effective``)."""
    S = xp.sum(p, axis=-1, keepdims=True)
    Z = S - p - neighbor_sum(p, nb, adm)
    pos = xp.astype(p > 0, xp.int64)
    npos = xp.sum(pos, axis=-1, keepdims=True) - pos - neighbor_sum(pos, nb, adm)
    empty = npos == 0
    Z = _this.exact_where_cancelled(k, p, adm, nb, Z, (~empty) & any_to(w > 0, p.shape, xp) & (Z < tol * S), xp)
    c = xp.where(empty, xp.zeros_like(w), w / xp.where(empty, xp.ones_like(Z), Z))
    return c, xp.sum(xp.where(empty, w, xp.zeros_like(w)), axis=-1)


def kept_where_cancelled(c, adm, nb, T, flag, xp):
    """T (..., V_y) with the flagged entries replaced by the direct sum of c over the codes x whose G(.|x) keeps y
    (x != y, and y not in N(x) where adm(x)): sums of non-negative terms (numpy / torch item assignment; "y in N(x)"
    read from the (V, V) matrix on numpy tables of moderate V, else a (m, V, k+1) comparison, in chunks of flagged
    pairs)."""
    if not bool(xp.any(flag)):
        return T
    V = c.shape[-1]
    dev = array_api_compat.device(c)
    cf, af = xp.reshape(c, (-1, V)), xp.reshape(adm, (-1, V))
    rr, yy = xp.nonzero(xp.reshape(flag, (-1, V)))
    ar = xp.arange(V, device=dev)
    Tf = xp.asarray(xp.reshape(T, (-1, V)), copy=True)
    N = neighbor_matrix(nb, V)                                                      # (V_x, V_y) bool, or None
    host = array_api_compat.is_numpy_array(c)
    step = max(1, (1 << 24) // (V * (1 if N is not None else nb.shape[1])))
    for s in range(0, rr.shape[0], step):   # a loop over chunks of the (rare) cancelled pairs
        r, y = rr[s:s + step], yy[s:s + step]
        listed = (xp.take(N, y, axis=1).T if N is not None                          # (m, V_x): y in N(x)
                  else xp.any(nb[None, :, :] == y[:, None, None], axis=-1))
        drop = (ar[None, :] == y[:, None]) | (xp.take(af, r, axis=0) & listed)
        if host:                                                                    # (numpy: zeroed in place)
            vals = cf[r]
            vals[drop] = 0
            Tf[r, y] = vals.sum(-1)
        else:
            Tf[r, y] = xp.sum(xp.where(drop, xp.zeros_like(drop, dtype=cf.dtype), xp.take(cf, r, axis=0)),
                              axis=-1)
    return xp.reshape(Tf, T.shape)


def exact_where_cancelled(k: int, p, adm, nb, Z, flag, xp):
    """Z (..., V_y) with the flagged entries replaced by the direct sum of p over the codes G(.|y) keeps
    (numpy / torch item assignment; chunks of flagged pairs bound the (m, k+1, V) mask)."""
    if not bool(xp.any(flag)):
        return Z
    V = p.shape[-1]
    dev = array_api_compat.device(p)
    pf, af, Zf = xp.reshape(p, (-1, V)), xp.reshape(adm, (-1, V)), xp.reshape(Z, (-1, V))
    rr, yy = xp.nonzero(xp.reshape(flag, (-1, V)))
    ar = xp.arange(V, device=dev)
    step = max(1, (1 << 24) // (V * (k + 1)))
    Zf = xp.asarray(Zf, copy=True)
    for s in range(0, rr.shape[0], step):   # a loop over chunks of the (rare) cancelled pairs
        r, y = rr[s:s + step], yy[s:s + step]
        drop = (ar == y[:, None]) | (af[r, y][:, None] & xp.any(xp.take(nb, y, axis=0)[:, :, None] == ar, axis=1))
        Zf[r, y] = xp.sum(xp.where(drop, xp.zeros_like(pf[r]), pf[r]), axis=-1)
    return xp.reshape(Zf, Z.shape)
