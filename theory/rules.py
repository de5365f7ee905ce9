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
from typing import Any, Protocol, Sequence

import array_api_compat

from ._xp import Array, gather, namespace, normalize, positive_part
from .schedules import (COOL_SD_NORM, COOL_SD_NORMS, Explicit, Exponential, Floored, Linear, Offset, Schedule,  # noqa: F401
                        Uniform, Vector, cool_sd_schedule)

__all__ = [
    "Acceptance", "Resampling", "Schedule", "Verifier",
    "Vanilla", "Scaled", "Lantern", "Typical", "Greedy",
    "Residual", "Optimal", "Target", "LanternResample", "Argmax",
    "Uniform", "Exponential", "Linear", "Explicit", "Offset", "Floored", "Vector", "Level",
    "COOL_SD_NORMS", "COOL_SD_NORM", "cool_sd_schedule", "level",
    "vanilla", "cool_sd", "uniform_rsd", "linear_rsd", "scaled", "lantern", "lantern_pp",
    "typical", "greedy", "lantern_neighbors",
]


class Acceptance(Protocol):
    def __call__(self, p: Array, q: Array, i: int | Array) -> Array: ...


class Resampling(Protocol):
    def __call__(self, p: Array, q: Array, f: Array, rejected: Array | None = None) -> Array: ...


def _as_position(i, p, xp):
    """Position(s) as a float array broadcastable against p.shape[:-1] + (1,)."""
    if isinstance(i, int):
        if i < 1:
            raise ValueError(f"draft position i is 1-based; got i={i}")
        return i
    return xp.astype(xp.asarray(i, device=array_api_compat.device(p)), p.dtype)


def _ratio_min1(num: Array, q: Array, xp) -> Array:
    """min(1, num / q) with the convention 1 where q = 0 (token never drafted)."""
    pos = q > 0
    safe_q = xp.where(pos, q, xp.ones_like(q))
    return xp.where(pos, xp.minimum(xp.ones_like(q), num / safe_q), xp.ones_like(q))


# --------------------------------------------------------------------------- acceptance rules

@dataclass(frozen=True)
class Vanilla:
    """f^van(x) = min(1, p(x)/q(x))  (T1)."""

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        return _ratio_min1(p, q, xp)


@dataclass(frozen=True)
class Scaled:
    """f_i(x) = min(1, w_i p(x)/q(x)) with w_i from a schedule (section 5; w = 1 is vanilla)."""
    schedule: Any

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        w = self.schedule(_as_position(i, p, xp), xp)
        if not isinstance(w, float | int):
            w = w[..., None]
        return _ratio_min1(w * p, q, xp)


@dataclass(frozen=True)
class Level:
    """f_i(x) = v(x) + a_i (1 - v(x)), v = min(1, p/q) the vanilla rule and a_i in [0, 1] from a schedule:
    the chance of keeping a draft vanilla would reject (a = 0: vanilla; a = 1: accept everything).
    The "level" family of ``theory.optimize`` and ``theory.tune``."""
    levels: Any

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        a = self.levels(_as_position(i, p, xp), xp)
        if not isinstance(a, float | int):
            a = a[..., None]
        v = _ratio_min1(p, q, xp)
        return v + a * (1 - v)


