"""Metrics of a sweep with their uncertainty: the per-image standard error of tokens per target call and the paired
frontier comparison; the FD interval and precision/recall come from the quality room (``coolsd.quality.estimators``).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["tokens_per_call", "frontier_difference"]


def tokens_per_call(image_rounds, tokens_per_image: int) -> tuple[float, float]:
    """Tokens per target call T n / sum_i R_i over n images with R_i target calls (rounds) each, and its
    standard error from the per-image values (delta method on the mean of R_i: images are the
    independent units, rounds within an image are not). Returns (value, se); se is NaN for n < 2."""
    r = np.asarray(image_rounds, dtype=np.float64)
    if r.ndim != 1 or r.size == 0 or (r <= 0).any():
        raise ValueError(f"image_rounds must be a non-empty (n,) array of positive counts, got {r!r}")
    m = r.mean()
    value = tokens_per_image / m
    se = tokens_per_image * r.std(ddof=1) / math.sqrt(r.size) / m**2 if r.size > 1 else float("nan")
    return float(value), float(se)


def frontier_difference(a_x, a_y, a_se, b_x, b_y, b_se) -> dict | None:
    """Paired comparison of two frontiers y(x) (quality y, lower is better, against tokens per call x):
    A is interpolated linearly along its points (sorted by x) at every point of B inside A's x range;
    the mean difference A - B over those points and its SE follow exactly from the linear weights,
    the settings being independent (each has its own seeds): Var = sum_k c_k^2 se_k^2.
    Returns {"difference", "se", "z", "points"} or None when no point of B lies inside A's range."""
    ax, ay, ase = (np.asarray(v, np.float64) for v in (a_x, a_y, a_se))
    bx, by, bse = (np.asarray(v, np.float64) for v in (b_x, b_y, b_se))
    o = np.argsort(ax)
    ax, ay, ase = ax[o], ay[o], ase[o]
    inside = np.flatnonzero((bx >= ax[0]) & (bx <= ax[-1])) if len(ax) >= 2 else np.array([], int)
    if inside.size == 0:
        return None
    m = inside.size
    ca = np.zeros(len(ax))                  # coefficients of A's points in the mean difference
    cb = np.zeros(len(bx))
    for j in inside:  # a handful of frontier points
        hi = min(int(np.searchsorted(ax, bx[j], side="left")), len(ax) - 1)
        lo = max(hi - 1, 0)
        w = 0.0 if ax[hi] == ax[lo] else (bx[j] - ax[lo]) / (ax[hi] - ax[lo])
        ca[lo] += (1 - w) / m
        ca[hi] += w / m
        cb[j] -= 1.0 / m
    diff = float(ca @ ay + cb @ by)
    se = float(math.sqrt((ca**2) @ ase**2 + (cb**2) @ bse**2))
    return {"difference": diff, "se": se, "z": diff / se if se > 0 else float("nan"), "points": int(m)}
