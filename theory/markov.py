"""Exact theory of one round of relaxed speculative decoding on order-1 Markov chains (section 4).

P, Q: (V, V) row-stochastic, P[s, x] = P(x | previous token s). Per-position tables
F (L, V, V) with F[i-1, s, x] = f_i(x | s) and G (L, V, V) with G[i-1, s, :] = G_i(. | s), the
(effective) resampling law. ``init`` is the start state (int) or a distribution over states (V,).

Public functions validate their input and compute in float64 numpy. The ``*_xp`` cores behind them
are array-API code with no checks, so they can be traced by JAX (the optimisers differentiate them).

Costs: E[tau] and B are O(L V^2) with vector-matrix products (T8, T9); the exact TV (T7) is a dynamic
programme over prefixes whose size is (number of start states) x V^L.
"""
from __future__ import annotations

import math

import numpy as np

from . import rules as _rules
from ._xp import Array, namespace

ROW_SUM_TOL = 1e-8          # |sum of a row - 1| allowed for P, Q and G rows
DEFAULT_MAX_SEQUENCES = 10**8

__all__ = [
    "expected_accepted", "acceptance_probs", "tv_bound", "bound_terms", "exact_tv", "exact_tv_per_state",
    "optimal_resampling", "rule_tables", "discrepancy", "sequence_laws", "check_chain", "init_distribution",
    "expected_accepted_xp", "bound_terms_xp", "ROW_SUM_TOL", "DEFAULT_MAX_SEQUENCES",
]


# --------------------------------------------------------------------------- validation

def _finite_nonneg(name: str, a: np.ndarray) -> None:
    if np.all(a >= 0) and np.isfinite(a.sum()):  # one fast pass; NaN fails `>= 0`, inf fails the sum
        return
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite entries")
    raise ValueError(f"{name} has negative entries (min {a.min():.3g})")


def _stochastic(name: str, a: np.ndarray) -> None:
    _finite_nonneg(name, a)
    sums = a.sum(-1)
    err = np.abs(sums - 1.0)
    if np.any(err > ROW_SUM_TOL):
        bad = np.unravel_index(np.argmax(err), err.shape)
        raise ValueError(f"{name} is not row-stochastic: row {tuple(int(b) for b in bad)} sums to "
                         f"{sums[bad]:.12g} (tolerance {ROW_SUM_TOL:g})")


def check_chain(P, Q) -> tuple[np.ndarray, np.ndarray]:
    """Validate a target/draft pair of V x V row-stochastic matrices (section 4); return float64 copies."""
    P = np.asarray(P, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    if P.ndim != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"P must be a square (V, V) matrix, got shape {P.shape}")
    if Q.shape != P.shape:
        raise ValueError(f"P and Q must have the same shape, got P {P.shape} and Q {Q.shape}")
    _stochastic("P", P)
    _stochastic("Q", Q)
    return P, Q


def init_distribution(init, V: int) -> np.ndarray:
    """Start distribution mu_0 (V,) of T8-T9 from a start state (int) or a distribution."""
    if isinstance(init, (bool, np.bool_)):
        raise ValueError(f"init must be a state (int) or a distribution, got the bool {init!r}")
    if isinstance(init, (int, np.integer)):
        if not 0 <= int(init) < V:
            raise ValueError(f"init state {int(init)} is out of range for V={V}")
        mu = np.zeros(V)
        mu[int(init)] = 1.0
        return mu
    mu = np.asarray(init, dtype=np.float64)
    if mu.shape != (V,):
        raise ValueError(f"init must be a state in [0, {V}) or a distribution of shape ({V},), got shape {mu.shape}")
    _stochastic("init", mu)
    return mu


def _check_F(F, V: int) -> np.ndarray:
    F = np.asarray(F, dtype=np.float64)
    if F.ndim != 3 or F.shape[1:] != (V, V):
        raise ValueError(f"F must have shape (L, {V}, {V}), got {F.shape}")
    if F.shape[0] < 1:
        raise ValueError("F must cover L >= 1 draft positions")
    if not np.all((F >= 0) & (F <= 1)):  # NaN fails both comparisons
        if not np.all(np.isfinite(F)):
            raise ValueError("F contains NaN or infinite entries")
        raise ValueError(f"acceptance probabilities F must lie in [0, 1]; found values in [{F.min():.6g}, {F.max():.6g}]")
    return F