@dataclass(frozen=True, eq=False)
class Lantern:
    """LANTERN / LANTERN++ latent-neighbourhood acceptance (section 6).

    ``neighbors`` (V, K) ints: row x lists the other tokens by increasing latent distance (K >= k).
    p~(x) = p(x) + mass(A), A the longest prefix of the k nearest neighbours whose cumulative target
    mass is <= delta (absolute, LANTERN) or <= (lam - 1) p(x) (relative, LANTERN++, lam > 1);
    f(x) = min(1, p~(x)/q(x)).
    """
    neighbors: Any
    k: int
    delta: float | None = None
    lam: float | None = None

    def __post_init__(self):
        if (self.delta is None) == (self.lam is None):
            raise ValueError("Lantern: give exactly one of delta (absolute) or lam (relative)")
        if self.delta is not None and not (0 <= self.delta):
            raise ValueError(f"Lantern: delta must be >= 0, got {self.delta}")
        if self.lam is not None and not (self.lam >= 1):
            raise ValueError(f"Lantern: lam must be >= 1, got {self.lam}")
        K = self.neighbors.shape[-1]
        if not 1 <= self.k <= K:
            raise ValueError(f"Lantern: k must be in [1, {K}] (neighbour table width), got {self.k}")

    def aggregated(self, p: Array) -> Array:
        """p~ (..., V): each token's target mass plus its admitted neighbours' mass."""
        xp = namespace(p)
        V = p.shape[-1]
        nb = xp.asarray(self.neighbors[:, : self.k], device=array_api_compat.device(p))
        if nb.shape[0] != V:
            raise ValueError(f"Lantern: neighbour table has {nb.shape[0]} rows, rows p have V={V}")
        nbp = xp.reshape(xp.take(p, xp.reshape(xp.astype(nb, xp.int64), (-1,)), axis=-1), (*p.shape[:-1], V, self.k))
        c = xp.cumulative_sum(nbp, axis=-1)
        thr = self.delta if self.delta is not None else (self.lam - 1.0) * p
        if not isinstance(thr, float | int):
            thr = thr[..., None]
        mass = xp.max(xp.where(c <= thr, c, xp.zeros_like(c)), axis=-1)
        return p + mass

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        return _ratio_min1(self.aggregated(p), q, xp)


@dataclass(frozen=True)
class Typical:
    """Typical acceptance (Medusa, vLLM; an f_i of section 1): accept x iff p(x) > min(eps, alpha * exp(-H(p)))."""
    eps: float = 0.09
    alpha: float = 0.3

    def __post_init__(self):
        # eps = 0 or alpha = 0 makes the threshold 0: every token the target can emit is accepted (allowed)
        if not (math.isfinite(self.eps) and self.eps >= 0 and math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"typical acceptance needs finite eps >= 0 and alpha >= 0; got eps={self.eps}, "
                             f"alpha={self.alpha}")

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        pos = p > 0
        plogp = xp.where(pos, p * xp.log(xp.where(pos, p, xp.ones_like(p))), xp.zeros_like(p))
        H = -xp.sum(plogp, axis=-1, keepdims=True)
        thr = xp.minimum(xp.full_like(H, self.eps), self.alpha * xp.exp(-H))
        return xp.astype(p > thr, p.dtype)


@dataclass(frozen=True)
class Greedy:
    """Greedy acceptance (an f_i of section 1): accept x iff x = argmax p (first maximiser on ties)."""

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        V = p.shape[-1]
        top = xp.argmax(p, axis=-1)[..., None]
        ar = xp.arange(V, device=array_api_compat.device(p))
        return xp.astype(ar == top, p.dtype)


# --------------------------------------------------------------------------- resampling rules

@dataclass(frozen=True)
class Residual:
    """Vanilla residual G^van = Norm([p - q]_+)  (T1); p itself where p = q."""

    def __call__(self, p, q, f, rejected=None):
        xp = namespace(p, q)
        return normalize(positive_part(p - q, xp), p, xp)


@dataclass(frozen=True)
class Optimal:
    """G* = Norm([p - q f]_+)  (T5). Zero residual mass means beta = 1: G is never used; return p."""

    def __call__(self, p, q, f, rejected=None):
        xp = namespace(p, q, f)
        return normalize(positive_part(p - q * f, xp), p, xp)


@dataclass(frozen=True)
class Target:
    """Resample from the target row itself: G = p (a G_i of section 1; not optimal, T5)."""

    def __call__(self, p, q, f, rejected=None):
        return p


@dataclass(frozen=True)
class Argmax:
    """Greedy correction (a G_i of section 1): G = one-hot at argmax p."""

    def __call__(self, p, q, f, rejected=None):
        return Greedy()(p, q, 1)


