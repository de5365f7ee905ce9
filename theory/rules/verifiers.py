"""Acceptance rules f_i and resampling rules G_i, written once against the array API.

The same objects run on numpy, JAX and torch arrays (the theory engine, the simulator and the
real-model engine all call them). Shapes:

* an acceptance rule is called as ``f = rule(p, q, i)`` with target rows ``p`` (..., V), draft rows
  ``q`` (..., V) and the 1-based draft position ``i`` (an int, or an integer array broadcastable to
  ``p.shape[:-1]``, e.g. shape (L,) when p is (..., L, V)). It returns f (..., V): the acceptance
  probability of every token as if it had been drafted (T0, T1, section 5 and 6 of docs/theory.md).
  Where q(x) = 0 the token is never drafted; f(x) is then set to 1 by convention (Q f = 0 there).
* a resampling rule is called as ``G = rule(p, q, f, rejected=None)`` and returns G (..., V), the law
  of the token drawn after a rejection. Rules that depend on the rejected token (LANTERN's own
  resampler) use ``rejected`` (...,) ints when given; with ``rejected=None`` they return the
  effective law  G_eff = sum_x q(x) (1 - f(x)) G(.|x) / (1 - beta)  (section 6), which is what the
  theory (T3-T9) needs.

A :class:`Verifier` pairs one of each. Writing your own verifier is a function of (p, q, i) and a
function of (p, q, f, rejected) that use ``xp = namespace(p)`` for array operations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..core import checks
from ..core.xp import Array, namespace
from .acceptance import ROW_FEATURES, Greedy, Level, RowScaled, Scaled, Typical, Vanilla
from .gsd import GSD_D_THRESHOLD, GSD_P_THRESHOLD, GSD_WINDOW, Grouped, gsd_close
from .lantern import Lantern, LanternResample
from .lantern_walk import lantern_walks
from .resampling import Argmax, Optimal, Residual, Target
from .walks import GREEDY_WALKS, VANILLA_WALKS, boosted_walks, greedy_chain, scaled_walks
from .schedules import COOL_SD_NORM, Explicit, Exponential, Linear, Uniform, cool_sd_schedule

__all__ = ["Verifier", "guarded", "vanilla", "scaled", "row_scaled", "cool_sd", "level", "uniform_rsd", "linear_rsd", "lantern", "lantern_pp",
           "typical", "gsd", "greedy", "LANTERN_RESAMPLERS", "TYPICAL_RESAMPLERS", "GSD_RESAMPLERS"]


# --------------------------------------------------------------------------- verifiers

@dataclass(frozen=True, eq=False)
class Verifier:
    """An acceptance rule f_i and a resampling rule G_i (section 1), with a name and parameters for reports, and
    optionally ``walk``: the rule's own fast multi-candidate walks (``theory.rules.walks``; the hook
    ``theory.tree.verify_round`` tries before the generic ``verify_tree``), a mapping draft law -> callable (p, q,
    tokens, u_accept, u_sample, children, depth, max_depth, draft_law) -> (accepted, path, next_token, last_node), or
    None where it does not apply, for numpy rows, and "device" -> the same for other arrays (every law). A walk must give ``verify_tree``'s verdict
    (tests/test_fast_verify.py checks the provided ones). Optionally ``chain``: the rule's own chain verdict, a
    callable with ``verify_chain``'s arguments and verdict (``theory.rules.walks.greedy_chain``), which
    ``theory.tree.verify_round`` takes for chains."""
    accept: Any
    resample: Any
    name: str = "custom"
    params: dict = field(default_factory=dict)
    walk: Any = None
    chain: Any = None

    def tables(self, p: Array, q: Array, L: int) -> tuple[Array, Array]:
        """Per-position tables F, G (L, ..., V) on rows p, q (..., V); G is the effective law."""
        xp = namespace(p, q)
        Fs, Gs = [], []
        for i in range(1, L + 1):  # a loop over draft positions (L is small), not over tokens
            f = self.accept(p, q, i)
            Fs.append(f)
            Gs.append(self.resample(p, q, f))
        return xp.stack(Fs), xp.stack(Gs)


_BUILT_IN = (Vanilla, Scaled, RowScaled, Level, Typical, Greedy, Grouped, Lantern, LanternResample, Residual, Optimal,
             Target, Argmax)


def _traced(a) -> bool:
    """A JAX tracer (under jit / grad): its values are not known, the check runs on concrete calls only."""
    return "Tracer" in type(a).__name__


class _CheckedAccept:
    def __init__(self, rule, name):
        self.rule, self.name = rule, name

    def __call__(self, p, q, i):
        f = self.rule(p, q, i)
        if _traced(f):
            return f
        xp = namespace(f)
        bad = xp.logical_not((f >= 0) & (f <= 1))            # NaN fails both comparisons
        if bool(xp.any(bad)):
            raise ValueError(f"verifier {self.name!r}: its acceptance returned values outside [0, 1] (or NaN) on "
                             f"the rows it was used on; an acceptance probability f(x) must lie in [0, 1]")
        return f

    def __getattr__(self, k):            # schedules, effective_at ...: the wrapped rule's
        if k == "rule":                  # not set yet (copy / pickle build the object without __init__)
            raise AttributeError(k)
        return getattr(self.rule, k)


class _CheckedResample(_CheckedAccept):
    def __call__(self, p, q, f, rejected=None):
        G = self.rule(p, q, f) if rejected is None else self.rule(p, q, f, rejected)
        if _traced(G):
            return G
        xp = namespace(G)
        tol = checks.row_sum_tol(G.dtype, G.shape[-1])   # the dtype's and V's (theory.core.checks)
        s = xp.sum(G, axis=-1)
        bad = xp.any(xp.logical_not(G >= 0)) | xp.any(xp.logical_not(xp.abs(s - 1) <= tol))
        if bool(bad):
            raise ValueError(f"verifier {self.name!r}: its resampling returned a row that is not a distribution "
                             f"(negative or NaN entries, or a sum off 1 by more than {tol:g}) on the rows it was used on")
        return G


def guarded(v: "Verifier") -> "Verifier":
    """``v`` itself when its acceptance and resampling are the toolkit's own rules; a user's verifier wrapped so that
    every call checks its output on the rows it is used on (f in [0, 1]; G rows non-negative, summing to 1) and
    raises a one-line ValueError naming the verifier. The built-in rules are tested, so they pay nothing; a user's
    pays one read per call (a host sync on a GPU)."""
    if isinstance(v.accept, _BUILT_IN) and isinstance(v.resample, _BUILT_IN):
        return v
    name = getattr(v, "name", "custom")
    return Verifier(_CheckedAccept(v.accept, name), _CheckedResample(v.resample, name), name,
                    dict(getattr(v, "params", {}) or {}), walk=None)


def vanilla() -> Verifier:
    """Plain (lossless) speculative decoding (T1)."""
    return Verifier(Vanilla(), Residual(), "vanilla", {}, walk=VANILLA_WALKS)


def scaled(schedule, name: str = "scaled", resample=None) -> Verifier:
    """Scaled acceptance min(1, w_i p/q) with G* (T5) unless another resampler is given."""
    return Verifier(Scaled(schedule), resample or Optimal(), name, {"schedule": schedule},
                    walk=scaled_walks(schedule) if resample is None else None)


def row_scaled(weights, slope=0.0, feature: str = "entropy", name: str = "row-scaled") -> Verifier:
    """Row-conditioned scaled acceptance min(1, c_i exp(b phi(p)) p/q) (``RowScaled``; phi the target row's entropy
    or largest probability) with G* (T5). ``weights`` c_1..c_L: a schedule (``Explicit``, ``Vector``) or a list of
    numbers > 0; ``slope`` b: a finite number (or a 0-d array, traceable)."""
    if isinstance(weights, (list, tuple, np.ndarray)):
        weights = Explicit(tuple(float(x) for x in np.asarray(weights, dtype=np.float64).ravel()))
    elif not callable(weights):
        raise TypeError(f"row_scaled: weights must be a schedule or a list of weights, got {type(weights).__name__}")
    if feature not in ROW_FEATURES:
        raise ValueError(f"row_scaled: feature must be one of {ROW_FEATURES}, got {feature!r}")
    params = {"weights": weights, "slope": slope, "feature": feature}
    return Verifier(RowScaled(weights, slope, feature), Optimal(), name, params)


def cool_sd(delta: float, nu: float = 0.7, mu: float | None = None, norm: str | None = None,
            L: int | None = None) -> Verifier:
    """Cool-SD: exponentially decaying weights (``cool_sd_schedule``; default normalisation
    ``COOL_SD_NORM`` = "offset", w_i = 1 + (delta - 1) exp(-nu (i - 1))) with G* (T5)."""
    if checks.real("cool_sd: nu", nu) < 0:
        raise ValueError(f"cool_sd: nu={float(nu):g} must be >= 0 (a decaying schedule; nu < 0 makes the weights grow)")
    sch = cool_sd_schedule(delta, nu, norm, L, mu)
    params = {"delta": delta, "nu": nu, "norm": "mu" if mu is not None else (norm or COOL_SD_NORM)}
    if isinstance(sch, Exponential):
        params["mu"] = sch.offset
    if params["norm"] == "mean":
        params["L"] = L
    return Verifier(Scaled(sch), Optimal(), "cool-sd", params, walk=scaled_walks(sch))


def level(levels) -> Verifier:
    """The "level" rule f_i = v + a_i (1 - v) (a schedule of a_i in [0, 1], e.g. ``Explicit``, or the levels
    a_1..a_L as a list / array, checked to lie in [0, 1]) with G* (T5)."""
    if isinstance(levels, (list, tuple, np.ndarray)) or np.isscalar(levels):
        a = checks.unit_interval("level: levels", levels).ravel()
        levels = Explicit(tuple(float(x) for x in a), zero_ok=True)
    elif isinstance(levels, Explicit):
        checks.unit_interval("level: levels", levels.weights)
    elif not callable(levels):
        raise TypeError(f"level: levels must be a schedule (e.g. Explicit) or a list of levels in [0, 1], "
                        f"got {type(levels).__name__}")
    return Verifier(Level(levels), Optimal(), "level", {"levels": levels})


def uniform_rsd(c: float) -> Verifier:
    """UniformRSD: w_i = c at every position, with G* (T5; G* = G^van when c >= 1 by Prop. 1)."""
    return Verifier(Scaled(Uniform(c)), Optimal(), "uniform-rsd", {"c": c}, walk=scaled_walks(Uniform(c)))


def linear_rsd(first: float, last: float, L: int) -> Verifier:
    """Linearly decaying weights from w_1 = first to w_L = last (section 5), with G* (T5)."""
    sch = Linear(first, last, L)
    return Verifier(Scaled(sch), Optimal(), "linear-rsd", {"first": first, "last": last, "L": L}, walk=scaled_walks(sch))


# resampler names of the baselines (CLI --resampler); the first is the release's (the default)
LANTERN_RESAMPLERS = ("lantern", "renormalised", "optimal")
TYPICAL_RESAMPLERS = ("argmax", "optimal")


def _lantern_verifier(acc: Lantern, variant: str, resample: str, base: str, params: dict) -> Verifier:
    """LANTERN-family verifier: the release's resampler ("lantern"), our renormalised variant, or a named one (G*)."""
    if resample == "lantern":   # variant "q" under the point law leaves vanilla's residual: vanilla's walk, boosted
        walk = boosted_walks(acc.sibling_mass, acc, acc.sibling_cap) if variant == "q" else lantern_walks(acc)
        return Verifier(acc, LanternResample(acc.neighbors, acc.k, variant, "released", acc), base,
                        {**params, "resampler": resample}, walk=walk)
    if resample == "renormalised":
        return Verifier(acc, LanternResample(acc.neighbors, acc.k, variant, "renormalised", acc),
                        f"{base}-renormalised", {**params, "resampler": resample})
    G = _named_resampler(resample, extra=LANTERN_RESAMPLERS)
    sep = "+" if base == "lantern" else ""
    return Verifier(acc, G, base + sep + ("G*" if resample == "optimal" else resample), {**params, "resampler": resample})


