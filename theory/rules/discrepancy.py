"""The discrepancy of one draft position (T3, T6 of docs/theory.md): D = 1/2 || Q f + (1 - beta) G - P ||_1, the
one place it is computed (``theory.markov`` tables, ``theory.likelihood`` predictions from recorded rows, the
simulator). Array API, no checks (JAX traces these); rows broadcast to (..., V) -> (...,).
"""
from __future__ import annotations

import numpy as np

from ..core.xp import namespace, positive_part

__all__ = ["discrepancy", "optimal_discrepancy", "discrepancy_of", "optimal_discrepancy_of"]


def discrepancy_of(A, P, g, xp, work=None):
    """T3 from A = Q f already formed: 1/2 || A + (1 - beta) g - P ||_1 over the last axis, beta = sum A.
    ``work``: a numpy scratch array of the full broadcast shape to compute in place (the same operations
    in the same order, so bit for bit the same result), or None (array API: JAX traces this)."""
    beta = xp.sum(A, axis=-1, keepdims=True)
    if work is None:
        return 0.5 * xp.sum(xp.abs(A + (1 - beta) * g - P), axis=-1)
    np.multiply(1 - beta, g, out=work)
    np.add(A, work, out=work)
    np.subtract(work, P, out=work)
    return 0.5 * np.abs(work, out=work).sum(-1)


def optimal_discrepancy_of(A, P, xp):
    """T6 from A = Q f already formed: sum_x [A - P]_+ over the last axis."""
    return xp.sum(positive_part(A - P, xp), axis=-1)


def discrepancy(P, Q, f, g):
    """D(s) = 1/2 || Q f + (1 - beta) G - P ||_1 per state (T3), beta = sum_x Q f: the one place T3 is
    computed (bound_terms_xp, theory.recorded, theory.image and sim call it). Array API, no checks
    (traceable by JAX). P, Q, f, g broadcast to (..., V) rows -> (...,); e.g. (V, V) chain rows or
    (R, L, V) recorded rows."""
    xp = namespace(P, Q, f, g)
    A = Q * f
    if all(type(a) is np.ndarray for a in (A, P, g)):     # numpy: in one scratch row block (the same bits, half the time)
        return discrepancy_of(A, P, g, xp, work=np.empty(np.broadcast_shapes(A.shape, P.shape, np.shape(g)),
                                                          np.result_type(A, P, g)))
    return discrepancy_of(A, P, g, xp)


def optimal_discrepancy(P, Q, f):
    """D(s) with the optimal resampler G* (T6): sum_x [Q f - P]_+ (s, x), equal to discrepancy(P, Q, f, G*)
    in exact arithmetic (Theorem 2(c)) without forming G*. Array API, no checks; (..., V) rows -> (...,)."""
    xp = namespace(P, Q, f)
    return optimal_discrepancy_of(Q * f, P, xp)
