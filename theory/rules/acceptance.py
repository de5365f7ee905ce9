"""Acceptance rules f_i (T0, T1, sections 1, 5 and 6 of docs/theory.md), written once against the array API.

An acceptance rule is called as ``f = rule(p, q, i)`` with target rows ``p`` (..., V), draft rows ``q`` (..., V)
and the 1-based draft position ``i`` (an int, or an integer array broadcastable to ``p.shape[:-1]``, e.g. shape
(L,) when p is (..., L, V)). It returns f (..., V): the acceptance probability of every token as if it had been
drafted. Where q(x) = 0 the token is never drafted; f(x) is then set to 1 by convention (Q f = 0 there).
LANTERN's and GSD's rules live in ``theory.rules.lantern`` and ``theory.rules.gsd``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import array_api_compat

from ..core.xp import Array, gather, namespace, ratio_min1

__all__ = ["Acceptance", "Resampling", "accept_at", "reads_f", "Vanilla", "Scaled", "RowScaled", "ROW_FEATURES", "row_feature", "Level", "Typical",
           "Greedy", "RELEASE_ENTROPY_EPS"]


class Acceptance(Protocol):
    def __call__(self, p: Array, q: Array, i: int | Array) -> Array: ...


class Resampling(Protocol):
    def __call__(self, p: Array, q: Array, f: Array, rejected: Array | None = None) -> Array: ...


def accept_at(rule, p: Array, q: Array, i, x: Array) -> Array:
    """f_i at the given tokens: (...,) from rows p, q (..., V), position(s) i (an int, or an integer array
    broadcastable to x's shape) and tokens x (...,) ints. The verifiers' sparse entry (the engine decides a drafted
    token from that token alone): a rule's own point formula ``rule.at(p, q, i, x)`` where it has one (every
    built-in rule: O(1) per token for the ratio rules, O(k) for LANTERN's, O(V) for a rule of the whole row such
    as typical's entropy), else the dense row gathered, ``gather(rule(p, q, i), x)`` (a user's rule). Equal to
    ``gather(rule(p, q, i), x)`` bit for bit (tests/test_sparse_accept.py): the dense rows are the same formula
    applied at every code."""
    at = getattr(rule, "at", None)
    if at is not None:
        return at(p, q, i, x)
    return gather(rule(p, q, i), x)


def reads_f(rule) -> bool:
    """Whether a resampling rule reads the acceptance row f when given the rejected token (G* does: Norm([p - q f]_+);
    the vanilla residual, LANTERN's released laws, the target and the argmax do not). A rule without the attribute
    ``reads_f`` is assumed to read it: a caller may then pass f=None to the others and skip the dense row."""
    return bool(getattr(rule, "reads_f", True))


def _weight_at(schedule, i, p, xp):
    """The schedule's value(s) at position(s) i for point formulas: a scalar, or an array broadcastable to the
    tokens' shape (no trailing V axis; the same values as ``_schedule_at``)."""
    return schedule(_as_position(i, p, xp), xp)


def _as_position(i, p, xp):
    """Position(s) as a float array broadcastable against p.shape[:-1] + (1,)."""
    if isinstance(i, int):
        if i < 1:
            raise ValueError(f"draft position i is 1-based; got i={i}")
        return i
    return xp.astype(xp.asarray(i, device=array_api_compat.device(p)), p.dtype)


def check_schedule(who: str, schedule) -> None:
    """A per-position schedule is a callable (i, xp) -> w_i (``theory.rules.schedules``): anything else (None, a
    number, an array) is a one-line TypeError naming ``who`` (before any row is verified)."""
    if not callable(schedule) or isinstance(schedule, type):
        raise TypeError(f"{who}: schedule must be a schedule object (theory.rules: Uniform, Explicit, Offset, ...; a "
                        f"callable (i, xp) -> w_i), got {type(schedule).__name__}")


def _schedule_at(schedule, i, p, xp):
    """A per-position schedule's value(s) at draft position(s) i (``_as_position``): a scalar, or an array
    with a trailing axis added so that it broadcasts against rows p (..., V)."""
    w = schedule(_as_position(i, p, xp), xp)
    return w if isinstance(w, float | int) else w[..., None]




# --------------------------------------------------------------------------- acceptance rules

@dataclass(frozen=True)
class Vanilla:
    """f^van(x) = min(1, p(x)/q(x))  (T1)."""

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        return ratio_min1(p, q, xp)

    def at(self, p, q, i, x):
        xp = namespace(p, q)
        return ratio_min1(gather(p, x, xp), gather(q, x, xp), xp)


@dataclass(frozen=True)
class Scaled:
    """f_i(x) = min(1, w_i p(x)/q(x)) with w_i from a schedule (section 5; w = 1 is vanilla)."""
    schedule: Any

    def __post_init__(self):
        check_schedule("scaled acceptance", self.schedule)

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        return ratio_min1(_schedule_at(self.schedule, i, p, xp) * p, q, xp)

    def at(self, p, q, i, x):
        xp = namespace(p, q)
        return ratio_min1(_weight_at(self.schedule, i, p, xp) * gather(p, x, xp), gather(q, x, xp), xp)


ROW_FEATURES = ("entropy", "maxp")   # what a row-conditioned weight may depend on (``RowScaled``)


def row_feature(p, feature: str, xp=None):
    """A feature of target rows p (..., V) -> (..., 1): ``"entropy"`` H(p) = -sum_{p > 0} p log p (nats; the row as
    given, 0 log 0 = 0) or ``"maxp"`` max_x p(x). The one place both ``RowScaled`` and the exact-law objective
    (``theory.likelihood.objective``) compute it, so that they see the same number."""
    xp = xp or namespace(p)
    if feature == "entropy":
        pos = p > 0
        plogp = xp.where(pos, p * xp.log(xp.where(pos, p, xp.ones_like(p))), xp.zeros_like(p))
        return -xp.sum(plogp, axis=-1, keepdims=True)
    if feature == "maxp":
        return xp.max(p, axis=-1, keepdims=True)
    raise ValueError(f"row feature must be one of {ROW_FEATURES}, got {feature!r}")


@dataclass(frozen=True, eq=False)
class RowScaled:
    """Row-conditioned scaled acceptance (docs/theory.md section 8c): f_i(x) = min(1, w_i(p) p(x)/q(x)) with
    w_i(p) = c_i exp(b phi(p)), c_i > 0 from a schedule, b the ``slope`` (a float, or a 0-d array: traceable) and
    phi = ``row_feature(p, feature)`` of the target row the draft is verified against (its entropy, or its largest
    probability). b = 0 is ``Scaled(schedule)``; b > 0 with the entropy relaxes more where many tokens are nearly
    equally likely (LANTERN's premise). Pair it with G* (T5): ``rules.row_scaled``."""
    schedule: Any
    slope: Any = 0.0
    feature: str = "entropy"

    def __post_init__(self):
        check_schedule("row-scaled acceptance", self.schedule)
        if self.feature not in ROW_FEATURES:
            raise ValueError(f"row-scaled acceptance: feature must be one of {ROW_FEATURES}, got {self.feature!r}")
        if isinstance(self.slope, (int, float)) and (isinstance(self.slope, bool) or not math.isfinite(self.slope)):
            raise ValueError(f"row-scaled acceptance: slope must be a finite number, got {self.slope!r}")

    def weight(self, p, i, xp=None):
        """w_i(p) (..., 1) (or broadcastable) for rows p (..., V) at position(s) i."""
        xp = xp or namespace(p)
        return _schedule_at(self.schedule, i, p, xp) * xp.exp(self.slope * row_feature(p, self.feature, xp))

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        return ratio_min1(self.weight(p, i, xp) * p, q, xp)

    def at(self, p, q, i, x):
        xp = namespace(p, q)
        return ratio_min1(self.weight(p, i, xp)[..., 0] * gather(p, x, xp), gather(q, x, xp), xp)


# the constant inside the log of the released entropy (vLLM's typical acceptance sampler and Medusa write
# -sum p log(p + 1e-5)); it makes H smaller than the exact entropy, hence exp(-H) and the threshold larger
RELEASE_ENTROPY_EPS = 1e-5


@dataclass(frozen=True)
class Level:
    """f_i(x) = v(x) + a_i (1 - v(x)), v = min(1, p/q) the vanilla rule and a_i in [0, 1] from a schedule:
    the chance of keeping a draft vanilla would reject (a = 0: vanilla; a = 1: accept everything).
    The "level" family of ``theory.optimize`` and ``theory.tune``."""
    levels: Any

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        a = _schedule_at(self.levels, i, p, xp)
        v = ratio_min1(p, q, xp)
        return v + a * (1 - v)

    def at(self, p, q, i, x):
        xp = namespace(p, q)
        a = _weight_at(self.levels, i, p, xp)
        v = ratio_min1(gather(p, x, xp), gather(q, x, xp), xp)
        return v + a * (1 - v)




@dataclass(frozen=True)
class Typical:
    """Typical acceptance (Medusa, vLLM; an f_i of section 1): accept x iff p(x) > min(eps, alpha * exp(-H(p))).

    ``entropy="release"`` (default): H = -sum p log(p + 1e-5), as vLLM's sampler and Medusa compute it;
    ``entropy="exact"``: H = -sum p log p (0 log 0 = 0), our earlier variant.
    """
    eps: float = 0.09
    alpha: float = 0.3
    entropy: str = "release"

    def __post_init__(self):
        # eps = 0 or alpha = 0 makes the threshold 0: every token the target can emit is accepted (allowed)
        if not (math.isfinite(self.eps) and self.eps >= 0 and math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"typical acceptance needs finite eps >= 0 and alpha >= 0; got eps={self.eps}, "
                             f"alpha={self.alpha}")
        if self.entropy not in ("release", "exact"):
            raise ValueError(f"typical acceptance: entropy must be 'release' or 'exact', got {self.entropy!r}")

    def threshold(self, p, xp=None):
        """min(eps, alpha exp(-H(p))) (..., 1) for rows p (..., V): a token x is accepted iff p(x) exceeds it."""
        xp = xp or namespace(p)
        if self.entropy == "release":
            H = -xp.sum(p * xp.log(p + RELEASE_ENTROPY_EPS), axis=-1, keepdims=True)
        else:
            pos = p > 0
            plogp = xp.where(pos, p * xp.log(xp.where(pos, p, xp.ones_like(p))), xp.zeros_like(p))
            H = -xp.sum(plogp, axis=-1, keepdims=True)
        return xp.minimum(xp.full_like(H, self.eps), self.alpha * xp.exp(-H))

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        return xp.astype(p > self.threshold(p, xp), p.dtype)

    def at(self, p, q, i, x):
        xp = namespace(p, q)
        return xp.astype(gather(p, x, xp) > self.threshold(p, xp)[..., 0], p.dtype)


@dataclass(frozen=True)
class Greedy:
    """Greedy acceptance (an f_i of section 1): accept x iff x = argmax p (first maximiser on ties)."""

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        V = p.shape[-1]
        top = xp.argmax(p, axis=-1)[..., None]
        ar = xp.arange(V, device=array_api_compat.device(p))
        return xp.astype(ar == top, p.dtype)

    def at(self, p, q, i, x):
        xp = namespace(p, q)
        return xp.astype(xp.argmax(p, axis=-1) == x, p.dtype)

