"""Acceptance schedules tuned to a model's recorded rounds (docs/theory.md section 8b; T10, T11).

One vanilla run's recorded rows (p, q, drafts per round; ``coolsd generate --record``) predict any rule's
accepted drafts (T10) and TV-bound term (T11) per round (``theory.likelihood.recorded.predict_rounds``). Here the
rule is searched: per-position weights w_1..w_L of the scaled rule f_i = min(1, w_i p/q) with G* (T5)
(``rules.Scaled``; families "free" (any w), "uniform" (w_i = c), "exponential" (w_i = c exp(-nu (i-1)),
nu free, either sign), "linear" (w_1 = c, w_L = c r)) or the levels a_i of the "level" rule
f_i = v + a_i (1 - v) (``rules.Level``). The predictions are computed by ``predict_rounds`` on the very
rule objects the engine runs (``rules.Vector`` holds the weights as a JAX array, so gradients flow
through them); nothing here re-writes an acceptance formula.

Two problems, over recorded rounds r = 1..R (chains, ``Rows``; or static trees, ``TreeRows``: weights per
tree depth, T10/T11 of ``theory.likelihood.recorded.predict_tree_rounds``; both row classes and ``load_rows`` live in
``theory.likelihood.recorded`` and are re-exported here):

* target: minimise  mean_r T11_r(w)  subject to  1 + mean_r T10_r(w) = tokens_per_call;
* budget: maximise  1 + mean_r T10_r(w)  subject to  mean_r T11_r(w) <= bound_budget.

"Tokens per call" here is 1 + the mean predicted accepted drafts per recorded (drafted) round: the
prediction does not model the end-of-image rounds that draft fewer tokens or the prefill round
(``coolsd.studies.demo.predict.chain_prediction`` adds those for the MNIST images). Method: SLSQP on the family's
parameters with JAX float64 gradients from several starts, every end point moved along the family's
scale (a monotone direction: T10 and T11 both grow with every w_i and every a_i) by a bracketed root
finder so that the constraint holds to 1e-9, then re-evaluated with numpy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq, minimize

from .. import rules
from ..core import checks
from .recorded import Rows, TreeRows, load_rows, predict_rounds, predict_tree_rounds

__all__ = ["FAMILIES", "Rows", "TreeRows", "load_rows", "family_values", "rule_of", "predict", "reachable", "tune",
           "frontier", "split_validation", "bootstrap", "TuneResult"]

FAMILIES = ("free", "level", "uniform", "exponential", "linear")
_SCALED = ("free", "uniform", "exponential", "linear")
LOGW = (-8.0, 8.0)        # log-weight box (w in [3e-4, 3e3]: f saturates long before the top on real rows)
LOGIT = (-30.0, 30.0)     # level logits
NU = (-4.0, 6.0)          # exponential decay rate
LOGR = (-6.0, 6.0)        # linear: log(w_L / w_1)
TOL = 1e-9                # the constraint is met to this accuracy after the polish


def _predict_parts(rows, verifier, s=slice(None)):
    """(accepted (R,), bound (R,)) of ``verifier`` on rounds ``s`` of chain or tree rows (T10, T11)."""
    if isinstance(rows, TreeRows):
        r = predict_tree_rounds(rows.p[s], rows.q[s], rows.tokens[s], rows.tree, verifier)
    else:
        r = predict_rounds(rows.p[s], rows.q[s], rows.drafts[s], verifier, n_drafted=rows.n_drafted[s])
    return r.accepted, r.bound


# --------------------------------------------------------------------------- families

def _check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return family


def n_params(family: str, L: int) -> int:
    return {"free": L, "level": L, "uniform": 1, "exponential": 2, "linear": 2}[_check_family(family)]


def _box(family: str, L: int) -> list[tuple[float, float]]:
    return {"free": [LOGW] * L, "level": [LOGIT] * L, "uniform": [LOGW], "exponential": [LOGW, NU],
            "linear": [LOGW, LOGR]}[family]


def family_values(family: str, theta, L: int, xp=np):
    """The family's per-position values (L,) from its parameters theta: weights w (scaled families) or levels a
    (level). free: w = exp(theta); uniform: exp(theta_0); exponential: exp(theta_0 - theta_1 (i-1));
    linear: exp(theta_0) (1 + (exp(theta_1) - 1) (i-1)/(L-1)); level: a = 1 / (1 + exp(-theta))."""
    i = xp.arange(L, dtype=theta.dtype) if hasattr(theta, "dtype") else np.arange(L, dtype=float)
    if family == "free":
        return xp.exp(theta)
    if family == "level":
        return 1.0 / (1.0 + xp.exp(-theta))
    if family == "uniform":
        return xp.exp(theta[0]) * xp.ones_like(i)
    if family == "exponential":
        return xp.exp(theta[0] - theta[1] * i)
    if family == "linear":
        frac = i / (L - 1) if L > 1 else 0.0 * i
        return xp.exp(theta[0]) * (1.0 + (xp.exp(theta[1]) - 1.0) * frac)
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def rule_of(family: str, values) -> rules.Verifier:
    """The verifier of per-position values (L,): ``rules.scaled`` (weights, G*) or ``rules.level`` (levels, G*).
    numpy values give ``Explicit`` schedules (what the engine runs); other arrays ``Vector`` (traceable)."""
    numeric = isinstance(values, (np.ndarray, list, tuple))
    if family == "level":
        return rules.level(np.asarray(values, np.float64) if numeric else rules.Vector(values))
    return rules.scaled(rules.Explicit(tuple(float(v) for v in values)) if numeric else rules.Vector(values))


def _shift(family: str, theta: np.ndarray, s: float) -> np.ndarray:
    """Move theta along the family's scale: every T10 and T11 term is non-decreasing in s."""
    t = np.array(theta, dtype=np.float64)
    if family in ("free", "level"):
        return t + s
    t[0] += s
    return t


