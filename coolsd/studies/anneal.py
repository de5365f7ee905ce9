"""The annealing study behind ``coolsd theory anneal``: Proposition 2 at equal E[tau].

For every chain of a sweep (``study_chain``: peaked or near-uniform rows, equal or mixed row TVs, V, L, seeds)
and every target E[tau], the named schedules of ``theory.markov.optimize`` (Cool-SD's exponential, its floored
variant, linear, uniform, increasing) are tuned to the same E[tau] (T2, T8) with G* (T5), and their TV bound
B (T4) and exact TV (T7) are compared, inside and outside the paper's assumption TV(P, Q) <= 2/5; the summary
holds the win fractions. An experiment built on the exact theory (``theory.markov.optimize``, ``theory.markov``,
``theory.markov.chains``), not theory itself.
"""
from __future__ import annotations

import numpy as np

from theory.markov import chains
from theory import markov
from theory.markov.optimize import (EXACT_TV_LIMIT, STUDY_SCHEDULES, max_reachable, named_schedules, optimal_schedule,
                             scaled_tables_xp)

__all__ = ["ROW_KINDS", "TV_MODES", "PAPER_TV_ASSUMPTION", "study_chain", "anneal_study"]

ROW_KINDS = ("peaked", "ambiguous")
TV_MODES = ("equal", "mixed")
PAPER_TV_ASSUMPTION = 0.4         # Proposition 2 is proved for TV(P, Q) <= 2/5


