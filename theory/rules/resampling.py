"""Resampling rules G_i (T1, T5, section 1 of docs/theory.md), written once against the array API.

A resampling rule is called as ``G = rule(p, q, f, rejected=None)`` and returns G (..., V), the law of the token
drawn after a rejection. Rules that depend on the rejected token (LANTERN's own resampler,
``theory.rules.lantern``) use ``rejected`` (...,) ints when given; with ``rejected=None`` they return the
effective law G_eff = sum_x q(x) (1 - f(x)) G(.|x) / (1 - beta) (section 6), which the theory (T3-T9) needs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.xp import namespace, normalize, positive_part
from .acceptance import Greedy

__all__ = ["Residual", "Optimal", "Target", "Argmax"]

# --------------------------------------------------------------------------- resampling rules

@dataclass(frozen=True)
class Residual:
    """Vanilla residual G^van = Norm([p - q]_+)  (T1); p itself where p = q."""
    reads_f = False     # f is not read (``theory.rules.acceptance.reads_f``)

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
    reads_f = False

    def __call__(self, p, q, f, rejected=None):
        return p


@dataclass(frozen=True)
class Argmax:
    """Greedy correction (a G_i of section 1): G = one-hot at argmax p."""
    reads_f = False

    def __call__(self, p, q, f, rejected=None):
        return Greedy()(p, q, 1)


