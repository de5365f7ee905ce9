"""The image-quality statistics no maintained library provides, kept in the quality room (``coolsd.quality``): the
delete-one (or delete-a-group) jackknife interval of the Frechet distance (the distance itself is
``real.zoo.metrics``'s, one implementation) and the k-NN precision/recall of Kynkaanniemi et al. 2019. The studies
(``coolsd.studies``) use them; nothing here imports a study.
"""
from __future__ import annotations


import numpy as np

__all__ = ["fd_with_ci", "precision_recall", "MIN_RELIABLE_IMAGES"]

_JACKKNIFE_BLOCK = 512   # leave-one-out fits per batched eigen-solve: (512, 64, 64) float64 = 17 MB
_DISTANCE_ROWS = 1024    # rows of a distance block: (1024, n) float64 per block, never (n, n) at once


MIN_RELIABLE_IMAGES = 64    # below, a setting's FD interval is too wide (and may reach below 0) to compare settings


def fd_with_ci(features, ref_stats, level: float = 0.95, groups: int | None = None) -> dict:
    """Frechet distance (``real.zoo.metrics.frechet_distance_stats``) of features (n, d), n >= 3, to a
    reference Gaussian ``ref_stats`` = (mu, sigma), with its jackknife standard error and the normal
    interval fd +- z SE (the reference is fixed). Returns {"fd", "ci": [lo, hi], "se"}.

    ``groups`` None: the delete-one jackknife (n fits). An int g in [3, n]: the delete-a-group jackknife over
    g contiguous groups of near-equal size, SE^2 = (g - 1) / g sum_j (fd_(j) - mean)^2 (exact for equal groups;
    the generated images are independent, so contiguous groups are a random split), g eigen-solves instead of
    n: what Inception's d = 2048 at n = 50,000 needs (one 2048 x 2048 solve per fit).

    The interval is for the plug-in FD at this n (what settings with equal n are compared on), not for
    the n -> infinity FD, which the plug-in overestimates. Why not the bootstrap: resampling with
    replacement duplicates images, which biases the 64-d covariance; on the shipped classifier's
    features the bootstrap SD overstates the spread of FD over independent samples 1.6-1.8x (n = 200:
    10.6 vs 6.0; n = 1000: 2.0 vs 1.2-1.3), its percentile interval need not contain the estimate and
    BCa is undefined (no resample below the estimate), while the jackknife SE matches (7.4, 1.3).
    Leave-one-out statistics come from rank-one updates of the mean and covariance (no refit), leave-group-out
    ones from the totals minus the group's sums; their FDs from ``real.zoo.metrics.frechet_distances_to`` in
    blocks of ``_JACKKNIFE_BLOCK`` fits."""
    from real.zoo.metrics import frechet_distance_stats, frechet_distances_to, gaussian_stats
    from scipy.stats import norm

    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 3:
        raise ValueError(f"features must be (n, d) with n >= 3, got shape {f.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    n = len(f)
    if groups is not None and not (isinstance(groups, int) and 3 <= groups <= n):
        raise ValueError(f"groups must be None or an int in [3, n = {n}], got {groups!r}")
    mu, sigma = gaussian_stats(f)
    fd = frechet_distance_stats(mu, sigma, *ref_stats)      # also checks the reference
    dev = f - mu
    S = (n - 1) * sigma                                     # scatter matrix
    if groups is None:
        jk = np.empty(n)
        for a in range(0, n, _JACKKNIFE_BLOCK):  # blocks bound the (block, d, d) memory, not a per-sample loop
            dv = dev[a:a + _JACKKNIFE_BLOCK]
            m_i = mu - dv / (n - 1)
            S_i = S - (n / (n - 1)) * dv[:, :, None] * dv[:, None, :]
            jk[a:a + len(dv)] = frechet_distances_to(m_i, S_i / (n - 2), *ref_stats)
        se = float(np.sqrt((n - 1) / n * ((jk - jk.mean()) ** 2).sum()))
    else:
        bounds = np.linspace(0, n, groups + 1).round().astype(int)
        jk = np.empty(groups)
        for a in range(0, groups, _JACKKNIFE_BLOCK):  # blocks of groups bound the (block, d, d) memory
            idx = range(a, min(a + _JACKKNIFE_BLOCK, groups))
            # the rest's sums about the global mean: sum dev = 0, so the rest's is minus the group's
            sums = np.stack([dev[bounds[j]:bounds[j + 1]].sum(0) for j in idx])     # one (d,) per group
            scat = np.stack([dev[bounds[j]:bounds[j + 1]].T @ dev[bounds[j]:bounds[j + 1]] for j in idx])
            m = np.array([n - (bounds[j + 1] - bounds[j]) for j in idx], np.float64)
            rest_mean = -sums / m[:, None]
            S_j = (S - scat) - m[:, None, None] * rest_mean[:, :, None] * rest_mean[:, None, :]
            jk[a:a + len(idx)] = frechet_distances_to(mu + rest_mean, S_j / (m[:, None, None] - 1), *ref_stats)
        se = float(np.sqrt((groups - 1) / groups * ((jk - jk.mean()) ** 2).sum()))
    z = float(norm.ppf(0.5 + level / 2))
    return {"fd": float(fd), "ci": [float(fd - z * se), float(fd + z * se)], "se": se}


def _sq_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances (na, nb), float64, clipped at 0 against round-off."""
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)


def _radii2(x: np.ndarray, k: int) -> np.ndarray:
    """Squared distance (n,) of each point of x (n, d) to its k-th nearest other point of x, computed
    in blocks of ``_DISTANCE_ROWS`` rows."""
    out = np.empty(len(x))
    for a in range(0, len(x), _DISTANCE_ROWS):  # row blocks bound memory; each block is vectorised
        d = _sq_distances(x[a:a + _DISTANCE_ROWS], x)
        d[np.arange(len(d)), a + np.arange(len(d))] = np.inf      # not its own neighbour
        out[a:a + len(d)] = np.partition(d, k - 1, axis=1)[:, k - 1]
    return out


def _inside(points: np.ndarray, centres: np.ndarray, radii2: np.ndarray) -> np.ndarray:
    """(n_points,) bool: whether each point lies in a ball (centre, squared radius) of the set."""
    out = np.empty(len(points), bool)
    for a in range(0, len(points), _DISTANCE_ROWS):  # row blocks bound memory
        out[a:a + _DISTANCE_ROWS] = (_sq_distances(points[a:a + _DISTANCE_ROWS], centres) <= radii2[None, :]).any(1)
    return out


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
    precision = float(_inside(g, r, _radii2(r, k)).mean())
    recall = float(_inside(r, g, _radii2(g, k)).mean())
    return {"precision": precision, "recall": recall, "k": k}