# --------------------------------------------------------------------------- predictions

def predict(rows, verifier, chunk: int = 512) -> dict:
    """Per-round T10 and T11 of ``verifier`` on chain or tree rows (numpy, chunks of rounds): {"accepted": (R,),
    "bound": (R,), "tokens_per_call": 1 + mean accepted, "bound_mean", and their SEs over rounds}."""
    acc, bnd = [], []
    for a in range(0, rows.R, chunk):
        ac, bd = _predict_parts(rows, verifier, slice(a, a + chunk))
        acc.append(np.asarray(ac))
        bnd.append(np.asarray(bd))
    acc, bnd = np.concatenate(acc), np.concatenate(bnd)
    n = len(acc)
    return {"accepted": acc, "bound": bnd, "tokens_per_call": 1.0 + float(acc.mean()),
            "tokens_per_call_se": float(acc.std(ddof=1) / math.sqrt(n)), "bound_mean": float(bnd.mean()),
            "bound_se": float(bnd.std(ddof=1) / math.sqrt(n))}


def reachable(rows: Rows | TreeRows, family: str = "free") -> tuple[float, float]:
    """(vanilla, largest) predicted tokens per call the family can be tuned to. Scaled families: the largest
    accepts every draft with p > 0 (weights at the saturation level max q/p over the recorded rows);
    level: every draft (a = 1)."""
    family = _check_family(family)
    van = predict(rows, rules.vanilla())["tokens_per_call"]
    if family == "level":
        top = rules.level(rules.Uniform(1.0))
    else:
        pp = rows.p[:, :rows.q.shape[1]]
        m = (pp > 0) & (rows.q > 0)
        w_sat = float(np.max(rows.q[m] / pp[m])) * 2.0 if m.any() else 1.0
        top = rules.scaled(rules.Uniform(max(w_sat, 1.0)))
    return van, predict(rows, top)["tokens_per_call"]