def lantern(neighbors, k: int, delta: float, resample: str = "lantern") -> Verifier:
    """LANTERN (section 6, absolute delta) as released: its dynamic-path resampler (variant "p", neighbours
    removed only when one was admitted). ``resample="renormalised"``: our earlier variant (always removed);
    ``"optimal"``: G* (T5). ``neighbors`` (V, K >= k+1) from ``lantern_neighbors`` (raw codebook, as released)."""
    return _lantern_verifier(Lantern(neighbors, k, delta=delta), "p", resample, "lantern", {"k": k, "delta": delta})


def lantern_pp(neighbors, k: int, lam: float, resample: str = "lantern") -> Verifier:
    """LANTERN++ (section 6, relative lambda: neighbour mass <= (lam - 1) p(x), as released) with its
    static-tree resampler (variant "q": earlier siblings removed and renormalised by the tree walk, then the
    k+1 nearest neighbours zeroed without renormalising when one was admitted, residual Norm([p - q']_+)).
    ``resample="renormalised"``: our earlier variant; ``"optimal"``: G* (T5)."""
    return _lantern_verifier(Lantern(neighbors, k, lam=lam), "q", resample, "lantern++", {"k": k, "lambda": lam})


def typical(eps: float = 0.09, alpha: float = 0.3, resample: str = "argmax", entropy: str = "release") -> Verifier:
    """Typical acceptance as vLLM's sampler runs it: entropy -sum p log(p + 1e-5), correction token argmax p.
    ``resample="optimal"`` uses G* (T5), ``entropy="exact"`` the exact entropy (our earlier variant: both)."""
    G = Argmax() if resample == "argmax" else _named_resampler(resample, extra=TYPICAL_RESAMPLERS)
    name = "typical" + ("" if resample == "argmax" else "+G*" if resample == "optimal" else f"+{resample}") \
        + ("" if entropy == "release" else "(exact H)")
    return Verifier(Typical(eps, alpha, entropy), G, name,
                    {"eps": eps, "alpha": alpha, "resampler": resample, "entropy": entropy})


