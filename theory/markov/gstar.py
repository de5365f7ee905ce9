"""G* confirmation (docs/theory.md sections 2, 6): minimise the bound B (T4) or the exact TV (T7) over
*all* resampling tables G (L, V, V) and compare with the closed form G* (T5).

Both objectives are || J vec(G) + b ||_1 with (J, b) exact (:func:`_g_affine`), so the global minimum is
an LP (HiGHS, :func:`_g_lp`), checked independently by projected gradient from random starts
(:func:`_g_projected_gradient`). For B the gap must vanish (Theorem 2(c)); for the exact TV G* need not
be optimal, and the gap is reported as found. Re-exported by ``theory.markov.optimize``. JAX (float64) is
imported on use, for the Jacobian of the exact-TV residuals only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..core import checks
from ..core.jaxtools import jax64 as _jax64
from ..core.xp import namespace
from . import tables as markov
from .sizes import EXACT_TV_LIMIT, check_exact_size as _check_exact_size, check_objective as _check_objective

__all__ = ["confirm_optimal_resampling", "ResamplingCheck"]


@dataclass
class ResamplingCheck:
    """Result of :func:`confirm_optimal_resampling`.

    closed_form: the objective with G* (T5); optimized: the smallest value found over all G (the exact
    LP optimum and every first-order start); gap = optimized - closed_form, which is ~0 when G* is
    optimal and clearly negative when some G beats G*; beaten = gap < -tol. lp: the LP optimum;
    per_start: the value reached by projected gradient from each random start."""
    objective: str
    closed_form: float
    optimized: float
    gap: float
    beaten: bool
    tol: float
    lp: float | None
    per_start: list[float]
    G: np.ndarray = field(repr=False)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "G"}


def _g_residual_exact_xp(P, Q, F, G, states):
    """The DP residuals a + d of markov.prefix_masses_xp, (S, V^L): TV given s = 1/2 sum |a + d| (T7). Affine in G."""
    xp = namespace(P, Q, F, G)
    a, d = markov.prefix_masses_xp(P, Q, F, G, states)
    return xp.reshape(a + d, (len(states), -1))


def _g_affine(P, Q, F, mu, objective):
    """(J, b) with objective(G) = || J vec(G) + b ||_1 exactly, J (m, L V V) (sparse for B).

    B (T3, T4, T9): r_{i,s,x} = w_i[s]/2 (A_i + (1 - beta_i) G_i - P)[s, x], w_i = mu^T A_1..A_{i-1};
    J is diagonal. Exact TV (T7): r = mu[s]/2 (a + d) from the DP, affine in G; J by JAX autodiff."""
    import scipy.sparse as sp

    L, V = F.shape[0], P.shape[0]
    A = Q * F
    beta = A.sum(-1)                                   # (L, V)
    if objective == "bound":
        w = np.empty((L, V))
        v = mu.copy()
        for i in range(L):
            w[i] = v
            v = v @ A[i]
        scale = np.broadcast_to((0.5 * w * (1 - beta))[..., None], (L, V, V)).ravel()
        J = sp.diags(scale).tocsr()
        b = np.broadcast_to(0.5 * w[..., None], (L, V, V)).ravel() * (A - P[None]).ravel()
        return J, b
    states = np.flatnonzero(mu > 0)
    with _jax64() as (jax, jnp):
        fn = lambda G: _g_residual_exact_xp(jnp.asarray(P), jnp.asarray(Q), jnp.asarray(F), G, states)  # noqa: E731
        G0 = jnp.zeros((L, V, V))
        b = np.asarray(fn(G0))                         # (S, N)
        J = np.asarray(jax.jacfwd(fn)(G0)).reshape(b.size, L * V * V)
    c = np.broadcast_to(0.5 * mu[states][:, None], b.shape).ravel()
    return sp.csr_matrix(c[:, None] * J), c * b.ravel()


def _project_simplex(Y: np.ndarray) -> np.ndarray:
    """Euclidean projection of every row of Y (..., V) onto the probability simplex (sort-based)."""
    V = Y.shape[-1]
    flat = Y.reshape(-1, V)
    U = -np.sort(-flat, axis=-1)
    css = np.cumsum(U, axis=-1) - 1.0
    k = np.arange(1, V + 1)
    cond = U - css / k > 0
    rho = V - 1 - np.argmax(cond[:, ::-1], axis=-1)   # last index where cond holds
    theta = css[np.arange(flat.shape[0]), rho] / (rho + 1)
    return np.maximum(flat - theta[:, None], 0.0).reshape(Y.shape)


def _g_lp(J, b, n_rows: int, V: int) -> np.ndarray:
    """min_g ||J g + b||_1 over rows of g on the simplex, as an LP (HiGHS): min sum t, -t <= J g + b <= t."""
    import scipy.sparse as sp
    from scipy.optimize import linprog

    m, n = J.shape
    I = sp.identity(m, format="csr")
    A_ub = sp.vstack([sp.hstack([J, -I]), sp.hstack([-J, -I])]).tocsr()
    b_ub = np.concatenate([-b, b])
    A_eq = sp.hstack([sp.kron(sp.identity(n_rows), np.ones((1, V))), sp.csr_matrix((n_rows, m))]).tocsr()
    cost = np.concatenate([np.zeros(n), np.ones(m)])
    bounds = [(0.0, 1.0)] * n + [(0.0, None)] * m
    res = linprog(cost, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=np.ones(n_rows), bounds=bounds, method="highs",
                  options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
    if res.status != 0:  # pragma: no cover - the LP is always feasible and bounded
        raise RuntimeError(f"LP for the optimal resampling failed: {res.message}")
    return _project_simplex(res.x[:n].reshape(n_rows, V))


def _g_projected_gradient(J, b, G0: np.ndarray, separable: bool, iters: int) -> np.ndarray:
    """Accelerated projected gradient (FISTA with adaptive restart) on sqrt((J g + b)^2 + eps^2),
    eps = 1e-1 ... 1e-10 (continuation), rows of g projected on the simplex after every step.
    Step 1/Lipschitz: per row when J is diagonal (B: the problem separates by row), else global."""
    n_rows, V = G0.shape
    if separable:
        jd = J.diagonal().reshape(n_rows, V)
        lip = np.max(jd * jd, axis=1, keepdims=True)     # per-row curvature bound times eps
    else:
        import scipy.sparse.linalg as spl
        lip = float(spl.svds(J, k=1, return_singular_vectors=False)[0] ** 2) if min(J.shape) > 1 else \
            float(np.abs(J.toarray()).max() ** 2)
    lip = np.where(lip > 0, lip, 1.0)
    g = G0.copy()
    for eps in 10.0 ** -np.arange(1, 11):
        step = eps / lip
        y, t, g_prev = g.copy(), 1.0, g.copy()
        f_prev = np.inf
        for _ in range(iters):
            r = J @ y.ravel() + b
            grad = (J.T @ (r / np.sqrt(r * r + eps * eps))).reshape(n_rows, V)
            g_new = _project_simplex(y - step * grad)
            rn = J @ g_new.ravel() + b
            f_new = float(np.sum(np.sqrt(rn * rn + eps * eps)))
            if f_new > f_prev:                           # adaptive restart (O'Donoghue & Candes)
                y, t = g.copy(), 1.0
                continue
            t_new = 0.5 * (1 + math.sqrt(1 + 4 * t * t))
            y = g_new + ((t - 1) / t_new) * (g_new - g)
            g_prev, g, t, f_prev = g, g_new, t_new, f_new
            if np.max(np.abs(g - g_prev)) < 1e-15:
                break
    return g


def confirm_optimal_resampling(P, Q, F, init, objective: str = "bound", n_starts: int = 3, seed: int = 0,
                               tol: float = 1e-7, iters: int = 400,
                               max_sequences: int = EXACT_TV_LIMIT) -> ResamplingCheck:
    """Minimise B (T4) or the exact TV (T7) over all resampling tables G (L, V, V) and compare with G* (T5).

    Both objectives are || J vec(G) + b ||_1 with J, b exact: for B by T3/T4 (J diagonal), for the exact
    TV because Phat is affine in G (T7), J obtained by JAX autodiff (float64) of the DP residuals. So
    (1) the global minimum is computed exactly as a linear programme (HiGHS), and (2) projected
    gradient with smoothing continuation is run from ``n_starts`` random G (Dirichlet rows) as an
    independent first-order check. Every candidate is re-evaluated with the numpy engine.
    For B the gap must be ~0 (Theorem 2(c)); for the exact TV G* need not be optimal: the gap is what it is.
    """
    objective = _check_objective(objective)
    P, Q = markov.check_chain(P, Q)
    V = P.shape[0]
    F = checks.acceptance_tables(F, V)
    L = F.shape[0]
    mu = markov.init_distribution(init, V)
    n_starts = checks.integer("n_starts", n_starts, lo=0)
    iters = checks.integer("iters", iters, lo=0)
    tol = checks.real("tol", tol, lo=0)
    seed = checks.seed(seed)
    if objective == "bound":
        exact = lambda G: markov.tv_bound(P, Q, F, G, mu)  # noqa: E731
    else:
        _check_exact_size(mu, V, L, max_sequences, jacobian=True)
        exact = lambda G: markov.exact_tv(P, Q, F, G, mu, max_sequences=max_sequences)  # noqa: E731
    closed = exact(markov.optimal_resampling(P, Q, F))
    J, b = _g_affine(P, Q, F, mu, objective)
    n_rows = L * V
    G_lp = _g_lp(J, b, n_rows, V).reshape(L, V, V)
    best_G, best = G_lp, exact(G_lp)
    lp_val = best
    rng = np.random.default_rng(seed)
    per_start = []
    for _ in range(int(n_starts)):
        G0 = rng.dirichlet(np.ones(V), size=n_rows)
        G = _g_projected_gradient(J, b, G0, objective == "bound", iters).reshape(L, V, V)
        val = exact(G)
        per_start.append(float(val))
        if val < best:
            best, best_G = val, G
    gap = float(best - closed)
    return ResamplingCheck(objective, float(closed), float(best), gap, gap < -tol, tol, float(lp_val),
                           per_start, best_G)