def _check_G(G, F: np.ndarray) -> np.ndarray:
    G = np.asarray(G, dtype=np.float64)
    if G.shape != F.shape:
        raise ValueError(f"G must have the same shape as F {F.shape}, got {G.shape}")
    _stochastic("G", G)
    return G


# --------------------------------------------------------------------------- array-API cores

def acceptance_probs_xp(P, Q, F, mu):
    """Pr(tau >= i) for i = 1..L (T8): mu^T A_1 ... A_i 1 with A_i = Q * F_i, by vector-matrix products."""
    xp = namespace(P, Q, F, mu)
    out = []
    v = mu
    for i in range(F.shape[0]):  # loop over draft positions, each a (V,) @ (V, V) product
        v = v @ (Q * F[i])
        out.append(xp.sum(v))
    return xp.stack(out)


def expected_accepted_xp(P, Q, F, mu):
    """E[tau] = sum_i Pr(tau >= i)  (T2, T8)."""
    xp = namespace(P, Q, F, mu)
    return xp.sum(acceptance_probs_xp(P, Q, F, mu))


def discrepancy(P, Q, f, g):
    """D(s) = 1/2 || Q f + (1 - beta) G - P ||_1 per state (T3). f, g: (..., V, V) -> (..., V)."""
    xp = namespace(P, Q, f, g)
    A = Q * f
    beta = xp.sum(A, axis=-1, keepdims=True)
    return 0.5 * xp.sum(xp.abs(A + (1 - beta) * g - P), axis=-1)


def bound_terms_xp(P, Q, F, G, mu):
    """Per-position terms of B: mu^T A_1 ... A_{i-1} d_i  (T4, T9)."""
    xp = namespace(P, Q, F, G, mu)
    out = []
    v = mu
    for i in range(F.shape[0]):  # per position: (V, V) temporaries only, no (L, V, V) ones
        A = Q * F[i]
        beta = xp.sum(A, axis=-1, keepdims=True)
        d = 0.5 * xp.sum(xp.abs(A + (1 - beta) * G[i] - P), axis=-1)
        out.append(v @ d)
        v = v @ A
    return xp.stack(out)


# --------------------------------------------------------------------------- public API (contract)

def acceptance_probs(P, Q, F, init) -> np.ndarray:
    """Pr(tau >= i) for i = 1..L (T8), float64 (L,)."""
    P, Q = check_chain(P, Q)
    F = _check_F(F, P.shape[0])
    return acceptance_probs_xp(P, Q, F, init_distribution(init, P.shape[0]))


def expected_accepted(P, Q, F, init) -> float:
    """Expected number of accepted drafts E[tau] in one round (T2, T8). Tokens per target call = E[tau] + 1."""
    return float(acceptance_probs(P, Q, F, init).sum())


def bound_terms(P, Q, F, G, init) -> np.ndarray:
    """The L terms of the TV upper bound B (T4, T9), float64 (L,)."""
    P, Q = check_chain(P, Q)
    F = _check_F(F, P.shape[0])
    G = _check_G(G, F)
    return bound_terms_xp(P, Q, F, G, init_distribution(init, P.shape[0]))


def tv_bound(P, Q, F, G, init) -> float:
    """B >= TV(Phat, P): the upper bound of Theorem 2(b) (T3, T4, T9). It can exceed 1."""
    return float(bound_terms(P, Q, F, G, init).sum())


def optimal_resampling(P, Q, F) -> np.ndarray:
    """G*_i = Norm([P - Q F_i]_+) per position and state (T5); P where beta_i = 1. (L, V, V)."""
    P, Q = check_chain(P, Q)
    F = _check_F(F, P.shape[0])
    return _rules.Optimal()(P[None], Q[None], F)


def rule_tables(P, Q, L: int, verifier) -> tuple[np.ndarray, np.ndarray]:
    """(F, G) tables (L, V, V) of a verifier on this chain (section 4); G is the effective resampling law (section 6).

    ``expected_accepted(P, Q, *rule_tables(P, Q, L, v)[:1], init)`` and
    ``tv_bound(P, Q, *rule_tables(P, Q, L, v), init)`` are one line each.
    """
    if not isinstance(L, (int, np.integer)) or L < 1:
        raise ValueError(f"draft length L must be an integer >= 1, got {L!r}")
    P, Q = check_chain(P, Q)
    F, G = verifier.tables(P, Q, int(L))
    F = np.asarray(F, dtype=np.float64)
    G = np.asarray(G, dtype=np.float64)
    _check_F(F, P.shape[0])
    _check_G(G, F)
    return F, G


