"""Schedule search over relaxed-SD acceptance rules on order-1 Markov chains (docs/theory.md sections 2, 5).

* :func:`optimal_schedule` -- the acceptance rule of a family (free per-position weights
  ``f_i = min(1, w_i P/Q)``, free levels, or free per-(position, state, token) tables) that minimises B
  or the exact TV subject to E[tau] = target (T2, T8), always with G* as the resampler; it also reports
  the named schedules (uniform, Cool-SD exponential nu = 0.7, linear, increasing) tuned to the same E[tau].
* :func:`tune_weights` -- the scale c with E[tau](c * shape) = target, by a bracketed root finder.
* :func:`pareto_curves` -- B and exact TV of the named (and optimal) schedules on a grid of E[tau].
Re-exported here so callers need one module: the G* confirmation :func:`confirm_optimal_resampling`
(``theory.markov.gstar``) and the traceable rule tables and objectives (``theory.markov.objectives``).
The annealing study built on these (``coolsd theory anneal``) is ``coolsd.studies.anneal``.

JAX is imported inside the functions that need gradients (``import theory`` works without it) and
every JAX computation runs under ``jax.enable_x64(True)`` (``theory.markov.sizes._jax64``) so it is float64
without touching the process-wide setting. Reported numbers are always recomputed with the numpy engine
(theory.markov).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq, minimize

from .. import rules as _rules
from ..core import checks
from ..core.jaxtools import jax64 as _jax64, jitted as _jitted
from ..core.xp import namespace
from . import tables as markov
from .sizes import EXACT_TV_LIMIT, check_exact_size as _check_exact_size, check_objective as _check_objective, exact_ok as _exact_ok
from .gstar import ResamplingCheck, confirm_optimal_resampling
from .objectives import _bound_gstar_xp, exact_tv_xp, level_tables_xp, scaled_tables, scaled_tables_xp

__all__ = [
    "confirm_optimal_resampling", "optimal_schedule", "tune_weights", "named_schedules", "schedule_shape",
    "scaled_tables", "scaled_tables_xp", "level_tables_xp", "exact_tv_xp", "max_reachable", "pareto_curves",
    "ResamplingCheck", "ScheduleResult", "NAMED_SCHEDULES", "STUDY_SCHEDULES", "EXACT_TV_LIMIT",
]

NAMED_SCHEDULES = ("uniform", "exponential", "linear", "increasing")
FLOORED = {"exponential_floor": "exponential"}   # extra study schedule: max(1, c exp(-nu (i-1)))
COOL_SD_NU = 0.7                 # the paper's decay rate
W_MIN = 1e-4                     # lower bound on weights during optimisation (w -> 0 means f -> 0)


# --------------------------------------------------------------------------- input checks

def _check_L(L) -> int:
    return checks.integer("draft length L", L, lo=1)



def max_reachable(P, Q, L: int, init) -> float:
    """sup of E[tau] over scaled acceptance min(1, w_i P/Q): every draft with P > 0 accepted.
    It equals L when P > 0 wherever Q > 0, and is attained for w_i >= max Q/P (see _saturation)."""
    P, Q = markov.check_chain(P, Q)
    L = _check_L(L)
    mu = markov.init_distribution(init, P.shape[0])
    F = np.where(Q > 0, (P > 0).astype(np.float64), 1.0)
    return float(markov.acceptance_probs_xp(P, Q, np.broadcast_to(F, (L, *F.shape)), mu).sum())


def _saturation(P, Q) -> float:
    """The weight above which min(1, w P/Q) = 1 wherever P > 0: max over P > 0 of Q/P (>= 1)."""
    m = (P > 0) & (Q > 0)
    return float(max(1.0, np.max(Q[m] / P[m]))) if m.any() else 1.0


def _check_target(target, L: int, e_max: float) -> float:
    t = checks.real("target_accepted", target)
    if t <= 0:
        raise ValueError(f"target_accepted must be > 0 (E[tau] > 0 for every w > 0), got {t}")
    if t > L:
        raise ValueError(f"target_accepted={t} is above the draft length L={L}: at most L drafts are accepted")
    if t > e_max * (1 + 1e-12):
        raise ValueError(f"target_accepted={t} is unreachable: the largest E[tau] with scaled acceptance is "
                         f"{e_max:.10g} (every draft with P > 0 accepted; drafts with P = 0 are always rejected)")
    return t


# --------------------------------------------------------------------------- root finding

def _expected(P, Q, F, mu) -> float:
    return float(markov.acceptance_probs_xp(P, Q, F, mu).sum())


def _solve_log_scale(E_of_logc, target: float, lo: float, hi: float, what: str) -> float:
    """log c with E_of_logc(log c) = target for a non-decreasing E, by brentq on a bracket [lo, hi]
    that is widened (doubling steps) until E(lo) <= target <= E(hi)."""
    g = lambda x: E_of_logc(x) - target  # noqa: E731
    step = 1.0
    for _ in range(200):
        if g(lo) <= 0:
            break
        lo -= step
        step *= 2
    else:
        raise ValueError(f"{what}: could not bracket target E[tau]={target} from below")
    step = 1.0
    for _ in range(200):
        if g(hi) >= 0:
            break
        hi += step
        step *= 2
    else:
        raise ValueError(f"{what}: target E[tau]={target} not reached; largest value {g(hi) + target:.10g}")
    glo, ghi = g(lo), g(hi)
    if glo == 0:
        return lo
    if ghi == 0:
        return hi
    return brentq(g, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)


def tune_weights(P, Q, shape, init, target_accepted, floor: float | None = None) -> np.ndarray:
    """w = c * shape (or max(floor, c * shape)) with E[tau](w) = target_accepted (T2, T8) for scaled
    acceptance min(1, w_i P/Q).

    E[tau] is continuous and non-decreasing in c, between 0 (c -> 0; E[tau](floor) with a floor) and
    max_reachable (c large), so a bracket in log c exists for every reachable target; brentq on log c
    finds it. Weights above the saturation level (f = 1 wherever P > 0) are clipped to it (same rule)."""
    P, Q = markov.check_chain(P, Q)
    shape = np.asarray(shape, dtype=np.float64)
    if shape.ndim != 1 or shape.size < 1 or not np.all(np.isfinite(shape)) or np.any(shape <= 0):
        raise ValueError(f"shape must be a non-empty vector of finite values > 0, got {shape}")
    L = shape.size
    mu = markov.init_distribution(init, P.shape[0])
    t = _check_target(target_accepted, L, max_reachable(P, Q, L, mu))
    w_sat = _saturation(P, Q)
    lo_w = 0.0
    if floor is not None:
        if not (math.isfinite(floor) and floor > 0):
            raise ValueError(f"floor must be finite and > 0, got {floor}")
        lo_w = float(floor)
        e_floor = _expected(P, Q, scaled_tables_xp(P, Q, np.full(L, lo_w)), mu)
        if t < e_floor:
            raise ValueError(f"target_accepted={t} is below E[tau]={e_floor:.10g} of the floor w_i = {floor}")
    wfun = lambda x: np.minimum(np.maximum(lo_w, np.exp(x) * shape), w_sat)  # noqa: E731
    E = lambda x: _expected(P, Q, scaled_tables_xp(P, Q, wfun(x)), mu)  # noqa: E731
    # E <= sum_i min(1, w_i) <= c sum(shape) without a floor, and E = E_max once c min(shape) >= w_sat
    lo = math.log(t / shape.sum()) - 1.0
    hi = math.log(w_sat / shape.min()) + 1e-9
    return wfun(_solve_log_scale(E, t, lo, hi, "tune_weights"))


def schedule_shape(name: str, L: int, nu: float = COOL_SD_NU) -> np.ndarray:
    """Unscaled weights of a named schedule (section 5), w_1 = 1:
    uniform 1; exponential (Cool-SD) exp(-nu (i-1)); linear (L+1-i)/L (decays to 1/L);
    increasing exp(+nu (i-1)) (the mirror image of Cool-SD, relaxation moved late)."""
    L = _check_L(L)
    i = np.arange(L, dtype=np.float64)
    if name == "uniform":
        return np.ones(L)
    if name == "exponential":
        return np.exp(-nu * i)
    if name == "linear":
        return (L - i) / L
    if name == "increasing":
        return np.exp(nu * i)
    raise ValueError(f"unknown schedule {name!r}; choose from {NAMED_SCHEDULES}")


def _evaluate(P, Q, F, mu, max_sequences) -> dict:
    """E[tau], B and exact TV (None above max_sequences) of tables F with G* (numpy engine)."""
    G = _rules.Optimal()(P[None], Q[None], F)
    pr = markov.acceptance_probs_xp(P, Q, F, mu)
    out = {"expected_accepted": float(pr.sum()), "tv_bound": float(markov.bound_terms_xp(P, Q, F, G, mu).sum()),
           "exact_tv": None, "acceptance_probs": pr}
    if _exact_ok(mu, P.shape[0], F.shape[0], max_sequences):
        states = np.flatnonzero(mu > 0)
        out["exact_tv"] = float(exact_tv_xp(P, Q, F, G, states, mu[states]))
    return out


def named_schedules(P, Q, L: int, init, target_accepted, names=NAMED_SCHEDULES,
                    max_sequences: int = EXACT_TV_LIMIT) -> dict[str, dict]:
    """Each named schedule tuned to E[tau] = target: {name: {weights, expected_accepted, tv_bound, exact_tv}}.
    Names: those of schedule_shape, and "exponential_floor" = max(1, c exp(-nu (i-1))) (never stricter
    than vanilla; needs target >= vanilla's E[tau])."""
    P, Q = markov.check_chain(P, Q)
    L = _check_L(L)
    mu = markov.init_distribution(init, P.shape[0])
    out = {}
    for name in names:
        if name in FLOORED:  # decaying, but never stricter than vanilla (w_i >= 1)
            w = tune_weights(P, Q, schedule_shape(FLOORED[name], L), mu, target_accepted, floor=1.0)
        else:
            w = tune_weights(P, Q, schedule_shape(name, L), mu, target_accepted)
        ev = _evaluate(P, Q, scaled_tables_xp(P, Q, w), mu, max_sequences)
        ev.pop("acceptance_probs")
        out[name] = {"weights": w, **ev}
    return out


# --------------------------------------------------------------------------- schedule optimisation

FAMILIES = ("scaled", "level", "table")
TABLE_MAX_VARIABLES = 1500       # L V^2 above which the table family (SLSQP, dense) is refused


@dataclass
class ScheduleResult:
    """Result of :func:`optimal_schedule` (all numbers recomputed with the numpy engine, G* resampling).

    weights: (L,) the optimal w_i of f_i = min(1, w_i P/Q) (family "scaled"; None for "level" and
    "table", whose rule is ``F``), clipped at the saturation level above which f_i = 1 wherever P > 0.
    levels: (L,) the optimal a_i of f_i = v + a_i (1 - v), v = min(1, P/Q) (family "level"; else None).
    acceptance_rates: Pr(tau >= i) / Pr(tau >= i-1), the chance of accepting draft i once reached.
    non_increasing: the weights (scaled), levels (level) or acceptance rates (table) are non-increasing in i, up to
    a relative 1e-3 (optima often sit at kinks, e.g. w_i = 1 exactly, which SLSQP meets only to ~1e-5).
    named: the named schedules tuned to the same E[tau]. source: the start that won
    ("uniform", "random0", ...; "named:<name>" when no optimised start beat a named schedule)."""
    objective: str
    family: str
    target_accepted: float
    weights: np.ndarray | None
    expected_accepted: float
    tv_bound: float
    exact_tv: float | None
    objective_value: float
    acceptance_rates: np.ndarray
    non_increasing: bool
    named: dict
    best_named: str
    source: str
    F: np.ndarray = field(repr=False)
    G: np.ndarray = field(repr=False)
    levels: np.ndarray | None = None

    def to_dict(self) -> dict:
        def plain(x):
            if isinstance(x, np.ndarray):
                return x.tolist()
            if isinstance(x, dict):
                return {k: plain(v) for k, v in x.items()}
            return x
        return {k: plain(v) for k, v in self.__dict__.items() if k not in ("F", "G")}


def _theta_tables(theta, P, Q, family):
    """Acceptance tables from optimisation variables: scaled (L,) log-weights, level (L,) logits of
    a_i, or table (L, V, V) logits."""
    xp = namespace(P, Q, theta)
    if family == "scaled":
        return scaled_tables_xp(P, Q, xp.exp(theta))
    if family == "level":
        return level_tables_xp(P, Q, 1.0 / (1.0 + xp.exp(-theta)))
    return 1.0 / (1.0 + xp.exp(-theta))


def _sched_objective(theta, P, Q, mu, states, family, objective):
    """B (T6, T9) or exact TV (T7) of the rule theta with G* (T5); states static (tuple)."""
    F = _theta_tables(theta, P, Q, family)
    if objective == "bound":
        return _bound_gstar_xp(P, Q, F, mu)
    G = _rules.Optimal()(P[None], Q[None], F)
    st = np.asarray(states, dtype=np.int64)
    return exact_tv_xp(P, Q, F, G, st, mu[st])


def _sched_expected(theta, P, Q, mu, family):
    return markov.expected_accepted_xp(P, Q, _theta_tables(theta, P, Q, family), mu)


def _monotone(x: np.ndarray, rel: float = 1e-6) -> bool:
    return bool(np.all(np.diff(x) <= rel * np.maximum(np.abs(x[:-1]), 1e-300)))


def _polish_table(P, Q, F, mu, target):
    """Scale a table to hit the target: F(c) = min(1, c F), E non-decreasing in c (bracketed brentq)."""
    E = lambda x: _expected(P, Q, np.minimum(1.0, np.exp(x) * F), mu)  # noqa: E731
    e_max = _expected(P, Q, np.where(F > 0, 1.0, 0.0), mu)
    if target > e_max * (1 + 1e-12):
        return None
    x = _solve_log_scale(E, target, -1.0, 1.0, "table polish")
    return np.minimum(1.0, np.exp(x) * F)


def _polish_levels(P, Q, theta, mu, target):
    """Shift the level logits, theta + c, so E[tau] = target (E non-decreasing in c; bracketed brentq)."""
    E = lambda c: _expected(P, Q, np.asarray(_theta_tables(theta + c, P, Q, "level")), mu)  # noqa: E731
    return theta + _solve_log_scale(E, target, -1.0, 1.0, "level polish")


def optimal_schedule(P, Q, L: int, init, target_accepted, objective: str = "bound", family: str = "scaled",
                     n_random: int = 2, seed: int = 0, max_sequences: int = EXACT_TV_LIMIT,
                     maxiter: int = 200) -> ScheduleResult:
    """The acceptance rule minimising B (T4) or the exact TV (T7) subject to E[tau] = target_accepted
    (T2, T8), with the optimal resampler G* (T5).

    family "scaled": f_i = min(1, w_i P/Q) with free weights w_1..w_L (section 5); "level": free
    per-position acceptance levels a_1..a_L in [0, 1], f_i = v + a_i (1 - v) with v the vanilla rule
    (targets from vanilla's E[tau] up to L; only its own optima are candidates, the named scaled
    schedules are reported for comparison); "table": free f_i(x | s) in [0, 1] per (position, state,
    token) (L V^2 variables: small V only).
    Method: SLSQP on log-weights (table: logits) with the equality constraint, JAX gradients (float64;
    the objectives are piecewise smooth, gradients exist almost everywhere), started from the named
    schedules tuned to the target (uniform, exponential nu = 0.7, linear, increasing) and ``n_random``
    random shapes (table family: from the scaled optimum and the tuned uniform rule); every end point
    is rescaled by a bracketed root finder so E[tau] = target to 1e-9, then re-evaluated exactly.
    The named schedules themselves are candidates, so the result is never worse than the best of them.
    """
    objective = _check_objective(objective)
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    P, Q = markov.check_chain(P, Q)
    L = _check_L(L)
    V = P.shape[0]
    mu = markov.init_distribution(init, V)
    target = _check_target(target_accepted, L, max_reachable(P, Q, L, mu))
    n_random = checks.integer("n_random", n_random, lo=0)
    maxiter = checks.integer("maxiter", maxiter, lo=1)
    seed = checks.seed(seed)
    if objective == "exact_tv":
        _check_exact_size(mu, V, L, max_sequences)
    if family == "table" and L * V * V > TABLE_MAX_VARIABLES:
        raise ValueError(f"family='table' optimises L V^2 = {L * V * V} acceptance probabilities, above "
                         f"{TABLE_MAX_VARIABLES}; it is meant for small V (use family='scaled')")
    if family == "level":
        e_van = _expected(P, Q, level_tables_xp(P, Q, np.zeros(L)), mu)
        if target < e_van * (1 - 1e-12):
            raise ValueError(f"family='level' cannot go below vanilla (a_i >= 0): target E[tau]={target:.6g} < "
                             f"vanilla's {e_van:.6g}; use family='scaled' (weights w_i < 1) for stricter rules")
    key = "tv_bound" if objective == "bound" else "exact_tv"
    named = named_schedules(P, Q, L, mu, target, max_sequences=max_sequences)
    best_named = min(named, key=lambda k: named[k][key])
    w_sat = _saturation(P, Q)

    # candidates: (objective value, source, F, weights or None)
    cands = [(named[k][key], f"named:{k}", scaled_tables_xp(P, Q, named[k]["weights"]), named[k]["weights"])
             for k in named] if family != "level" else []
    if family == "level":
        rng = np.random.default_rng(seed)
        shapes = {"constant": np.zeros(L), "decreasing": np.linspace(2.0, -2.0, L),
                  "increasing": np.linspace(-2.0, 2.0, L)}
        shapes.update({f"random{j}": rng.normal(0.0, 1.5, L) for j in range(int(n_random))})
        starts = {k: _polish_levels(P, Q, sh, mu, target) for k, sh in shapes.items()}
        bounds = [(-30.0, 30.0)] * L
        for k, th in starts.items():  # the tuned shapes themselves are candidates
            a = 1.0 / (1.0 + np.exp(-th))
            F0 = np.asarray(level_tables_xp(P, Q, a))
            cands.append((_evaluate(P, Q, F0, mu, max_sequences)[key], f"start:{k}", F0, a))
    elif family == "scaled":
        starts = {k: np.log(named[k]["weights"]) for k in NAMED_SCHEDULES}
        rng = np.random.default_rng(seed)
        for j in range(int(n_random)):
            shape = np.exp(rng.normal(0.0, 1.0, L))
            starts[f"random{j}"] = np.log(tune_weights(P, Q, shape, mu, target))
        bounds = [(math.log(W_MIN), math.log(w_sat))] * L
    else:
        inner = optimal_schedule(P, Q, L, mu, target, objective, "scaled", n_random, seed, max_sequences, maxiter)
        cands.append((inner.objective_value, f"scaled:{inner.source}", inner.F, None))
        clip = lambda F: np.clip(F, 1e-6, 1 - 1e-6)  # noqa: E731
        logit = lambda F: np.log(clip(F)) - np.log1p(-clip(F))  # noqa: E731
        starts = {"scaled-optimum": logit(inner.F),
                  "uniform": logit(scaled_tables_xp(P, Q, named["uniform"]["weights"]))}
        bounds = [(-30.0, 30.0)] * (L * V * V)
    states = tuple(int(s) for s in np.flatnonzero(mu > 0))

    with _jax64() as (jax, jnp):
        def both(theta, P, Q, mu, states, family, objective):
            f, gf = jax.value_and_grad(_sched_objective)(theta, P, Q, mu, states, family, objective)
            e, ge = jax.value_and_grad(_sched_expected)(theta, P, Q, mu, family)
            return f, gf, e, ge

        fboth = _jitted(f"sched_{family}_{objective}", lambda: jax.jit(both, static_argnums=(4, 5, 6)))
        Pj, Qj, muj = jnp.asarray(P), jnp.asarray(Q), jnp.asarray(mu)
        shp = starts[next(iter(starts))].shape
        memo: dict = {}

        def ev_at(x):  # one fused call per point: SLSQP asks for f, grad f, c and grad c at the same x
            k = x.tobytes()
            if k not in memo:
                memo.clear()
                f, gf, e, ge = fboth(jnp.asarray(x.reshape(shp)), Pj, Qj, muj, states, family, objective)
                memo[k] = (float(f), np.asarray(gf).ravel(), float(e) - target, np.asarray(ge).ravel())
            return memo[k]

        obj = lambda x: ev_at(x)[:2]  # noqa: E731
        con = lambda x: ev_at(x)[2]  # noqa: E731
        con_jac = lambda x: ev_at(x)[3]  # noqa: E731

        for name, x0 in starts.items():
            x0 = np.clip(x0.ravel(), [b[0] for b in bounds], [b[1] for b in bounds])
            res = minimize(obj, x0, jac=True, method="SLSQP", bounds=bounds,
                           constraints=[{"type": "eq", "fun": con, "jac": con_jac}],
                           options={"maxiter": maxiter, "ftol": 1e-12})
            x = res.x.reshape(shp)
            w = None
            if family == "scaled":
                w = tune_weights(P, Q, np.exp(x), mu, target)
                F = scaled_tables_xp(P, Q, w)
            elif family == "level":
                w = 1.0 / (1.0 + np.exp(-_polish_levels(P, Q, x, mu, target)))   # the levels a_i
                F = np.asarray(level_tables_xp(P, Q, w))
            else:
                F = _polish_table(P, Q, np.asarray(_theta_tables(x, P, Q, family)), mu, target)
                if F is None:
                    continue
            ev = _evaluate(P, Q, F, mu, max_sequences)
            if abs(ev["expected_accepted"] - target) <= 1e-7:
                cands.append((ev[key], name, F, w))

    _, source, F, weights = min(cands, key=lambda c: c[0])
    ev = _evaluate(P, Q, F, mu, max_sequences)
    pr = ev["acceptance_probs"]
    rates = pr / np.concatenate([[1.0], pr[:-1]]).clip(min=np.finfo(float).tiny)
    levels = None
    if family == "scaled":
        mono = _monotone(weights, 1e-3)
    elif family == "level":
        levels, weights = weights, None
        mono = bool(np.all(np.diff(levels) <= 1e-3 * np.maximum(levels[:-1], 1e-3)))
    else:
        weights, mono = None, _monotone(rates, 1e-3)
    G = _rules.Optimal()(P[None], Q[None], F)
    return ScheduleResult(objective, family, target, weights, ev["expected_accepted"], ev["tv_bound"],
                          ev["exact_tv"], float(ev[key]), rates, mono, named, best_named, source, F, G, levels)


# --------------------------------------------------------------------------- equal-E[tau] trade-off curves

STUDY_SCHEDULES = ("exponential", "exponential_floor", "linear", "uniform", "increasing")


def pareto_curves(P, Q, L: int, init, n_points: int = 12, lo: float = 0.05, hi: float = 0.95,
                  optimize: bool = True, names=STUDY_SCHEDULES, max_sequences: int = EXACT_TV_LIMIT) -> dict:
    """E[tau] on a grid from vanilla's value towards the largest reachable (fractions lo..hi) and, for
    every named schedule (and the optimal free weights), B and exact TV at each E[tau]."""
    P, Q = markov.check_chain(P, Q)
    L = _check_L(L)
    V = P.shape[0]
    mu = markov.init_distribution(init, V)
    Fv = np.broadcast_to(scaled_tables_xp(P, Q, np.ones(1))[0], (L, V, V))
    e_van = _expected(P, Q, Fv, mu)
    e_max = max_reachable(P, Q, L, mu)
    targets = e_van + np.linspace(lo, hi, n_points) * (e_max - e_van)
    curves = {"expected_accepted": targets.tolist(), "vanilla_accepted": e_van, "max_accepted": e_max}
    for name in names:
        rs = [named_schedules(P, Q, L, mu, t, (name,), max_sequences)[name] for t in targets]
        curves[name] = {"tv_bound": [r["tv_bound"] for r in rs], "exact_tv": [r["exact_tv"] for r in rs]}
    if optimize:
        for obj in ("bound", "exact_tv"):
            if obj == "exact_tv" and not _exact_ok(mu, V, L, max_sequences):
                continue
            rs = [optimal_schedule(P, Q, L, mu, t, obj, n_random=0, max_sequences=max_sequences) for t in targets]
            curves[f"optimal_{obj}"] = {"tv_bound": [r.tv_bound for r in rs], "exact_tv": [r.exact_tv for r in rs],
                                        "weights": [r.weights.tolist() for r in rs]}
    return curves
