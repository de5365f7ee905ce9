"""Rule tables and objectives the optimisers differentiate (array API: numpy or JAX, traceable).

* :func:`scaled_tables_xp` / :func:`level_tables_xp` -- the acceptance tables F (L, V, V) of the "scaled"
  family f_i = min(1, w_i P/Q) and the "level" family f_i = v + a_i (1 - v) (section 5), built by the
  engine's own rules (``rules.Scaled``, ``rules.Level``), so an optimised schedule is literally the rule
  the engine runs; :func:`scaled_tables` adds G* (T5), checked, numpy.
* :func:`_bound_gstar_xp` -- B with the optimal resampler (T6, T9); :func:`exact_tv_xp` -- the exact TV
  (T7), optionally smoothed for gradients. Both on ``theory.markov``'s recursions.
Used by ``theory.markov.optimize`` (which re-exports the public names).
"""
from __future__ import annotations

import numpy as np

from .. import rules as _rules
from ..core.xp import namespace
from . import tables as markov

__all__ = ["scaled_tables", "scaled_tables_xp", "level_tables_xp", "exact_tv_xp"]


def _smooth_abs(x, eps, xp):
    """|x| (eps = 0) or the smooth sqrt(x^2 + eps^2) - eps, which is within eps of |x|."""
    return xp.sqrt(x * x + eps * eps) - eps


def _positions(L: int) -> np.ndarray:
    """Draft positions 1..L as an (L, 1) column, against rows (1, V, V): a rule called on (P[None], Q[None],
    _positions(L)) returns its (L, V, V) acceptance tables."""
    return np.arange(1, L + 1)[:, None]


def scaled_tables_xp(P, Q, w):
    """F_i[s, x] = min(1, w_i P[s, x] / Q[s, x]) (section 5), 1 where Q = 0. w: (L,) -> F (L, V, V).
    Built by the engine's own rule, ``rules.Scaled(rules.Vector(w))`` (traceable in w), so the schedule the
    optimiser finds is literally the rule the engine runs."""
    return _rules.Scaled(_rules.Vector(w))(P[None], Q[None], _positions(w.shape[0]))


def scaled_tables(P, Q, w) -> tuple[np.ndarray, np.ndarray]:
    """(F, G*) (L, V, V) of the scaled rule with explicit weights w (L,), numpy float64."""
    P, Q = markov.check_chain(P, Q)
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 1 or w.size < 1 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"weights must be a non-empty vector of finite values > 0, got {w}")
    F = scaled_tables_xp(P, Q, w)
    return F, _rules.Optimal()(P[None], Q[None], F)


def _bound_gstar_xp(P, Q, F, mu):
    """B with the optimal resampler, sum_i mu^T A_1..A_{i-1} d_i with d_i = sum_x [A_i - P]_+ (T6, T9):
    the sum of markov.bound_terms_optimal_xp, accumulated left to right (as before the terms were shared,
    so the optimiser sees bit-equal values; a pairwise sum could differ in the last bit for L >= 8)."""
    total = 0.0
    for t in markov.bound_terms_optimal_xp(P, Q, F, mu):   # L terms, summed left to right
        total = total + t
    return total


def exact_tv_xp(P, Q, F, G, states, weights, eps=0.0):
    """sum_s weights[s] TV(Phat(.|s), P(.|s)) over all V^(L+1) sequences (T7): markov.exact_tv without
    checks, on the same dynamic programme (markov.prefix_masses_xp), traceable by JAX.

    states: (S,) int start states (a numpy array: static under tracing); weights: (S,).
    eps > 0 replaces |x| by the smooth sqrt(x^2 + eps^2) - eps (for gradient-based optimisers)."""
    xp = namespace(P, Q, F, G)
    a, d = markov.prefix_masses_xp(P, Q, F, G, states)
    tvs = 0.5 * xp.sum(_smooth_abs(a + d, eps, xp), axis=(1, 2))
    return xp.sum(weights * tvs)


def level_tables_xp(P, Q, levels):
    """F (L, V, V) of the "level" family: f_i = v + a_i (1 - v) with v = min(1, P/Q) the vanilla rule,
    a_i in [0, 1] the chance of keeping a draft vanilla would reject (a = 0: vanilla, exact; a = 1:
    every draft accepted). Array API (numpy / JAX: differentiable in ``levels``)."""
    return _rules.Level(_rules.Vector(levels))(P[None], Q[None], _positions(levels.shape[0]))
