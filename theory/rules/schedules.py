"""Weight schedules w_i of the scaled acceptance rule min(1, w_i p/q) (docs/theory.md section 5), and
Cool-SD's normalisations (``cool_sd_schedule``). Re-exported by ``theory.rules``.

A schedule is called as ``w = schedule(i, xp)`` with a 1-based position ``i`` (an int, or a float/int
array of positions) and the array namespace ``xp``; it returns a float or an array shaped like ``i``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import array_api_compat

from ..core import checks
from ..core.xp import Array

__all__ = ["Schedule", "Uniform", "Exponential", "Linear", "Explicit", "Vector", "Offset", "Floored",
           "COOL_SD_NORMS", "COOL_SD_NORM", "cool_sd_schedule"]


class Schedule(Protocol):
    def __call__(self, i: int | Array, xp) -> float | Array: ...


def _check_positive(name: str, *values: float) -> None:
    for v in values:
        try:
            checks.real(name, v, 0, lo_open=True)
        except ValueError:
            raise ValueError(f"{name}: weights must be real numbers, finite and > 0, got {checks.brief(v)}") from None


MAX_POSITION = 64       # schedules must give finite weights w_1 .. w_MAX_POSITION (draft positions in use)


@dataclass(frozen=True)
class Uniform:
    """UniformRSD: w_i = c for every position (section 5)."""
    c: float

    def __post_init__(self):
        _check_positive("Uniform schedule (c)", self.c)
        object.__setattr__(self, "c", float(self.c))

    def __call__(self, i, xp):
        return self.c if isinstance(i, int) else self.c * xp.ones_like(i)


@dataclass(frozen=True)
class Exponential:
    """Cool-SD (section 5): w_i = delta * exp(-nu * i - mu). ``mu=None`` normalises to w_1 = delta (mu = -nu)."""
    delta: float
    nu: float = 0.7
    mu: float | None = None

    def __post_init__(self):
        _check_positive("Exponential schedule (delta)", self.delta)
        checks.real("Exponential schedule: nu", self.nu)
        if self.mu is not None:
            checks.real("Exponential schedule: mu", self.mu)
        # the exponent -nu i - offset is linear in i: checking both ends covers every position
        for i in (1, MAX_POSITION):
            e = -float(self.nu) * i - self.offset
            w = self.delta * math.exp(e) if e < 709 else math.inf
            if not math.isfinite(w):  # underflow to 0 is the right limit (f -> 0); overflow is not
                raise ValueError(f"Exponential schedule: nu={self.nu}, mu={self.mu} give weight w_{i} = delta "
                                 f"exp({e:.4g}), which overflows float64 (positions up to {MAX_POSITION} must "
                                 "have finite weights); use a smaller |nu| or |mu|")

    @property
    def offset(self) -> float:
        return -self.nu if self.mu is None else self.mu

    def __call__(self, i, xp):
        if isinstance(i, int):
            return self.delta * math.exp(-self.nu * i - self.offset)
        return self.delta * xp.exp(-self.nu * i - self.offset)


@dataclass(frozen=True)
class Linear:
    """Linear in the position (section 5): w_1 = first, w_L = last (decaying when first > last)."""
    first: float
    last: float
    L: int

    def __post_init__(self):
        _check_positive("Linear schedule", self.first, self.last)
        checks.integer("Linear schedule: L", self.L, lo=1)

    def __call__(self, i, xp):
        slope = 0.0 if self.L == 1 else (self.last - self.first) / (self.L - 1)
        return self.first + slope * (i - 1)


@dataclass(frozen=True)
class Explicit:
    """An explicit weight vector w_1..w_L (section 5); ``zero_ok``: values may be 0 (the levels a_i of
    ``rules.level``, where a = 0 is vanilla)."""
    weights: tuple[float, ...]
    zero_ok: bool = False

    def __post_init__(self):
        if len(self.weights) == 0:
            raise ValueError("Explicit schedule: empty weight vector")
        if self.zero_ok:
            for w in self.weights:
                checks.real("Explicit schedule: weights", w, 0)
        else:
            _check_positive("Explicit schedule", *self.weights)
        object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))

    def __call__(self, i, xp):
        if isinstance(i, int):
            if i > len(self.weights):
                raise ValueError(f"Explicit schedule has {len(self.weights)} weights; position {i} requested")
            return self.weights[i - 1]
        w = xp.asarray(self.weights, dtype=i.dtype, device=array_api_compat.device(i))
        if len(self.weights) < int(xp.max(i)):
            raise ValueError(f"Explicit schedule has {len(self.weights)} weights; position {int(xp.max(i))} requested")
        return xp.take(w, xp.astype(i, xp.int64) - 1, axis=0)


@dataclass(frozen=True, eq=False)
class Vector:
    """Weights w_1..w_L held as an array (numpy / torch / JAX: traceable, so optimisers can differentiate
    through the rule objects; ``theory.likelihood.tune``). An int position above L is an error."""
    weights: Any

    def __call__(self, i, xp):
        w = self.weights
        L = w.shape[0]
        if isinstance(i, int):
            if not 1 <= i <= L:
                raise ValueError(f"Vector schedule has {L} weights; position {i} requested")
            return w[i - 1]
        # array positions are not checked against L (they may be traced by JAX); callers pass i <= L
        idx = xp.reshape(xp.astype(i, xp.int64) - 1, (-1,))
        return xp.reshape(xp.take(w, idx, axis=0), i.shape)


@dataclass(frozen=True)
class Offset:
    """Cool-SD annealed towards vanilla: w_i = 1 + (delta - 1) exp(-nu (i - 1)) (w_1 = delta, w_i -> 1;
    ``cool_sd(norm="offset")``, docs/theory.md section 5)."""
    delta: float
    nu: float = 0.7

    def __post_init__(self):
        _check_positive("Offset schedule (delta)", self.delta)
        checks.real("Offset schedule: nu", self.nu)
        if -float(self.nu) * (MAX_POSITION - 1) >= 709:   # exp overflows float64 at a used position
            raise ValueError(f"Offset schedule: nu={self.nu} makes w_{MAX_POSITION} overflow float64; use a smaller |nu|")

    def __call__(self, i, xp):
        if isinstance(i, int):
            return 1.0 + (self.delta - 1.0) * math.exp(-self.nu * (i - 1))
        return 1.0 + (self.delta - 1.0) * xp.exp(-self.nu * (i - 1))


@dataclass(frozen=True)
class Floored:
    """max(floor, inner(i)) for another schedule (``cool_sd(norm="floor1")``: never stricter than vanilla)."""
    inner: Any
    floor: float = 1.0

    def __post_init__(self):
        if not callable(self.inner) or isinstance(self.inner, type):
            raise TypeError(f"Floored schedule: inner must be a schedule object (a callable (i, xp) -> w_i), got "
                            f"{type(self.inner).__name__}")
        _check_positive("Floored schedule (floor)", self.floor)

    def __call__(self, i, xp):
        w = self.inner(i, xp)
        if isinstance(w, float | int):
            return max(self.floor, float(w))
        return xp.maximum(w, xp.full_like(w, self.floor))


COOL_SD_NORMS = ("offset", "first", "floor1", "mean")
COOL_SD_NORM = "offset"   # the default: the paper's statements hold with it (docs/theory.md section 5)


def cool_sd_schedule(delta: float, nu: float = 0.7, norm: str | None = None, L: int | None = None,
                     mu: float | None = None):
    """Cool-SD's weight schedule under a normalisation of its offset (docs/theory.md section 5):

    * ``"offset"`` (default): w_i = 1 + (delta - 1) exp(-nu (i - 1)): w_1 = delta, annealed towards vanilla (1);
    * ``"first"``: w_i = delta exp(-nu (i - 1)) (w_1 = delta; falls below 1, i.e. stricter than vanilla);
    * ``"floor1"``: w_i = max(1, delta exp(-nu (i - 1))) (as "first", never stricter than vanilla);
    * ``"mean"``: w_i = c exp(-nu (i - 1)) with mean_{i <= L} w_i = delta (needs ``L``).

    ``mu`` (with ``norm=None``) gives the literal w_i = delta exp(-nu i - mu)."""
    if mu is not None:
        if norm is not None:
            raise ValueError(f"cool_sd: give mu (explicit offset) or norm, not both; got mu={mu}, norm={norm!r}")
        return Exponential(delta, nu, mu)
    norm = COOL_SD_NORM if norm is None else norm
    if norm == "offset":
        return Offset(delta, nu)
    if norm == "first":
        return Exponential(delta, nu)
    if norm == "floor1":
        return Floored(Exponential(delta, nu), 1.0)
    if norm == "mean":
        if L is None or isinstance(L, bool) or not isinstance(L, int) or L < 1:
            raise ValueError(f"cool_sd: norm='mean' needs the draft length L (an int >= 1), got L={L!r}")
        # mean_i delta exp(-nu i - mu) = delta  <=>  mu = log(mean_{i=1..L} exp(-nu i))
        m = math.log(sum(math.exp(-nu * i) for i in range(1, L + 1)) / L)
        return Exponential(delta, nu, m)
    raise ValueError(f"cool_sd: norm must be one of {COOL_SD_NORMS}, got {norm!r}")
