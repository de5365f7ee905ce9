"""Schedules tuned on the exact law (docs/theory.md section 8c): the fidelity of a rule family measured exactly on
plain-AR images (``objective.ExactObjective``: KL(P||P^) per token or TV) traded against its speed predicted from
recorded vanilla rounds (``speed.SpeedModel``: tokens per target call as ``coolsd demo`` / ``coolsd sweep`` predict
it), or against the per-round T11 bound of section 8b (objective "bound"), on the same speed scale.

* target mode: minimise the objective subject to predicted tokens per call = ``tokens_per_call``;
* budget mode: maximise predicted tokens per call subject to KL <= ``kl_budget`` (or TV <= ``tv_budget``, or the
  mean T11 bound per round <= ``bound_budget``).

The AR images are split by image into a fit part (``fit_fraction``, seeded) and a held-out part: the search uses the
fit images only; the held-out KL and TV of the result are computed by ``theory.likelihood.log_likelihood`` on the rule
object the engine runs (an independent path), with 95% intervals (``fidelity.kl_ar``, ``tv_ar``). Predicted tokens per
call carry an image-bootstrap interval over the recorded images. Method: SLSQP with exact JAX gradients from several
starts, each end point moved along the family's scale (every f is non-decreasing in it, so the predicted speed is)
by a bracketed root finder until the constraint holds to 1e-9 relative.

Refused before any search (one-line ValueError): not exactly one of the four constraints; a budget <= 0 or not
finite; a budget below the family's smallest reachable value (its lossless member, w = 1: the value is named);
a target outside the reachable speeds [vanilla, every draft accepted); AR rows and record whose stamps differ (model,
draft, processing, L, convention, T, V) or that do not match the rule's L; a record that is not a vanilla chain run
(tree rounds have no chain law here: a separate issue).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq, minimize

from ..core import checks
from ..core.jaxtools import jax64
from ..core.xp import ratio_min1
from . import fidelity, objective as ob, speed, tune
from .arrows import ARRows, StampedRecord, check_stamps
from .chain import log_likelihood, log_target

__all__ = ["OBJECTIVES", "ExactTuneResult", "tune_exact", "search", "f_at_drafts", "reachable", "check_target"]

OBJECTIVES = ("kl", "tv", "bound")
REL_TOL = 1e-9
BOUND_CHUNK_ENTRIES = 1 << 21   # rounds x (L + 1) x V entries per jitted chunk of the bound objective (``_bound_fn``)
SATURATE = 40.0          # log-weight shift at which every draft with p > 0 is accepted (w = e^40)


def f_at_drafts(sm: speed.SpeedModel, family: str, theta, L: int, xp=np):
    """The family's acceptance probabilities of the recorded drafts (R, L) at theta (what ``predict_rounds`` gives at
    the drafted tokens for ``objective.rule_of(family, theta, L)``)."""
    p, q = xp.asarray(sm.ptok), xp.asarray(sm.qtok)
    if family in ob.ROW_FAMILIES:
        w = xp.exp(theta[:L])[None, :] * xp.exp(theta[L] * xp.asarray(sm.phi[family]))
        return ratio_min1(w * p, q, xp)
    v = tune.family_values(family, theta, L, xp)
    if family == "level":
        van = ratio_min1(p, q, xp)
        return van + v * (1 - van)
    return ratio_min1(v * p, q, xp)


class _Memo:
    """(value, gradient) of a jitted scalar function of theta, memoised on theta (SLSQP asks twice per point)."""

    def __init__(self, fn):
        self.fn, self.key, self.val = fn, None, None

    def __call__(self, theta):
        k = np.asarray(theta, np.float64).tobytes()
        if k != self.key:
            self.key, self.val = k, self.fn(np.asarray(theta, np.float64))
        return self.val


def _speed_fn(sm: speed.SpeedModel, family: str, L: int):
    """theta -> (predicted tokens per call, gradient) (JAX float64, jitted)."""
    with jax64() as (jax, jnp):
        def tpc(theta):
            f = f_at_drafts(sm, family, theta, L, jnp)
            acc = jnp.cumulative_prod(f, axis=1)
            S = speed.survival_by_row(acc, jnp.asarray(sm.live), jnp.asarray(sm.start), sm.min_count, sm.T,
                                      sm.per_row, jnp)
            return speed.expected_rounds(S, L, sm.first_single, sm.T, sm.per_row, jnp)["tokens_per_call"]
        vg = jax.jit(jax.value_and_grad(tpc))

    def call(theta):
        with jax64() as (jax, jnp):
            v, g = vg(jnp.asarray(theta))
            return float(v), np.asarray(g, np.float64)
    return _Memo(call)


def _bound_fn(record: StampedRecord, family: str, L: int):
    """theta -> (mean T11 bound per recorded round, gradient) on the rule objects (``predict_rounds``, JAX): one jitted
    shape of ``BOUND_CHUNK_ENTRIES`` // ((L + 1) V) rounds, summed over the chunks (the last one padded with weight-0
    copies of the last round), so its temporaries do not grow with the record (the whole record at once held a few
    (R, L, V) float64 arrays: 1.2 GB for one 576-token image at V = 16,384)."""
    from .recorded import predict_rounds

    r = record.rows
    R = r.R
    c = max(1, min(R, BOUND_CHUNK_ENTRIES // ((L + 1) * r.p.shape[-1])))
    with jax64() as (jax, jnp):
        def chunk_sum(theta, p, q, d, nd, w):
            return jnp.sum(w * predict_rounds(p, q, d, ob.rule_of(family, theta, L), n_drafted=nd, check=False).bound)
        vg = jax.jit(jax.value_and_grad(chunk_sum))

    def call(theta):
        v, g = 0.0, np.zeros(np.shape(theta))
        with jax64() as (jax, jnp):
            th = jnp.asarray(theta)
            for a in range(0, R, c):    # chunks of rounds, one compiled shape
                i = np.arange(a, a + c)
                w, i = (i < R).astype(np.float64), np.minimum(i, R - 1)
                cv, cg = vg(th, r.p[i], r.q[i], r.drafts[i], r.n_drafted[i], w)
                v, g = v + float(cv), g + np.asarray(cg, np.float64)
        return (v / R, g / R) if R else (float("nan"), g * np.nan)
    return _Memo(call)


def _fidelity_fn(obj: ob.ExactObjective, which: str):
    def call(theta):
        v, g = obj.value_and_grad(theta)
        return v[which], g[which]
    return _Memo(call)


def _shift(family: str, theta: np.ndarray, s: float) -> np.ndarray:
    """theta moved along the family's scale (every f non-decreasing in s): all log-weights / level logits + s."""
    t = np.array(theta, dtype=np.float64)
    if family in ob.ROW_FAMILIES:
        t[:-1] += s
        return t
    return tune._shift(family, t, s)


