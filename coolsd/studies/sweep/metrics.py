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


def frontier_difference(a_x, a_y, a_se, b_x, b_y, b_se, a_xse=None, b_xse=None, extrapolate: bool = False
                        ) -> dict | None:
    """Paired comparison of two frontiers y(x) (quality y, lower is better, against tokens per call x):
    A is interpolated linearly along its points (sorted by x) at every point of B inside A's x range;
    the mean difference A - B over those points is linear in the y's and, through the interpolation, a smooth
    function of the x's. Its variance (delta method; the settings independent, each with its own seeds) is
    sum_k c_k^2 se_k^2 over the y's plus sum_k g_k^2 xse_k^2 over the x's, where for B's point x_b between A's
    points lo < hi, with slope s = (y_hi - y_lo) / (x_hi - x_lo) and w = (x_b - x_lo) / (x_hi - x_lo):
    d y_A(x_b) / d x_b = s, d / d x_lo = -s (1 - w), d / d x_hi = -s w. ``a_xse`` / ``b_xse`` (SEs of the measured
    tokens per call; None: taken as exact) matter as soon as the frontier is steep: an x SE of 0.2 on a slope of
    0.3 nats per token per unit weighs as a y SE of 0.06. A setting's own x and y come from the same images; their
    covariance is left out (positive when more accepted tokens go with more KL, which makes this SE conservative).
    ``extrapolate``: B's points outside A's range are compared along A's nearest segment (continued) instead of left
    out. Returns {"difference", "se", "z", "points", "se_y", "se_x"} or None when no point of B is compared."""
    ax, ay, ase = (np.asarray(v, np.float64) for v in (a_x, a_y, a_se))
    bx, by, bse = (np.asarray(v, np.float64) for v in (b_x, b_y, b_se))
    axse = np.zeros_like(ax) if a_xse is None else np.asarray(a_xse, np.float64)
    bxse = np.zeros_like(bx) if b_xse is None else np.asarray(b_xse, np.float64)
    if axse.shape != ax.shape or bxse.shape != bx.shape:
        raise ValueError(f"frontier_difference: x SEs must match the points, got {axse.shape} for {ax.shape} and "
                         f"{bxse.shape} for {bx.shape}")
    o = np.argsort(ax)
    ax, ay, ase, axse = ax[o], ay[o], ase[o], axse[o]
    inside = (np.array([], int) if len(ax) < 2 else np.arange(len(bx)) if extrapolate else
              np.flatnonzero((bx >= ax[0]) & (bx <= ax[-1])))
    if inside.size == 0:
        return None
    m = inside.size
    ca = np.zeros(len(ax))                  # coefficients of A's y's in the mean difference
    cb = np.zeros(len(bx))
    ga = np.zeros(len(ax))                  # its derivatives in A's x's and B's x's
    gb = np.zeros(len(bx))
    for j in inside:  # a handful of frontier points
        hi = min(max(int(np.searchsorted(ax, bx[j], side="left")), 1), len(ax) - 1)
        lo = hi - 1
        w = 0.0 if ax[hi] == ax[lo] else (bx[j] - ax[lo]) / (ax[hi] - ax[lo])
        s = 0.0 if ax[hi] == ax[lo] else (ay[hi] - ay[lo]) / (ax[hi] - ax[lo])
        ca[lo] += (1 - w) / m
        ca[hi] += w / m
        cb[j] -= 1.0 / m
        gb[j] += s / m
        ga[lo] -= s * (1 - w) / m
        ga[hi] -= s * w / m
    diff = float(ca @ ay + cb @ by)
    var_y = float((ca**2) @ ase**2 + (cb**2) @ bse**2)
    var_x = float((ga**2) @ axse**2 + (gb**2) @ bxse**2)
    se = math.sqrt(var_y + var_x)
    return {"difference": diff, "se": se, "z": diff / se if se > 0 else float("nan"), "points": int(m),
            "se_y": math.sqrt(var_y), "se_x": math.sqrt(var_x)}