@dataclass(frozen=True, eq=False)
class LanternResample:
    """LANTERN's own resampling after rejecting x (section 6), S(x) = {x} + its k+1 nearest neighbours.

    variant "p" (LANTERN, chain): Norm(p with S(x) zeroed), uniform if nothing is left.
    variant "q" (LANTERN++, static tree): q' = Norm(q with S(x) zeroed), then Norm([p - q']_+)
    (p where that residual is empty).
    With ``rejected=None`` the effective law over rejections is returned (section 6); that path
    forms a dense (V, V) neighbourhood mask, so it is meant for the theory engine's moderate V.
    """
    neighbors: Any
    k: int
    variant: str = "p"

    def __post_init__(self):
        if self.variant not in ("p", "q"):
            raise ValueError(f"LanternResample: variant must be 'p' or 'q', got {self.variant!r}")
        K = self.neighbors.shape[-1]
        if self.k + 1 > K:
            raise ValueError(f"LanternResample: needs k+1={self.k + 1} neighbours per token, table has {K}")

    def _mask_rows(self, x: Array, V: int, xp, device) -> Array:
        """(..., V) float mask of S(x) for tokens x (...)."""
        nb = xp.asarray(self.neighbors[:, : self.k + 1], device=device)
        # take on flat indices: a 0-d index would give torch's take a (1, K) result
        rows = xp.reshape(xp.take(xp.astype(nb, xp.int64), xp.reshape(x, (-1,)), axis=0), (*x.shape, self.k + 1))
        S = xp.concat([x[..., None], rows], axis=-1)
        ar = xp.arange(V, device=device)
        return xp.any(S[..., :, None] == ar, axis=-2)

    def _given(self, p, q, inS, xp):
        """G(.|x) for masks inS (..., V) broadcast against p, q."""
        zero = xp.zeros_like(p)
        if self.variant == "p":
            uniform = xp.ones_like(p) / p.shape[-1]
            return normalize(xp.where(inS, zero, p + zero), uniform, xp)
        qz = xp.where(inS, zero, q + zero)
        qn = normalize(qz, zero, xp)
        return normalize(positive_part(p - qn, xp), p + zero, xp)

    def __call__(self, p, q, f, rejected=None):
        xp = namespace(p, q, f)
        V = p.shape[-1]
        dev = array_api_compat.device(p)
        if rejected is not None:
            return self._given(p, q, self._mask_rows(xp.astype(rejected, xp.int64), V, xp, dev), xp)
        # effective law: sum_x w(x) G(.|x) / sum_x w(x), w = q (1 - f)
        w = q * (1 - f)
        tot = xp.sum(w, axis=-1, keepdims=True)
        M = self._mask_rows(xp.arange(V, device=dev), V, xp, dev)  # (V_x, V_y)
        if self.variant == "p":
            keep = xp.astype(~M, p.dtype)
            Z = p @ xp.matrix_transpose(keep)                          # (..., V_x) complement mass
            has = Z > 0
            c = xp.where(has, w / xp.where(has, Z, xp.ones_like(Z)), xp.zeros_like(Z))
            fallback = xp.sum(xp.where(has, xp.zeros_like(w), w), axis=-1, keepdims=True) / V
            mix = p * (c @ keep) + fallback
        else:
            Gx = self._given(p[..., None, :], q[..., None, :], M, xp)  # (..., V_x, V_y)
            mix = xp.sum(w[..., :, None] * Gx, axis=-2)
        empty = tot <= 0
        return xp.where(empty, p, mix / xp.where(empty, xp.ones_like(tot), tot))


# --------------------------------------------------------------------------- verifiers

@dataclass(frozen=True, eq=False)
class Verifier:
    """An acceptance rule f_i and a resampling rule G_i (section 1), with a name and parameters for reports."""
    accept: Any
    resample: Any
    name: str = "custom"
    params: dict = field(default_factory=dict)

    def tables(self, p: Array, q: Array, L: int) -> tuple[Array, Array]:
        """Per-position tables F, G (L, ..., V) on rows p, q (..., V); G is the effective law."""
        xp = namespace(p, q)
        Fs, Gs = [], []
        for i in range(1, L + 1):  # a loop over draft positions (L is small), not over tokens
            f = self.accept(p, q, i)
            Fs.append(f)
            Gs.append(self.resample(p, q, f))
        return xp.stack(Fs), xp.stack(Gs)


def vanilla() -> Verifier:
    """Plain (lossless) speculative decoding (T1)."""
    return Verifier(Vanilla(), Residual(), "vanilla", {})


def scaled(schedule, name: str = "scaled", resample=None) -> Verifier:
    """Scaled acceptance min(1, w_i p/q) with G* (T5) unless another resampler is given."""
    return Verifier(Scaled(schedule), resample or Optimal(), name, {"schedule": schedule})