class _Jax:
    """Jitted (T11 mean, grad) and (1 + T10 mean, grad) of a family on fixed rows (JAX float64)."""

    _cache: dict = {}

    def __init__(self, rows, family: str):
        from ..core.jaxtools import jax64 as _jax64

        self.family, self.L = family, rows.L
        self._ctx = _jax64
        tree = rows.tree if isinstance(rows, TreeRows) else None
        # the rows are validated here, once: inside the traced objective predict_*(check=False)
        checks.check_rows_xp("rows.p", rows.p, np)
        if tree is None:
            checks.check_rows_xp("rows.q", rows.q, np)
            checks.check_tokens_xp("rows.drafts", rows.drafts, rows.p.shape[-1], np)
        else:
            checks.check_tokens_xp("rows.tokens", rows.tokens[:, 1:], rows.p.shape[-1], np)
        with _jax64() as (jax, jnp):
            extra = rows.tokens if tree is not None else rows.drafts
            nd = np.zeros(rows.R, np.int64) if tree is not None else rows.n_drafted
            self.args = tuple(jnp.asarray(a) for a in (rows.p, rows.q, extra, nd))
            key = (family, self.L, None if tree is None else tree.paths)
            if key not in self._cache:
                L = self.L

                def both(theta, p, q, d, nd):
                    def parts(th):
                        rule = rule_of(family, family_values(family, th, L, jnp))
                        r = predict_tree_rounds(p, q, d, tree, rule, check=False) if tree is not None else \
                            predict_rounds(p, q, d, rule, n_drafted=nd, check=False)   # checked below, once
                        v = jnp.stack([jnp.mean(r.bound), 1.0 + jnp.mean(r.accepted)])
                        return v, v
                    J, v = jax.jacrev(parts, has_aux=True)(theta)
                    return v[0], v[1], J[0], J[1]
                self._cache[key] = jax.jit(both)
            self.fn = self._cache[key]
        self._memo: dict = {}

    def __call__(self, theta: np.ndarray):
        k = np.asarray(theta, np.float64).tobytes()
        if k not in self._memo:
            self._memo.clear()
            with self._ctx() as (jax, jnp):
                b, t, gb, gt = self.fn(jnp.asarray(theta, dtype=jnp.float64), *self.args)
                self._memo[k] = (float(b), float(t), np.asarray(gb, np.float64), np.asarray(gt, np.float64))
        return self._memo[k]


def _polish(ev: _Jax, family: str, theta: np.ndarray, key: int, value: float) -> np.ndarray | None:
    """theta moved along the scale so that the constrained quantity (key 0: bound, 1: tokens per call)
    equals ``value``; None when no shift within the box reaches it."""
    g = lambda s: ev(_shift(family, theta, s))[key] - value  # noqa: E731
    lo, hi = -1.0, 1.0
    for _ in range(60):
        if g(lo) <= 0:
            break
        lo *= 2
    else:
        return None
    for _ in range(60):
        if g(hi) >= 0:
            break
        hi *= 2
        if hi > 128:
            return None
    if g(lo) == 0:
        return _shift(family, theta, lo)
    return _shift(family, theta, brentq(g, lo, hi, xtol=1e-13, maxiter=300))


# --------------------------------------------------------------------------- the optimiser

