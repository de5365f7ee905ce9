"""The metric arithmetic, from torchmetrics on features computed once (``extractors``):

* FID: ``torchmetrics.image.FrechetInceptionDistance`` (its custom-feature path: the "network" is the identity
  on the features we feed it; the reference side's running sums are set from the reference Gaussian, which is
  exact up to float64 round-off and lets a published mu/sigma be the reference);
* KID: ``KernelInceptionDistance`` (cubic polynomial kernel, subsets of ``subset_size``);
* IS: ``InceptionScore`` on the extractor's logits (10 splits, torchmetrics' default);
* CLIP score: ``torchmetrics.multimodal.CLIPScore`` (``coolsd.quality.clip``).

What the library lacks stays ours (``coolsd.quality.estimators``): the delete-one jackknife interval of FD
(our point estimate must equal the library's: ``fid_with_ci`` checks it on every call) and improved
precision/recall (Kynkaanniemi et al. 2019, k = 3 as in ADM's evaluator; torchmetrics has none, torch-fidelity's
needs torchvision). sFID (ADM's ``mixed_6/conv`` spatial features) is in neither library: not computed.
Random subsets (KID) and the IS permutation draw from a seeded generator (``fork_rng``) so reruns agree. Every
metric object is built with ``sync_on_compute=False``: under torchrun each rank scores its own settings, and
torchmetrics' default would all-reduce the states of different settings across the ranks at ``compute``
(the FD agreement check caught exactly that).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from .reference import Reference

__all__ = ["fid", "fid_with_ci", "kid", "inception_score", "precision_recall", "fd_agreement"]

def fd_agreement(features, sigma_ref) -> float:
    """How far our FD (``real.zoo.metrics``: eigenvalues of the symmetric R^1/2 S R^1/2, round-off eigenvalues
    set to 0) and torchmetrics' (sqrt of the eigenvalues of the non-symmetric S R, taken as they come) may
    differ: 1e-9 of tr S + tr R for the solvers' relative round-off, plus, for a singular product (n <= d,
    dead features), the library's square roots of its round-off eigenvalues, at most d of them of size
    eps ||S|| ||R|| each, counted twice (the trace term is doubled): 2 d sqrt(eps ||S||_2 ||R||_2)."""
    f = np.asarray(features, np.float64)
    S = np.atleast_2d(np.cov(f, rowvar=False))
    R = np.asarray(sigma_ref, np.float64)
    eps = np.finfo(np.float64).eps
    norms = np.linalg.norm(S, 2) * np.linalg.norm(R, 2)
    return float(1e-9 * (np.trace(S) + np.trace(R)) + 2 * S.shape[0] * np.sqrt(eps * norms))


class _Given(torch.nn.Module):
    """The identity "feature network": torchmetrics' metrics then run their arithmetic on features we computed."""

    def __init__(self, d: int):
        super().__init__()
        self.num_features = int(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _ref(ref, who: str) -> Reference:
    """The reference statistics argument of ``who``: a ``coolsd.quality.Reference`` (``load_reference``), else a
    one-line TypeError (None, a path, a dict)."""
    if not isinstance(ref, Reference):
        raise TypeError(f"{who}: ref must be a coolsd.quality.Reference (coolsd.quality.load_reference(path, "
                        f"extractor)), got {type(ref).__name__}")
    return ref


def _as(f, name: str, d: int | None = None) -> torch.Tensor:
    if f is None or isinstance(f, (str, bytes, dict)):
        raise TypeError(f"{name} must be an (n, d) array of features, got {type(f).__name__}")
    f = np.asarray(f, np.float64)
    if f.ndim != 2 or len(f) < 2 or (d is not None and f.shape[1] != d):
        raise ValueError(f"{name} must be (n, {d if d is not None else 'd'}) features with n >= 2, got {f.shape}")
    if not np.isfinite(f).all():
        raise ValueError(f"{name} contains NaN or inf")
    return torch.from_numpy(f)


def fid(ref: Reference, features) -> float:
    """torchmetrics' FID between generated features (n, d) and the reference Gaussian (float64)."""
    _ref(ref, "fid")
    from torchmetrics.image.fid import FrechetInceptionDistance

    d = ref.mu.shape[0]
    f = _as(features, "features", d)
    m = FrechetInceptionDistance(feature=_Given(d), reset_real_features=False, sync_on_compute=False)
    n = ref.n if ref.n is not None else 2     # only n mu and (n - 1) sigma + n mu mu^T enter: any n >= 2 is exact
    mu, sigma = torch.from_numpy(ref.mu), torch.from_numpy(ref.sigma)
    m.real_features_sum = n * mu
    m.real_features_cov_sum = (n - 1) * sigma + n * torch.outer(mu, mu)
    m.real_features_num_samples = torch.tensor(n)
    m.update(f, real=False)
    return float(m.compute())


# delete-one jackknife while n d^3 (its eigen-solve work) stays under this (MNIST: 18,000 x 64^3 = 4.7e9, ~1 min);
# beyond it (Inception: 50,000 x 2048^3) the delete-a-group jackknife over JACKKNIFE_GROUPS groups
DELETE_ONE_BUDGET = 1e10
JACKKNIFE_GROUPS = 50


def fid_with_ci(ref: Reference, features, level: float = 0.95) -> dict:
    """{"fd", "ci", "se", "se_method"}: torchmetrics' FID with our jackknife SE around it
    (``coolsd.quality.estimators.fd_with_ci``: delete-one, or delete-a-group over ``JACKKNIFE_GROUPS`` groups
    when n d^3 > ``DELETE_ONE_BUDGET``), whose own point estimate must agree with the library's within
    ``fd_agreement``, else RuntimeError."""
    _ref(ref, "fid_with_ci")
    from scipy.stats import norm

    from .estimators import fd_with_ci

    lib = fid(ref, features)
    f = np.asarray(features, np.float64)
    groups = None if len(f) * f.shape[1] ** 3 <= DELETE_ONE_BUDGET else min(len(f), JACKKNIFE_GROUPS)
    ours = fd_with_ci(f, (ref.mu, ref.sigma), level=level, groups=groups)
    tol = fd_agreement(features, ref.sigma)
    if abs(ours["fd"] - lib) > tol:
        raise RuntimeError(f"our FD {ours['fd']!r} and torchmetrics' {lib!r} disagree beyond round-off ({tol:.3g})")
    z = float(norm.ppf(0.5 + level / 2))
    how = "delete-one jackknife" if groups is None else f"delete-a-group jackknife ({groups} groups)"
    return {"fd": lib, "ci": [lib - z * ours["se"], lib + z * ours["se"]], "se": ours["se"], "se_method": how}


def kid(ref: Reference, features, subsets: int = 100, subset_size: int = 1000, seed: int = 0) -> dict:
    """torchmetrics' KID (mean and std over ``subsets`` random subsets of min(subset_size, n, m) samples) of
    generated features (n, d) against the reference features (m, d); None when the reference has no features
    (statistics only)."""
    _ref(ref, "kid")
    from torchmetrics.image.kid import KernelInceptionDistance

    if ref.features is None:
        return {"kid": None, "kid_std": None, "kid_subset_size": None}
    f = _as(features, "features", ref.mu.shape[0])
    r = _as(ref.features, "reference features", ref.mu.shape[0])
    size = int(min(subset_size, len(f), len(r)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*save all extracted features.*")
        m = KernelInceptionDistance(feature=_Given(f.shape[1]), subsets=subsets, subset_size=size,
                                        sync_on_compute=False)
    m.update(r, real=True)
    m.update(f, real=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mean, std = m.compute()
    return {"kid": float(mean), "kid_std": float(std), "kid_subset_size": size}


def inception_score(logits, splits: int = 10, seed: int = 0) -> dict:
    """torchmetrics' Inception Score (mean, std over ``splits`` splits) of logits (n, k); None without logits."""
    from torchmetrics.image.inception import InceptionScore

    if logits is None:
        return {"inception_score": None, "inception_score_std": None}
    lg = _as(logits, "logits")
    if len(lg) < splits:
        raise ValueError(f"inception_score needs at least splits = {splits} images, got {len(lg)}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*save all extracted features.*")   # n logits: small
        m = InceptionScore(feature=_Given(lg.shape[1]), splits=splits, sync_on_compute=False)
    m.update(lg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mean, std = m.compute()
    return {"inception_score": float(mean), "inception_score_std": float(std)}


def precision_recall(ref: Reference, features, k: int = 3) -> dict:
    """Improved precision/recall (``coolsd.quality.estimators.precision_recall``; no maintained library
    here has it) with k = min(k, n - 1); None values when the reference has no features or n <= 1."""
    _ref(ref, "precision_recall")
    from .estimators import precision_recall as pr

    f = np.asarray(features, np.float64)
    k = min(k, len(f) - 1, (len(ref.features) - 1) if ref.features is not None else 0)
    if ref.features is None or k < 1:
        return {"precision": None, "recall": None, "precision_recall_k": None}
    out = pr(ref.features, f, k=k)
    return {"precision": out["precision"], "recall": out["recall"], "precision_recall_k": out["k"]}