def _polish(fn, family, theta, value):
    """theta shifted along the scale so that fn(theta)[0] = value (bracketed brentq); None when no shift in
    [-128, 128] brackets it."""
    g = lambda s: fn(_shift(family, theta, s))[0] - value  # noqa: E731
    lo, hi = -1.0, 1.0
    while g(lo) > 0:
        lo *= 2
        if lo < -128:
            return None
    while g(hi) < 0:
        hi *= 2
        if hi > 128:
            return None
    if g(lo) == 0:
        return _shift(family, theta, lo)
    return _shift(family, theta, brentq(g, lo, hi, xtol=1e-13, rtol=4 * np.finfo(float).eps, maxiter=300))


def _starts(family: str, L: int, n_random: int, seed: int) -> dict[str, np.ndarray]:
    if family not in ob.ROW_FAMILIES:
        return tune._starts(family, L, n_random, seed)
    base = tune._starts("free", L, n_random, seed)
    k = ob.SLOPE[family][1] / 6
    out = {f"{n},b=0": np.r_[t, 0.0] for n, t in base.items()}
    out.update({f"uniform,b={s:+g}": np.r_[np.zeros(L), s] for s in (k, -k)})
    return out


def search(fid, spd, family: str, L: int, mode: str, value: float, *, seed: int = 0, maxiter: int = 50,
           n_random: int = 0, extra_starts: dict | None = None, what: str = "constraint"):
    """The optimisation itself, on callables theta -> (value, gradient): ``fid`` (the fidelity objective: KL, TV or
    bound) and ``spd`` (predicted tokens per call). mode "target": min fid s.t. spd = value; "budget": max spd s.t.
    fid <= value. SLSQP from every start, each end point polished along the scale (``_polish``); returns (theta,
    the winning start's name, {start: score})."""
    bx = ob.box(family, L)
    lo, hi = np.array([b[0] for b in bx]), np.array([b[1] for b in bx])
    if mode == "target":
        minimise, constrained = fid, spd
        con = {"type": "eq", "fun": lambda x: spd(x)[0] - value, "jac": lambda x: spd(x)[1]}
    else:
        minimise, constrained = (lambda x: tuple(-np.asarray(v) for v in spd(x))), fid
        con = {"type": "ineq", "fun": lambda x: value - fid(x)[0], "jac": lambda x: -fid(x)[1]}
    starts = _starts(family, L, n_random, seed)
    starts.update(extra_starts or {})
    cands = []
    for name, th0 in starts.items():   # a loop over starting points (a handful)
        th0 = _polish(constrained, family, np.clip(np.asarray(th0, float), lo, hi), value)
        if th0 is None:
            continue
        cands.append((name + "(start)", th0))
        if family == "uniform":
            continue
        res = minimize(lambda x: minimise(x), np.clip(th0, lo, hi), jac=True, method="SLSQP", bounds=bx,
                       constraints=[con], options={"maxiter": maxiter, "ftol": 1e-12})
        th = _polish(constrained, family, np.clip(res.x, lo, hi), value)
        if th is not None:
            cands.append((name, th))
    ok = [(float(minimise(th)[0]), n, th) for n, th in cands
          if abs(constrained(th)[0] - value) <= REL_TOL * max(1.0, abs(value)) * 10]
    if not ok:
        raise ValueError(f"tune: no schedule of family {family!r} meets {what}={value:g} inside the parameter box")
    _, name, theta = min(ok, key=lambda c: c[0])
    return theta, name, {n: float(minimise(th)[0]) for n, th in cands}