def _prefix_masses(P, Q, F, G, states, max_sequences):
    """For start states s, arrays over length-L prefixes x_{1:L} (flattened, last token last):
    a = Pr(all L drafts accepted and equal x_{1:L}), d = (mass of Phat that left the round by x_{1:L})
    - P(x_{1:L}). Then Phat(x_{1:L+1}) - P(x_{1:L+1}) = (d + a) P(x_{L+1} | x_L)  (from T7)."""
    L, V = F.shape[0], P.shape[0]
    n_seq = len(states) * V ** (L + 1)
    if n_seq > max_sequences:
        raise ValueError(f"exact TV needs {len(states)} start state(s) x V^(L+1) = {len(states)} x {V}^{L + 1} "
                         f"= {n_seq:.3g} sequences, above max_sequences={max_sequences:.3g}; "
                         "pass a larger max_sequences if you have the memory (about 16 bytes per "
                         "sequence / V)")
    A = Q * F                                   # (L, V, V)
    R = (1 - A.sum(-1, keepdims=True)) * G      # (L, V, V): reject at i, then draw from G_i
    a = A[0][states][:, None, :]                # (S, 1, V)
    d = (R[0] - P)[states][:, None, :]
    for i in range(1, L):  # loop over positions; each step is one broadcast product over all prefixes
        S, N, _ = a.shape
        d = (d[..., None] * P + a[..., None] * R[i]).reshape(S, N * V, V)
        a = (a[..., None] * A[i]).reshape(S, N * V, V)
    return a, d


def exact_tv_per_state(P, Q, F, G, init, max_sequences: int = DEFAULT_MAX_SEQUENCES):
    """TV(Phat(.|s), P(.|s)) over all V^(L+1) continuations, for each start state s with mu_0(s) > 0
    (T7). Returns (states, tvs)."""
    P, Q = check_chain(P, Q)
    F = _check_F(F, P.shape[0])
    G = _check_G(G, F)
    mu = init_distribution(init, P.shape[0])
    states = np.flatnonzero(mu > 0)
    a, d = _prefix_masses(P, Q, F, G, states, max_sequences)
    return states, 0.5 * np.abs(a + d).sum(axis=(1, 2))


def exact_tv(P, Q, F, G, init, max_sequences: int = DEFAULT_MAX_SEQUENCES) -> float:
    """Exact TV(Phat, P) over all V^(L+1) sequences x_{1:L+1} (T7), by dynamic programming over
    positions. With a start distribution, the TV given the start state is averaged over mu_0
    (the prefix is known to the decoder), which is what B bounds."""
    mu = init_distribution(init, np.asarray(P).shape[0])
    states, tvs = exact_tv_per_state(P, Q, F, G, init, max_sequences)
    return float(mu[states] @ tvs)


def sequence_laws(P, Q, F, G, init, max_sequences: int = 10**7) -> tuple[np.ndarray, np.ndarray]:
    """The laws of x_{1:L+1} (shape (V,)*(L+1)) under relaxed SD (Phat, T7) and under the target,
    mixed over the start distribution (what a simulator that draws s ~ mu_0 observes)."""
    P, Q = check_chain(P, Q)
    F = _check_F(F, P.shape[0])
    G = _check_G(G, F)
    mu = init_distribution(init, P.shape[0])
    states = np.flatnonzero(mu > 0)
    L, V = F.shape[0], P.shape[0]
    a, d = _prefix_masses(P, Q, F, G, states, max_sequences)
    ptrue = P[states][:, None, :]
    for _ in range(1, L):
        S, N, _ = ptrue.shape
        ptrue = (ptrue[..., None] * P).reshape(S, N * V, V)
    phat = (a + d + ptrue)[..., None] * P     # (S, V^(L-1), V, V)
    pt = ptrue[..., None] * P
    shape = (V,) * (L + 1)
    return (np.tensordot(mu[states], phat, axes=1).reshape(shape),
            np.tensordot(mu[states], pt, axes=1).reshape(shape))


def context_free_vanilla(p, q, L: int) -> float:
    """Closed form for i.i.d. (context-free) P, Q under vanilla SD (section 4):
    E[tau] = alpha (1 - alpha^L) / (1 - alpha), alpha = 1 - TV(p, q)."""
    alpha = float(np.minimum(np.asarray(p, float), np.asarray(q, float)).sum())
    if math.isclose(alpha, 1.0):
        return float(L)
    return alpha * (1 - alpha**L) / (1 - alpha)
