"""Synthetic target/draft Markov-chain pairs (P, Q), seeded, float64.

* :func:`random_pair`     -- random rows with a controllable TV(P, Q) (exact per row)
* :func:`ambiguous_pair`  -- near-uniform rows (many near-equal probabilities: the image-token case)
* :func:`iid_pair`        -- context-free pairs: every row equal (P(x|s) = p(x))
* :func:`stationary`      -- the stationary distribution of a chain
"""
from __future__ import annotations

import numpy as np

from ..core import checks

__all__ = ["random_pair", "ambiguous_pair", "iid_pair", "stationary", "row_tv", "dirichlet_rows", "with_row_tv"]


def _rng(seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or isinstance(seed, (int, np.integer, bool, np.bool_, float)):
        seed = checks.seed(seed)   # ints in [0, 2^64); bools and floats are refused
    return np.random.default_rng(seed)


def row_tv(P, Q) -> np.ndarray:
    """TV(P(.|s), Q(.|s)) for every state s (section 4 chains)."""
    return 0.5 * np.abs(np.asarray(P) - np.asarray(Q)).sum(-1)


def dirichlet_rows(V: int, concentration: float, seed=None, n_rows: int | None = None) -> np.ndarray:
    """(n_rows, V) rows drawn from a symmetric Dirichlet; small concentration = peaked rows."""
    V = checks.integer("V", V, lo=2)
    checks.real("concentration", concentration, 0, lo_open=True)
    if n_rows is not None:
        n_rows = checks.count("n_rows", n_rows)
    rng = _rng(seed)
    g = rng.gamma(concentration, size=(V if n_rows is None else n_rows, V))
    # gamma draws can all underflow to 0 for tiny concentrations; put such a row's mass on one token
    zero = g.sum(1) == 0
    g[zero, rng.integers(V, size=zero.sum())] = 1.0
    return g / g.sum(1, keepdims=True)


def with_row_tv(P: np.ndarray, tv: float, seed=None, concentration: float = 1.0) -> np.ndarray:
    """A draft Q with TV(P(.|s), Q(.|s)) = tv exactly in every row s.

    Q_s = (1 - t_s) P_s + t_s R_s with R_s a random row (or, where a random row is not far enough,
    the point mass on argmin P_s), and t_s = tv / TV(P_s, R_s) <= 1.
    """
    P, src = checks.float_array("P", P, ndim=2)
    checks.stochastic("P", P, src)
    tv = checks.real("tv", tv, 0)
    rng = _rng(seed)
    far = 1.0 - P.min(1)  # TV to the point mass on the least likely token: the largest reachable
    if not 0 <= tv <= far.min():
        raise ValueError(f"tv must be in [0, {far.min():.4f}] for these rows (the TV to a point mass on "
                         f"each row's least likely token), got {tv}")
    R = dirichlet_rows(P.shape[1], concentration, rng, n_rows=P.shape[0])
    d = row_tv(P, R)
    short = d < tv
    point = np.zeros_like(P)
    point[np.arange(P.shape[0]), P.argmin(1)] = 1.0
    R[short] = point[short]
    d = row_tv(P, R)
    t = np.where(d > 0, tv / np.where(d > 0, d, 1.0), 0.0)
    Q = (1 - t)[:, None] * P + t[:, None] * R
    return Q / Q.sum(1, keepdims=True)


def random_pair(V: int, tv: float = 0.3, seed=None, concentration: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Random order-1 chains (section 4) with TV(P(.|s), Q(.|s)) = tv in every row."""
    rng = _rng(seed)
    P = dirichlet_rows(V, concentration, rng)
    return P, with_row_tv(P, tv, rng, concentration)


def ambiguous_pair(V: int, spread: float = 0.3, tv: float | None = None, seed=None) -> tuple[np.ndarray, np.ndarray]:
    """Near-uniform rows: P(x|s) proportional to exp(spread * z) with z standard normal (small
    spread = many near-equal probabilities). Q is an independent draw of the same kind, or, with
    ``tv`` given, a mixture at that exact TV."""
    V = checks.integer("V", V, lo=2)
    checks.real("spread", spread, 0)
    rng = _rng(seed)

    def rows():
        z = np.exp(spread * rng.standard_normal((V, V)))
        return z / z.sum(1, keepdims=True)

    P = rows()
    return (P, rows()) if tv is None else (P, with_row_tv(P, tv, rng))


def iid_pair(V: int, tv: float = 0.3, seed=None, concentration: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Context-free pair (section 4 closed form applies): every row of P is p, every row of Q is q, TV(p, q) = tv."""
    rng = _rng(seed)
    p = dirichlet_rows(V, concentration, rng, n_rows=1)
    q = with_row_tv(p, tv, rng, concentration)
    return np.repeat(p, V, 0), np.repeat(q, V, 0)


def stationary(P) -> np.ndarray:
    """Stationary distribution (section 7 start law) pi = pi P of an irreducible chain (left eigenvector for eigenvalue 1)."""
    P = np.asarray(P, dtype=np.float64)
    w, vecs = np.linalg.eig(P.T)
    k = int(np.argmin(np.abs(w - 1)))
    pi = np.abs(np.real(vecs[:, k]))
    return pi / pi.sum()