@dataclass
class ExactTuneResult:
    """A schedule tuned on the exact law (module docstring); ``to_dict`` is the schedule JSON of ``coolsd tune``."""
    family: str
    objective: str
    mode: str
    constraint: float
    L: int
    theta: np.ndarray
    fit: dict
    heldout: dict | None
    speed: dict
    vanilla_tokens_per_call: float
    max_tokens_per_call: float
    bound: float | None
    provenance: dict = field(default_factory=dict)
    starts: dict = field(default_factory=dict)

    @property
    def verifier(self):
        return ob.rule_of(self.family, self.theta, self.L)

    @property
    def tokens_per_call(self) -> float:
        return self.speed["tokens_per_call"]

    def to_dict(self) -> dict:
        sched = ob.values_of(self.family, self.theta, self.L)
        rule = "row-scaled" if self.family in ob.ROW_FAMILIES else "level" if self.family == "level" else "scaled"
        return {**sched, "rule": rule, "family": self.family, "resampler": "G* (T5)", "theta": self.theta.tolist(),
                "objective": self.objective, "mode": self.mode, "constraint": self.constraint,
                "predicted_tokens_per_call": self.speed["tokens_per_call"],
                "predicted_tokens_per_call_ci95": self.speed["ci95"], "vanilla_tokens_per_call": self.vanilla_tokens_per_call,
                "max_tokens_per_call": self.max_tokens_per_call, "fit": self.fit, "heldout": self.heldout,
                "predicted_bound_per_round": self.bound, **self.provenance}