# GSD's resamplers (CLI --resampler): the release's vanilla residual Norm([p - q]_+) first (the default), G*
GSD_RESAMPLERS = ("residual", "optimal")


def gsd(embeddings=None, *, window: int = GSD_WINDOW, p_threshold: float = GSD_P_THRESHOLD,
        d_threshold: float | None = GSD_D_THRESHOLD, resample: str = "residual", close=None) -> Verifier:
    """GSD, Grouped Speculative Decoding (section 6b) as released: f(x) = min(1, P(G(x)) / Q(G(x))), G(x) the
    tokens of x's rank window (``window`` = 7: ascending-sorted positions [r - 7, r + 7) of p) within
    ``p_threshold`` (0.15) of p(x) and within squared distance ``d_threshold`` (0.5) of x's vector in
    ``embeddings`` (V, d); after a rejection the vanilla residual Norm([p - q]_+) (``resample="residual"``).
    ``resample="optimal"``: G* = Norm([p - q f]_+) (T5), named "gsd+G*". ``d_threshold=None`` (or inf) turns
    the distance test off (no embeddings needed); ``close`` (V, V) bool, a prebuilt ``gsd_close`` table,
    replaces ``embeddings``."""
    off = d_threshold is None or (isinstance(d_threshold, (int, float)) and math.isinf(d_threshold) and d_threshold > 0)
    if not off and not (isinstance(d_threshold, (int, float)) and not isinstance(d_threshold, bool)
                        and math.isfinite(d_threshold) and d_threshold > 0):
        raise ValueError(f"gsd: d_threshold must be a number > 0 (None or inf: no distance test), got {d_threshold!r}")
    if not off and close is None:
        if embeddings is None:
            raise ValueError(f"gsd: the embedding-distance test (d_threshold={d_threshold!r}) needs the codebook "
                             "vectors: pass embeddings=(V, d) (the target's input embeddings as released, or the VQ "
                             "codebook), or d_threshold=None to turn the test off")
        close = gsd_close(embeddings, d_threshold)
    elif off:
        close = None
    if resample not in GSD_RESAMPLERS:
        raise ValueError(f"gsd: unknown resampler {resample!r}; choose from {list(GSD_RESAMPLERS)}")
    acc = Grouped(close, window, p_threshold)
    params = {"window": window, "p_threshold": p_threshold, "d_threshold": None if off else d_threshold,
              "resampler": resample}
    if resample == "residual":
        return Verifier(acc, Residual(), "gsd", params)
    return Verifier(acc, Optimal(), "gsd+G*", params)


def greedy() -> Verifier:
    """Greedy verification (section 1): accept iff the draft is the target's argmax; correct with the argmax."""
    return Verifier(Greedy(), Argmax(), "greedy", {}, walk=GREEDY_WALKS, chain=greedy_chain)


def _named_resampler(name: str, extra: Sequence[str] = ()):
    table = {"optimal": Optimal(), "residual": Residual(), "target": Target(), "argmax": Argmax()}
    if name not in table:
        raise ValueError(f"unknown resampler {name!r}; choose from {sorted(set(table) | set(extra))}")
    return table[name]