def cool_sd(delta: float, nu: float = 0.7, mu: float | None = None, norm: str | None = None,
            L: int | None = None) -> Verifier:
    """Cool-SD: exponentially decaying weights (``cool_sd_schedule``; default normalisation
    ``COOL_SD_NORM`` = "offset", w_i = 1 + (delta - 1) exp(-nu (i - 1))) with G* (T5)."""
    sch = cool_sd_schedule(delta, nu, norm, L, mu)
    params = {"delta": delta, "nu": nu, "norm": "mu" if mu is not None else (norm or COOL_SD_NORM)}
    if isinstance(sch, Exponential):
        params["mu"] = sch.offset
    if params["norm"] == "mean":
        params["L"] = L
    return Verifier(Scaled(sch), Optimal(), "cool-sd", params)


def level(levels) -> Verifier:
    """The "level" rule f_i = v + a_i (1 - v) (a schedule of a_i in [0, 1], e.g. ``Explicit``) with G* (T5)."""
    return Verifier(Level(levels), Optimal(), "level", {"levels": levels})


def uniform_rsd(c: float) -> Verifier:
    """UniformRSD: w_i = c at every position, with G* (T5; G* = G^van when c >= 1 by Prop. 1)."""
    return Verifier(Scaled(Uniform(c)), Optimal(), "uniform-rsd", {"c": c})


def linear_rsd(first: float, last: float, L: int) -> Verifier:
    """Linearly decaying weights from w_1 = first to w_L = last (section 5), with G* (T5)."""
    return Verifier(Scaled(Linear(first, last, L)), Optimal(), "linear-rsd", {"first": first, "last": last, "L": L})


def lantern(neighbors, k: int, delta: float, resample: str = "lantern") -> Verifier:
    """LANTERN (section 6, absolute delta) with its own resampler (variant "p") or G* (``resample="optimal"``)."""
    G = LanternResample(neighbors, k, "p") if resample == "lantern" else _named_resampler(resample)
    name = "lantern" if resample == "lantern" else "lantern+G*"
    return Verifier(Lantern(neighbors, k, delta=delta), G, name, {"k": k, "delta": delta})


def lantern_pp(neighbors, k: int, lam: float, resample: str = "lantern") -> Verifier:
    """LANTERN++ (section 6, relative lambda) with its static-tree resampler (variant "q") or G*."""
    G = LanternResample(neighbors, k, "q") if resample == "lantern" else _named_resampler(resample)
    name = "lantern++" if resample == "lantern" else "lantern++G*"
    return Verifier(Lantern(neighbors, k, lam=lam), G, name, {"k": k, "lambda": lam})


def typical(eps: float = 0.09, alpha: float = 0.3) -> Verifier:
    """Typical acceptance (Medusa) with G* (T5) for the correction token."""
    return Verifier(Typical(eps, alpha), Optimal(), "typical", {"eps": eps, "alpha": alpha})


def greedy() -> Verifier:
    """Greedy verification (section 1): accept iff the draft is the target's argmax; correct with the argmax."""
    return Verifier(Greedy(), Argmax(), "greedy", {})


def _named_resampler(name: str):
    table = {"optimal": Optimal(), "residual": Residual(), "target": Target(), "argmax": Argmax()}
    if name not in table:
        raise ValueError(f"unknown resampler {name!r}; choose from {sorted(table)} or 'lantern'")
    return table[name]


def lantern_neighbors(embeddings, K: int | None = None):
    """Neighbour table (V, K) from codebook embeddings (V, d): other tokens by increasing
    Euclidean distance, the token itself excluded (section 6). numpy in, numpy out."""
    import numpy as np

    E = np.asarray(embeddings, dtype=np.float64)
    if E.ndim != 2:
        raise ValueError(f"embeddings must be (V, d), got shape {E.shape}")
    V = E.shape[0]
    K = V - 1 if K is None else K
    if not 1 <= K <= V - 1:
        raise ValueError(f"K must be in [1, {V - 1}], got {K}")
    sq = (E * E).sum(1)
    d2 = sq[:, None] + sq[None, :] - 2 * E @ E.T
    np.fill_diagonal(d2, np.inf)
    order = np.argsort(d2, axis=1, kind="stable")[:, :K]
    return order.astype(np.int64)