def _check_inputs(ar_rows, record, family, objective, constraints):
    """Every refusal that needs no evaluation (module docstring). Returns (objective, mode, key, value)."""
    ob.check_family(family)
    given = {k: v for k, v in constraints.items() if v is not None}
    if len(given) != 1:
        raise ValueError("tune: give exactly one of tokens_per_call, kl_budget, tv_budget, bound_budget; got "
                         f"{sorted(given) or 'none'}")
    (key, value), = given.items()
    value = checks.real(key, value)
    if key == "tokens_per_call":
        mode, objective = "target", objective or "kl"
    else:
        if not (value > 0 or (key == "bound_budget" and value == 0)):
            raise ValueError(f"{key} must be > 0 (0 is the lossless rule itself: vanilla), got {value:g}")
        implied = key.split("_")[0]
        if objective not in (None, implied):
            raise ValueError(f"tune: {key} bounds the {implied.upper()}; the objective is then {implied!r}, not "
                             f"{objective!r}")
        mode, objective = "budget", implied
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if not isinstance(record, StampedRecord):
        raise ValueError("tune: the recorded rounds must be a stamped chain record (theory.likelihood.arrows.load_record; "
                         "coolsd generate --method vanilla --record FILE); tree rounds have no chain law here")
    if record.stamp.get("method", "vanilla") != "vanilla":
        raise ValueError(f"tune: the record is a run of {record.stamp.get('method')!r}; the speed model needs vanilla "
                         "rounds (their prefixes follow the target P)")
    if objective != "bound" and not isinstance(ar_rows, ARRows):
        raise ValueError(f"tune: objective {objective!r} needs the teacher-forced rows of AR images (ARRows)")
    if ar_rows is not None:
        check_stamps(ar_rows.stamp, record.stamp, "tune: AR rows vs recorded rounds", L=record.L)
        if ar_rows.n < 4:
            raise ValueError(f"tune: need at least 4 AR images (fit and held-out halves), got {ar_rows.n}")
    return objective, mode, key, value


def reachable(record: StampedRecord, family: str, sm: "speed.SpeedModel | None" = None) -> tuple[float, float]:
    """(vanilla's, the family's supremum) predicted tokens per call on ``record``: the reachable range of a
    tokens-per-call target, which depends on the record alone (``coolsd tune`` checks it before making AR rows)."""
    sm = sm or speed.SpeedModel(record)
    L = record.L
    van = float(sm.tokens_per_call(f_at_drafts(sm, "free", np.zeros(L), L)))
    top = float(sm.tokens_per_call(np.ones_like(sm.ptok) if family == "level" else sm.f_max()))
    return van, top


def check_target(record: StampedRecord, family: str, value: float, sm: "speed.SpeedModel | None" = None) -> None:
    """ValueError unless ``value`` tokens per call lies in the family's reachable range on ``record``."""
    van, top = reachable(record, family, sm)
    if not (van * (1 - 1e-12) <= value < top * (1 - 1e-9)):
        raise ValueError(f"tokens_per_call={value:g} is outside the reachable range of family {family!r} on this "
                         f"record: [{van:.6g} (vanilla), {top:.6g}) predicted tokens per call")