def study_chain(kind: str, tv_mode: str, V: int, tv: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A chain of the sweep. kind: "peaked" (Dirichlet(0.3) rows) or "ambiguous" (near-uniform rows,
    spread 0.5). tv_mode: "equal" (TV(P(.|s), Q(.|s)) = tv in every row) or "mixed" (row TVs spread
    evenly over [tv/4, 7 tv/4] in random order, mean tv; capped at what each row can reach)."""
    rng = np.random.default_rng(seed)
    if kind == "peaked":
        P = chains.dirichlet_rows(V, 0.3, rng)
    elif kind == "ambiguous":
        P = chains.ambiguous_pair(V, spread=0.5, seed=rng)[0]
    else:
        raise ValueError(f"kind must be one of {ROW_KINDS}, got {kind!r}")
    if tv_mode == "equal":
        return P, chains.with_row_tv(P, min(tv, 0.999 * (1 - P.min(1)).min()), rng)
    if tv_mode != "mixed":
        raise ValueError(f"tv_mode must be one of {TV_MODES}, got {tv_mode!r}")
    levels = tv * (0.25 + 1.5 * rng.permutation(V) / max(V - 1, 1))
    Q = np.empty_like(P)
    for s in range(V):  # one row at a time: with_row_tv takes one TV level (V is small here)
        Q[s] = chains.with_row_tv(P[s:s + 1], min(levels[s], 0.999 * (1 - P[s].min())), rng)[0]
    return P, Q


EVALS_PER_TARGET = 60     # table evaluations per (case, target): root finding on each schedule's scale (rough)
EVALS_OPTIMIZE = 400      # more for the optimal schedule (SLSQP iterations x gradient evaluations; rough)


def check_cost(Vs, Ls, n_tvs: int, n_seeds: int, n_fractions: int, optimize: bool = True,
               max_seconds: float | None = None) -> tuple[str, float]:
    """Refuse (theory.core.checks.SizeError) before any work a study whose largest (V, L) tables exceed the memory
    budget or whose estimated time (``markov.tables_seconds`` x the evaluations per target above, an
    order-of-magnitude estimate) exceeds ``max_seconds``. Returns (estimate text, seconds)."""
    from theory.core import checks
    from theory import markov, rules

    v = rules.vanilla()
    per_eval = n_fractions * (len(STUDY_SCHEDULES) * EVALS_PER_TARGET + (EVALS_OPTIMIZE if optimize else 0))
    secs = sum(n_tvs * n_seeds * per_eval * markov.tables_seconds(v, V, L) for V in Vs for L in Ls)
    mem = max(markov.tables_bytes(v, V, L) for V in Vs for L in Ls)
    est = checks.check_cost(f"--Vs {max(Vs)} --Ls {max(Ls)}: the anneal study", mem, secs, checks.MAX_BYTES,
                            max_seconds, "use smaller --Vs / --Ls or fewer --tvs / --seeds (time: or raise --max-seconds)")
    return est, secs


def _wins(a: float, b: float, rel: float = 1e-9) -> bool:
    return a < b - rel * max(abs(b), 1e-300)


def _fractions(rows: list[dict], key: str) -> dict:
    """Win fractions of the decaying schedules at equal E[tau] for objective column prefix ``key``."""
    rows = [r for r in rows if r.get(f"{key}_uniform") is not None]
    n = len(rows)
    if n == 0:
        return {"n": 0}
    g = lambda s: np.array([r[f"{key}_{s}"] for r in rows])  # noqa: E731
    e, li, u, inc = g("exponential"), g("linear"), g("uniform"), g("increasing")
    w = np.vectorize(_wins)
    out = {
        "n": n,
        "exponential_beats_uniform": float(w(e, u).mean()),
        "exponential_beats_increasing": float(w(e, inc).mean()),
        "exponential_best_of_exp_uniform_increasing": float((w(e, u) & w(e, inc)).mean()),
        "linear_beats_uniform": float(w(li, u).mean()),
        "exponential_floor_beats_uniform": float(w(g("exponential_floor"), u).mean()),
        "uniform_beats_increasing": float(w(u, inc).mean()),
        "increasing_best_of_three": float((w(inc, u) & w(inc, e)).mean()),
        "median_exponential_over_uniform": float(np.median(e / np.where(u > 0, u, np.nan))),
    }
    opt = [r[f"{key}_optimal"] for r in rows if r.get(f"{key}_optimal") is not None]
    if opt:
        sel = [r for r in rows if r.get(f"{key}_optimal") is not None]
        mono = [r[f"{key}_optimal_non_increasing"] for r in sel]
        ex = np.array([r[f"{key}_exponential"] for r in sel])
        o = np.array(opt)
        out.update({"n_optimized": len(opt), "optimal_non_increasing": float(np.mean(mono)),
                    "median_exponential_excess_over_optimal": float(np.median(ex - o)),
                    "median_uniform_excess_over_optimal": float(np.median(np.array(
                        [r[f"{key}_uniform"] for r in sel]) - o))})
    return out


def anneal_study(tvs=(0.1, 0.25, 0.4, 0.55, 0.7), Vs=(4, 8, 24), Ls=(2, 4), seeds=(0, 1),
                 kinds=ROW_KINDS, tv_modes=TV_MODES, fractions=(0.25, 0.5, 0.75), optimize: bool = True,
                 optimize_max_V: int = 8, max_sequences: int = EXACT_TV_LIMIT, progress: bool = True) -> dict:
    """Proposition 2 at equal E[tau]: for every chain of the sweep and every target E[tau] (a fraction
    of the way from vanilla's E[tau] to the largest reachable), B (T4) and exact TV (T7, chains with
    V^(L+1) x V <= max_sequences) of the named schedules tuned to the target, with G*; with
    ``optimize``, the B- and exact-TV-optimal free weights (optimal_schedule, family "scaled") at the
    middle fraction for the first seed and V <= optimize_max_V.
    Start law: the stationary distribution of P. Returns {"cases": [...], "summary": {...}, "config": {...}}."""
    from tqdm import tqdm

    configs = [(k, m, V, L, tv, s) for k in kinds for m in tv_modes for V in Vs for L in Ls for tv in tvs
               for s in seeds]
    cases = []
    for kind, mode, V, L, tv, seed in tqdm(configs, desc="anneal", disable=not progress):
        P, Q = study_chain(kind, mode, V, tv, seed + 1000 * V + 100 * L)
        mu = chains.stationary(P)
        rtv = chains.row_tv(P, Q)
        e_van = float(markov.expected_accepted_xp(P, Q, scaled_tables_xp(P, Q, np.ones(L)), mu))
        e_max = max_reachable(P, Q, L, mu)
        for frac in fractions:
            target = e_van + frac * (e_max - e_van)
            row = {"kind": kind, "tv_mode": mode, "V": V, "L": L, "tv": tv, "seed": seed,
                   "mean_row_tv": float(mu @ rtv), "max_row_tv": float(rtv.max()),
                   "inside_assumption": bool(rtv.max() <= PAPER_TV_ASSUMPTION + 1e-12),
                   "fraction": frac, "target_accepted": target, "vanilla_accepted": e_van}
            named = named_schedules(P, Q, L, mu, target, STUDY_SCHEDULES, max_sequences)
            for name, r in named.items():
                row[f"bound_{name}"] = r["tv_bound"]
                row[f"exact_tv_{name}"] = r["exact_tv"]
                row[f"w1_{name}"] = float(r["weights"][0])
            if (optimize and V <= optimize_max_V and seed == seeds[0]
                    and frac == fractions[len(fractions) // 2]):
                for obj in ("bound", "exact_tv"):
                    if obj == "exact_tv" and row["exact_tv_uniform"] is None:
                        continue
                    res = optimal_schedule(P, Q, L, mu, target, obj, n_random=0, max_sequences=max_sequences)
                    row[f"{obj}_optimal"] = res.objective_value
                    row[f"{obj}_optimal_non_increasing"] = res.non_increasing
                    row[f"{obj}_optimal_weights"] = " ".join(f"{w:.4g}" for w in res.weights)
            cases.append(row)

    summary = {}
    for key in ("bound", "exact_tv"):
        summary[key] = {
            "all": _fractions(cases, key),
            "inside_tv_le_2/5": _fractions([r for r in cases if r["inside_assumption"]], key),
            "outside_tv_gt_2/5": _fractions([r for r in cases if not r["inside_assumption"]], key),
            **{f"{k}/{m}": _fractions([r for r in cases if r["kind"] == k and r["tv_mode"] == m], key)
               for k in kinds for m in tv_modes},
            **{f"L={L}": _fractions([r for r in cases if r["L"] == L], key) for L in Ls},
        }
    config = {"tvs": list(tvs), "Vs": list(Vs), "Ls": list(Ls), "seeds": list(seeds), "kinds": list(kinds),
              "tv_modes": list(tv_modes), "fractions": list(fractions), "optimize": optimize,
              "optimize_max_V": optimize_max_V, "max_sequences": max_sequences, "start": "stationary law of P",
              "schedules": {"exponential": "w_i = c exp(-0.7 (i-1)) (Cool-SD, nu = 0.7)",
                            "exponential_floor": "w_i = max(1, c exp(-0.7 (i-1))) (never stricter than vanilla)",
                            "linear": "w_i = c (L+1-i)/L", "uniform": "w_i = c",
                            "increasing": "w_i = c exp(+0.7 (i-1))"},
              "resampler": "G* (T5)", "paper_assumption": "max_s TV(P(.|s), Q(.|s)) <= 2/5"}
    return {"cases": cases, "summary": summary, "config": config}