@dataclass
class TuneResult:
    """A tuned schedule: ``values`` (L,) weights w (scaled families) or levels a (family "level"), with
    its numpy-recomputed predictions on the rows it was fitted on."""
    family: str
    mode: str                 # "target" or "budget"
    constraint: float         # tokens per call (target) or bound budget
    values: np.ndarray
    theta: np.ndarray
    tokens_per_call: float
    bound: float
    tokens_per_call_se: float
    bound_se: float
    source: str
    starts: dict = field(default_factory=dict)

    @property
    def verifier(self) -> rules.Verifier:
        return rule_of(self.family, self.values)

    def to_dict(self) -> dict:
        key = "levels" if self.family == "level" else "weights"
        return {"family": self.family, "rule": "level" if self.family == "level" else "scaled", key: self.values.tolist(),
                "mode": self.mode, "constraint": self.constraint, "predicted_tokens_per_call": self.tokens_per_call,
                "predicted_tokens_per_call_se": self.tokens_per_call_se, "predicted_bound": self.bound,
                "predicted_bound_se": self.bound_se, "source": self.source, "resampler": "G* (T5)"}


def _starts(family: str, L: int, n_random: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    i = np.arange(L, dtype=float)
    if family == "uniform":
        return {"uniform": np.zeros(1)}
    if family == "exponential":
        return {f"nu={nu}": np.array([0.0, nu]) for nu in (0.0, 0.7, 2.0, -0.5)}
    if family == "linear":
        return {f"ratio={r}": np.array([0.0, math.log(r)]) for r in (1.0, 0.25, 4.0)}
    if family == "level":
        out = {"constant": np.zeros(L), "decreasing": np.linspace(2.0, -2.0, L), "increasing": np.linspace(-2.0, 2.0, L)}
    else:
        out = {"uniform": np.zeros(L), "exponential": -0.7 * i,
               "front": np.where(i == 0, 5.0, 0.0)}    # w_1 near saturation, vanilla after (bound optima often are)
    out.update({f"random{j}": rng.normal(0.0, 1.0, L) for j in range(n_random)})
    return out


def tune(rows: Rows | TreeRows, family: str = "free", tokens_per_call: float | None = None, bound_budget: float | None = None,
         n_random: int = 0, seed: int = 0, maxiter: int = 40, extra_starts: dict | None = None,
         search_rounds: int | None = 600) -> TuneResult:
    """The family's schedule minimising the mean predicted bound (T11) at ``tokens_per_call`` (1 + mean T10),
    or maximising the predicted tokens per call under ``bound_budget``; G* resampling (T5).

    Refuses (ValueError, with the reachable range) a target below vanilla's or above the family's largest
    reachable tokens per call, and a negative budget. ``extra_starts`` {name: theta} adds starts.
    ``search_rounds``: the search (SLSQP from every start) runs on a seeded subsample of this many rounds
    (None: all; each evaluation costs O(R L V)); the best end point is then polished on all rows, so the
    constraint holds on all rows and the reported figures are all-rows figures."""
    if not isinstance(rows, (Rows, TreeRows)):
        raise TypeError(f"rows must be theory.likelihood.recorded.Rows or TreeRows (theory.likelihood.recorded.load_rows(path)), "
                        f"got {type(rows).__name__}")
    family = _check_family(family)
    if (tokens_per_call is None) == (bound_budget is None):
        raise ValueError("tune: give exactly one of tokens_per_call (target) or bound_budget (budget)")
    n_random = checks.integer("n_random", n_random, lo=0)
    seed = checks.seed(seed)
    maxiter = checks.integer("maxiter", maxiter, lo=1)
    if search_rounds is not None:
        checks.integer("search_rounds", search_rounds, lo=2)
    if tokens_per_call is not None:
        checks.real("tokens_per_call", tokens_per_call)
    else:
        b = checks.real("bound_budget", bound_budget, 0)
        if b == 0:           # only the lossless schedule has bound 0 (T11): vanilla, no search
            return _vanilla_result(rows, family)
    van, top = reachable(rows, family)
    if tokens_per_call is not None:
        t = float(tokens_per_call)
        if not math.isfinite(t) or t < van * (1 - 1e-12) or t > top * (1 - 1e-9):
            raise ValueError(f"tokens_per_call={tokens_per_call} is outside the reachable range of family "
                             f"{family!r} on these rows: [{van:.6g} (vanilla), {top:.6g}) predicted tokens per call")
        mode, key, value = "target", 1, t
    else:
        b = float(bound_budget)
        if not math.isfinite(b) or b < 0:
            raise ValueError(f"bound_budget must be finite and >= 0, got {bound_budget}")
        mode, key, value = "budget", 0, b
    L = rows.L
    if search_rounds is not None and search_rounds < 2:
        raise ValueError(f"search_rounds must be >= 2 or None, got {search_rounds}")
    sub = rows if search_rounds is None or rows.R <= search_rounds else \
        rows.subset(np.sort(np.random.default_rng(seed).choice(rows.R, search_rounds, replace=False)))
    ev = _Jax(sub, family)
    box = _box(family, L)
    lo, hi = np.array([b[0] for b in box]), np.array([b[1] for b in box])
    starts = _starts(family, L, n_random, seed)
    starts.update(extra_starts or {})
    cands = []
    for name, th0 in starts.items():
        th0 = _polish(ev, family, np.clip(np.asarray(th0, float), lo, hi), key, value)
        if th0 is None:
            continue
        cands.append((name + "(start)", th0))
        if family == "uniform":
            continue
        if mode == "target":
            obj = lambda x: (ev(x)[0], ev(x)[2])  # noqa: E731
            con = {"type": "eq", "fun": lambda x: ev(x)[1] - value, "jac": lambda x: ev(x)[3]}
        else:
            obj = lambda x: (-ev(x)[1], -ev(x)[3])  # noqa: E731
            con = {"type": "ineq", "fun": lambda x: value - ev(x)[0], "jac": lambda x: -ev(x)[2]}
        res = minimize(obj, np.clip(th0, lo, hi), jac=True, method="SLSQP", bounds=box, constraints=[con],
                       options={"maxiter": maxiter, "ftol": 1e-10})
        th = _polish(ev, family, np.clip(res.x, lo, hi), key, value)
        if th is not None:
            cands.append((name, th))
    if not cands:
        raise ValueError(f"tune: no schedule of family {family!r} meets the constraint {mode}={value} inside the "
                         f"parameter box (reachable tokens per call [{van:.6g}, {top:.6g}))")
    score = (lambda th: ev(th)[0]) if mode == "target" else (lambda th: -ev(th)[1])
    ok = [(score(th), n, th) for n, th in cands if abs(ev(th)[key] - value) <= 1e-7 * max(1.0, abs(value))]
    if not ok:
        raise ValueError(f"tune: the polish did not meet {mode}={value} for family {family!r}")
    _, name, theta = min(ok, key=lambda c: c[0])
    scores = {n: float(score(th)) for n, th in cands}
    if sub is not rows:    # the constraint on all rows
        theta = _polish(_Jax(rows, family), family, theta, key, value)
        if theta is None:
            raise ValueError(f"tune: the schedule found on {sub.R} rounds cannot be scaled to {mode}={value} on all rows")
    values = np.asarray(family_values(family, theta, L), dtype=np.float64)
    pr = predict(rows, rule_of(family, values))
    return TuneResult(family, mode, value, values, theta, pr["tokens_per_call"], pr["bound_mean"],
                      pr["tokens_per_call_se"], pr["bound_se"], name, scores)


def _vanilla_result(rows, family: str) -> TuneResult:
    """The family's vanilla member (weights 1, or levels 0): the answer to a bound budget of 0."""
    L = rows.L
    values = np.zeros(L) if family == "level" else np.ones(L)
    theta = np.full(L, -np.inf) if family == "level" else np.zeros(n_params(family, L))
    pr = predict(rows, rule_of(family, values))
    return TuneResult(family, "budget", 0.0, values, theta, pr["tokens_per_call"], pr["bound_mean"],
                      pr["tokens_per_call_se"], pr["bound_se"], "vanilla (budget 0)", {})


def frontier(rows: Rows | TreeRows, families=FAMILIES, n_points: int = 6, lo: float = 0.1, hi: float = 0.9, **kw) -> dict:
    """The predicted frontier (bound vs tokens per call) of each family: targets on a grid from vanilla's
    tokens per call towards the largest reachable by the scaled families (fractions lo..hi); the level
    family is solved on the same grid. {family: [{"tokens_per_call", "bound", "values"}], "targets": [...]}."""
    van, top = reachable(rows, "free")
    targets = van + np.linspace(lo, hi, n_points) * (top - van)
    out = {"vanilla_tokens_per_call": van, "max_tokens_per_call": top, "targets": targets.tolist()}
    for fam in families:
        pts = []
        for t in targets:
            r = tune(rows, fam, tokens_per_call=float(t), **kw)
            pts.append({"tokens_per_call": r.tokens_per_call, "bound": r.bound, "values": r.values.tolist()})
        out[fam] = pts
    return out


def split_validation(rows: Rows | TreeRows, family: str = "free", tokens_per_call: float | None = None,
                     bound_budget: float | None = None, n_boot: int = 200, seed: int = 0, **kw) -> dict:
    """Fit on half of the recorded images (a seeded random half; rounds grouped by ``rows.image``), predict on
    the other half: in-sample vs held-out predicted tokens per call and bound, the gap (in-sample optimism),
    and image-bootstrap 95% intervals of the held-out figures."""
    imgs = np.unique(rows.image)
    if imgs.size < 4 or np.any(imgs < 0):
        raise ValueError("split_validation needs rows with an image index (>= 4 images); re-record with "
                         "coolsd generate --record (it stores one)")
    rng = np.random.default_rng(seed)
    fit_imgs = rng.permutation(imgs)[: imgs.size // 2]
    in_fit = np.isin(rows.image, fit_imgs)
    fit, held = rows.subset(np.flatnonzero(in_fit)), rows.subset(np.flatnonzero(~in_fit))
    res = tune(fit, family, tokens_per_call=tokens_per_call, bound_budget=bound_budget, seed=seed, **kw)
    ho = predict(held, res.verifier)
    ci = bootstrap(held, ho, n_boot, seed)
    return {"family": family, "values": res.values.tolist(), "fit_images": int(fit_imgs.size),
            "heldout_images": int(imgs.size - fit_imgs.size),
            "in_sample": {"tokens_per_call": res.tokens_per_call, "bound": res.bound},
            "heldout": {"tokens_per_call": ho["tokens_per_call"], "bound": ho["bound_mean"], **ci},
            "gap": {"tokens_per_call": res.tokens_per_call - ho["tokens_per_call"], "bound": res.bound - ho["bound_mean"]}}


def bootstrap(rows: Rows | TreeRows, pred: dict, n_boot: int = 200, seed: int = 0) -> dict:
    """95% percentile intervals of the predicted tokens per call and bound, resampling images (clusters of
    rounds; rounds when the rows carry no image index) with replacement."""
    if n_boot < 10:
        raise ValueError(f"n_boot must be >= 10, got {n_boot}")
    ids = rows.image if np.all(rows.image >= 0) else np.arange(rows.R)
    uniq, inv = np.unique(ids, return_inverse=True)
    n = uniq.size
    acc = np.bincount(inv, pred["accepted"], n)
    bnd = np.bincount(inv, pred["bound"], n)
    cnt = np.bincount(inv, None, n).astype(float)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, n, (n_boot, n))
    k = np.stack([np.bincount(row, minlength=n) for row in pick]).astype(float)   # (n_boot, n) multiplicities
    den = k @ cnt
    t = 1.0 + (k @ acc) / den
    b = (k @ bnd) / den
    return {"tokens_per_call_ci95": np.percentile(t, [2.5, 97.5]).tolist(),
            "bound_ci95": np.percentile(b, [2.5, 97.5]).tolist(), "n_boot": int(n_boot), "clusters": int(n)}