def tune_exact(ar_rows: ARRows | None, record: StampedRecord, family: str = "free", objective: str | None = None, *,
               tokens_per_call: float | None = None, kl_budget: float | None = None, tv_budget: float | None = None,
               bound_budget: float | None = None, seed: int = 0, fit_fraction: float = 0.5, maxiter: int = 50,
               n_random: int = 0, chunk_images: int | None = None, n_boot: int = 200,
               extra_starts: dict | None = None) -> ExactTuneResult:
    """The family's schedule of least KL / TV / bound at a predicted tokens per call, or of most predicted tokens per
    call within a budget (module docstring). ``ar_rows`` may be None for objective "bound"."""
    objective, mode, key, value = _check_inputs(ar_rows, record, family, objective,
                                                {"tokens_per_call": tokens_per_call, "kl_budget": kl_budget,
                                                 "tv_budget": tv_budget, "bound_budget": bound_budget})
    seed = checks.seed(seed)
    checks.integer("n_boot", n_boot, lo=2)        # the bootstrap's interval needs resamples (0: an IndexError once)
    checks.real("fit_fraction", fit_fraction, 0, 1, lo_open=True, hi_open=True)
    L = record.L
    sm = speed.SpeedModel(record)
    van, top = reachable(record, family, sm)
    if mode == "target":
        check_target(record, family, value, sm)
    fit_idx = held_idx = None
    if ar_rows is not None:
        perm = np.random.default_rng(seed).permutation(ar_rows.n)
        k = min(max(2, int(round(fit_fraction * ar_rows.n))), ar_rows.n - 2)
        fit_idx, held_idx = np.sort(perm[:k]), np.sort(perm[k:])
    spd = _speed_fn(sm, family, L)
    if objective == "bound":
        fid = _bound_fn(record, family, L)
    else:
        obj = ob.ExactObjective(ar_rows, family, images=fit_idx, chunk_images=chunk_images)
        fid = _fidelity_fn(obj, objective)
    if mode == "budget":
        floor = fid(ob.lossless_theta(family, L))[0]
        if key == "bound_budget" and value == 0:      # only the lossless member has bound 0 (T11): no search
            return _result(ar_rows, record, sm, family, objective, mode, value, ob.lossless_theta(family, L), fit_idx,
                           held_idx, {}, "lossless (budget 0)", van, top, seed, n_boot, key, None)
        if value <= floor:
            raise ValueError(f"{key}={value:g} is unreachable: the smallest {objective.upper()} in family {family!r} on "
                             f"these images is {floor:.6g} (its lossless member, vanilla's law up to float rounding)")
        sat = _shift(family, ob.lossless_theta(family, L), SATURATE)
        if fid(sat)[0] <= value:      # the budget does not bind: every draft with p > 0 accepted
            return _result(ar_rows, record, sm, family, objective, mode, value, sat, fit_idx, held_idx, {}, "saturated",
                           van, top, seed, n_boot, key, obj if objective != "bound" else None)
    theta, name, scores = search(fid, spd, family, L, mode, value, seed=seed, maxiter=maxiter, n_random=n_random,
                                 extra_starts=extra_starts, what=key)
    return _result(ar_rows, record, sm, family, objective, mode, value, theta, fit_idx, held_idx, scores, name, van,
                   top, seed, n_boot, key, obj if objective != "bound" else None)


def _result(ar_rows, record, sm, family, objective, mode, value, theta, fit_idx, held_idx, scores, name, van, top,
            seed, n_boot, key, obj) -> ExactTuneResult:
    """The figures of a tuned theta: fit (the search's own), held-out (``log_likelihood`` on the rule object, with
    95% intervals), predicted speed (bootstrap) and bound."""
    L = record.L
    rule = ob.rule_of(family, theta, L)
    fit = heldout = None
    if obj is not None:
        fit = {**obj.values(theta), "images": int(fit_idx.size)}
    if ar_rows is not None:
        h = ar_rows.subset(held_idx)
        lph = np.concatenate([log_likelihood(h.p[a:a + 64], h.q[a:a + 64], h.tokens[a:a + 64], rule, L,
                                             convention=h.convention) for a in range(0, h.n, 64)])
        lp = log_target(h.p, h.tokens)
        heldout = {"kl_per_token": fidelity.kl_ar(lph, lp, T=h.T).get("per_token"), "kl": fidelity.kl_ar(lph, lp, T=h.T),
                   "tv": fidelity.tv_ar(lph, lp), "images": int(h.n), "computed_by": "theory.likelihood.log_likelihood"}
    spd = sm.bootstrap(f_at_drafts(sm, family, np.asarray(theta), L), n_boot=n_boot, seed=seed)
    from .recorded import predict_rounds

    r = record.rows
    parts = [np.asarray(predict_rounds(r.p[a:a + 256], r.q[a:a + 256], r.drafts[a:a + 256], rule,
                                       n_drafted=r.n_drafted[a:a + 256]).bound) for a in range(0, r.R, 256)]
    bound = float(np.concatenate(parts).mean())
    prov = {"stamp": dict(record.stamp), "record_rounds": int(r.R), "record_images": int(np.unique(r.image).size),
            "seed": seed, "start": name, "speed_model": "theory.likelihood.speed (chain_prediction's tokens per call)",
            "L": L, "constraint_name": key}
    if ar_rows is not None:
        prov.update(ar_stamp=dict(ar_rows.stamp), ar_images=int(ar_rows.n), fit_images=ar_rows.image[fit_idx].tolist(),
                    heldout_images=ar_rows.image[held_idx].tolist())
    return ExactTuneResult(family, objective, mode, float(value), L, np.asarray(theta, np.float64), fit, heldout, spd,
                           van, top, bound, prov, scores)

