"""Image quality metrics of the zoo: Frechet distance in classifier-feature space and class accuracy.

The Frechet distance between Gaussians N(mu1, S1) and N(mu2, S2) is

    FD = |mu1 - mu2|^2 + tr S1 + tr S2 - 2 tr (S1^{1/2} S2 S1^{1/2})^{1/2},

the squared 2-Wasserstein distance between them (what FID computes on Inception features; here the
features are the 64-dim penultimate activations of the shipped digit classifier).
"""
from __future__ import annotations

import functools

import numpy as np
import scipy.linalg


def _as_features(feats, name: str) -> np.ndarray:
    try:
        import torch

        if isinstance(feats, torch.Tensor):
            feats = feats.detach().cpu().double().numpy()
    except ImportError:  # pragma: no cover - torch is optional for this module
        pass
    f = np.asarray(feats, dtype=np.float64)
    if f.ndim != 2:
        raise ValueError(f"{name} must be (N, d) features, got shape {f.shape}")
    if f.shape[0] < 2:
        raise ValueError(f"{name} needs at least 2 samples for a covariance, got {f.shape[0]}")
    if not np.isfinite(f).all():
        raise ValueError(f"{name} contains NaN or inf")
    return f


def gaussian_stats(feats) -> tuple[np.ndarray, np.ndarray]:
    """(mean (d,), unbiased covariance (d, d)) float64 of features (N, d), N >= 2."""
    f = _as_features(feats, "feats")
    return f.mean(0), np.atleast_2d(np.cov(f, rowvar=False))


def _clean_eigenvalues(w: np.ndarray) -> np.ndarray:
    """Eigenvalues (..., d) of symmetric PSD matrices with round-off removed: values below the rank
    tolerance d * eps * max|w| of their own matrix (numpy.linalg.matrix_rank's) are set to 0. Without
    this an exactly singular covariance leaves eigenvalues of size ~1e-16 whose square roots (~1e-8)
    would leak into the trace."""
    tol = w.shape[-1] * np.finfo(np.float64).eps * np.abs(w).max(axis=-1, keepdims=True, initial=0.0)
    return np.where(w > tol, w, 0.0)


def _psd_sqrt(S: np.ndarray) -> np.ndarray:
    """Symmetric square root of a symmetric PSD matrix (round-off eigenvalues set to 0)."""
    w, U = scipy.linalg.eigh(S)
    return (U * np.sqrt(_clean_eigenvalues(w))) @ U.T


def frechet_distance_stats(mu1, sigma1, mu2, sigma2) -> float:
    """FD between N(mu1, sigma1) and N(mu2, sigma2) (float64), inputs checked (finite, symmetric,
    PSD); the value is ``frechet_distances_to`` of the single pair."""
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    s1, s2 = np.atleast_2d(np.asarray(sigma1, np.float64)), np.atleast_2d(np.asarray(sigma2, np.float64))
    d = mu1.shape[0]
    if mu1.shape != (d,) or mu2.shape != (d,) or s1.shape != (d, d) or s2.shape != (d, d):
        raise ValueError(f"shapes must be mu (d,), sigma (d, d) with one d; got mu1 {mu1.shape}, "
                         f"sigma1 {s1.shape}, mu2 {mu2.shape}, sigma2 {s2.shape}")
    for name, a in (("mu1", mu1), ("sigma1", s1), ("mu2", mu2), ("sigma2", s2)):
        if not np.isfinite(a).all():
            raise ValueError(f"{name} contains NaN or inf")
    for name, s in (("sigma1", s1), ("sigma2", s2)):
        scale = max(np.abs(s).max(), 1.0)
        if np.abs(s - s.T).max() > 1e-8 * scale:
            raise ValueError(f"{name} is not symmetric")
        if scipy.linalg.eigvalsh(s).min() < -1e-8 * scale:
            raise ValueError(f"{name} is not positive semi-definite")
    return float(frechet_distances_to(mu1[None], s1[None], mu2, s2)[0])


def frechet_distances_to(mus, sigmas, mu_ref, sigma_ref) -> np.ndarray:
    """FD (m,) float64 of m Gaussians N(mus[j] (d,), sigmas[j] (d, d)) to one reference
    N(mu_ref (d,), sigma_ref (d, d)); inputs trusted (``frechet_distance_stats`` checks them).

    tr (S^{1/2} R S^{1/2})^{1/2} = tr (R^{1/2} S R^{1/2})^{1/2} is computed from the eigenvalues of
    the *symmetric* PSD matrix R^{1/2} S R^{1/2} (those of S R), with R^{1/2} of the reference taken
    once, instead of ``sqrtm(S @ R)`` on the non-symmetric product: accurate for singular covariances
    (dead ReLU features, fewer samples than dimensions) and never complex; one batched
    ``numpy.linalg.eigvalsh`` over the m matrices (the jackknife's leave-one-out fits). Eigenvalues at
    round-off level (including tiny negative ones) are set to 0, and so is a negative final value (FD
    is a squared distance)."""
    mus, sigmas = np.asarray(mus, np.float64), np.asarray(sigmas, np.float64)
    mu_ref, sigma_ref = np.asarray(mu_ref, np.float64), np.asarray(sigma_ref, np.float64)
    sigmas = (sigmas + np.swapaxes(sigmas, -1, -2)) / 2
    r = _psd_sqrt((sigma_ref + sigma_ref.T) / 2)
    m = r @ sigmas @ r
    cross = np.sqrt(_clean_eigenvalues(np.linalg.eigvalsh((m + np.swapaxes(m, -1, -2)) / 2))).sum(-1)
    fd = ((mus - mu_ref) ** 2).sum(-1) + np.trace(sigmas, axis1=-2, axis2=-1) + np.trace(sigma_ref) - 2.0 * cross
    return np.maximum(fd, 0.0)


def frechet_distance(feats_a, feats_b) -> float:
    """FD between the Gaussian fits of two feature sets (Na, d) and (Nb, d) (numpy or torch)."""
    a, b = _as_features(feats_a, "feats_a"), _as_features(feats_b, "feats_b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"feature dims differ: {a.shape[1]} vs {b.shape[1]}")
    return frechet_distance_stats(*gaussian_stats(a), *gaussian_stats(b))


def image_features(images):
    """Classifier features (N, 64) float64 of images (N, 1, 28, 28) in [-1, 1] (shipped classifier)."""
    from .classifier import features

    return features(images)


@functools.lru_cache(maxsize=1)
def reference_stats() -> tuple[np.ndarray, np.ndarray]:
    """(mean (64,), covariance (64, 64)) float64 of the 1,000 held-out real digits in classifier space (cached)."""
    from .data import heldout_split

    return gaussian_stats(image_features(heldout_split()[0]))


def class_accuracy(images, labels) -> float:
    """Fraction of images (N, 1, 28, 28) the shipped classifier labels as ``labels`` (N,)."""
    import torch

    from .classifier import predict

    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(f"labels must be (N,) with N = {len(images)}, got {tuple(labels.shape)}")
    if len(labels) == 0:
        raise ValueError("class_accuracy of an empty batch is undefined")
    return float((predict(images) == labels.long()).double().mean())
