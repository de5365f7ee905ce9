"""Metrics of a sweep with their uncertainty. The Frechet distance itself is ``real.zoo.metrics``'s
(one implementation); this module adds the bootstrap interval, the k-NN precision/recall, the
per-image standard error of tokens per target call and the paired frontier comparison.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["tokens_per_call", "fd_with_ci", "precision_recall", "frontier_difference"]


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


def fd_with_ci(features, ref_stats, n_boot: int = 200, seed: int = 0, level: float = 0.95) -> dict:
    """Frechet distance (``real.zoo.metrics.frechet_distance_stats``) of features (n, d), n >= 3, to a
    reference Gaussian ``ref_stats`` = (mu, sigma), with a BCa bootstrap interval
    (``scipy.stats.bootstrap``: resampling the n generated images, the reference fixed; bias-corrected
    because the plug-in FD is biased upward at finite n, so plain percentiles can miss the estimate) and
    the bootstrap SD. Returns {"fd", "ci": [lo, hi], "se"}."""
    import warnings

    import scipy.stats

    from real.zoo.metrics import frechet_distance_stats, gaussian_stats

    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 3:
        raise ValueError(f"features must be (n, d) with n >= 3, got shape {f.shape}")
    if n_boot < 2 or not 0 < level < 1:
        raise ValueError(f"need n_boot >= 2 and 0 < level < 1, got {n_boot}, {level}")

    def fd_of(idx):
        return frechet_distance_stats(*gaussian_stats(f[np.asarray(idx, dtype=np.int64)]), *ref_stats)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scipy.stats.DegenerateDataWarning)   # tiny n: NaN bounds (reported as null)
        warnings.simplefilter("ignore", RuntimeWarning)
        r = scipy.stats.bootstrap((np.arange(len(f)),), fd_of, vectorized=False, n_resamples=n_boot,
                                  confidence_level=level, method="BCa", rng=np.random.default_rng(seed))
    lo, hi = r.confidence_interval
    return {"fd": float(fd_of(np.arange(len(f)))), "ci": [float(lo), float(hi)], "se": float(r.standard_error)}


def _pairwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distances (na, nb), float64, clipped at 0 against round-off."""
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.sqrt(np.maximum(d2, 0.0))


def _radii(x: np.ndarray, k: int) -> np.ndarray:
    """Distance of each point to its k-th nearest other point of the same set."""
    d = _pairwise(x, x)
    np.fill_diagonal(d, np.inf)
    return np.partition(d, k - 1, axis=1)[:, k - 1]


def precision_recall(real, generated, k: int = 3) -> dict:
    """Improved precision and recall (Kynkaanniemi et al. 2019): the manifold of a set is the union of
    balls around its points with radius the distance to the point's k-th nearest neighbour in the set.
    precision = fraction of generated points inside the real manifold; recall = fraction of real points
    inside the generated manifold. real (n, d), generated (m, d), both with more than k points."""
    r = np.asarray(real, dtype=np.float64)
    g = np.asarray(generated, dtype=np.float64)
    if r.ndim != 2 or g.ndim != 2 or r.shape[1] != g.shape[1]:
        raise ValueError(f"real and generated must be (n, d) with one d, got {r.shape} and {g.shape}")
    if not (isinstance(k, int) and 1 <= k < min(len(r), len(g))):
        raise ValueError(f"k must be an int in [1, {min(len(r), len(g)) - 1}], got {k!r}")
    d = _pairwise(g, r)                                        # (m, n)
    precision = float((d <= _radii(r, k)[None, :]).any(1).mean())
    recall = float((d.T <= _radii(g, k)[None, :]).any(1).mean())
    return {"precision": precision, "recall": recall, "k": k}


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
