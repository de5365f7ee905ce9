"""Quality measures of ``coolsd demo``: Frechet distance to the held-out digits in the shipped
classifier's space (jackknife SE, as the sweep), the target's NLL per token of generated codes (SE over images), and the
floors real digits reach at the same sample size."""
from __future__ import annotations

import math

import numpy as np
import torch


def fd_with_se(images: torch.Tensor) -> tuple[float, float]:
    """Frechet distance to the held-out digits and its delete-one jackknife standard error: the sweep's
    interval (``coolsd.quality.estimators.fd_with_ci``; the bootstrap overstates the spread 1.6-1.8x)."""
    if not (isinstance(images, torch.Tensor) and images.ndim == 4 and images.shape[0] >= 2):
        raise TypeError(f"fd_with_se: images must be a (N >= 2, C, H, W) tensor, got {getattr(images, 'shape', type(images).__name__)}")
    from coolsd.quality.estimators import fd_with_ci
    from real.zoo.metrics import image_features, reference_stats

    r = fd_with_ci(image_features(images).numpy(), reference_stats())
    return r["fd"], r["se"]


_NLL_BLOCK = 1000   # images per teacher-forced forward of the NLL


def _model_labels_tokens(who: str, target, labels, tokens) -> None:
    """The shipped target (a torch module) and (N,) class / (N, T) token tensors: TypeError naming ``who``."""
    if not isinstance(target, torch.nn.Module):
        raise TypeError(f"{who}: target must be the shipped target model (a torch module), got {type(target).__name__}")
    if not (isinstance(labels, torch.Tensor) and isinstance(tokens, torch.Tensor) and tokens.ndim == 2
            and labels.shape == tokens.shape[:1]):
        raise TypeError(f"{who}: labels (N,) and tokens (N, T) must be tensors, got {type(labels).__name__} and "
                        f"{type(tokens).__name__}")


@torch.no_grad()
def per_image_nll(target, labels: torch.Tensor, tokens: torch.Tensor) -> np.ndarray:
    """Target NLL per token of each generated image's codes (N, 49) given its class: (N,) float64."""
    _model_labels_tokens("per_image_nll", target, labels, tokens)
    import torch.nn.functional as F

    from real.zoo.gpt import train_logits

    out = []
    for a in range(0, len(tokens), _NLL_BLOCK):  # image blocks bound the (block, 49, V) logits
        y, c = labels[a:a + _NLL_BLOCK], tokens[a:a + _NLL_BLOCK]
        logits = train_logits(target, y, c)
        out.append(F.cross_entropy(logits.transpose(1, 2), c.to(logits.device), reduction="none").mean(1))
    return torch.cat(out).cpu().double().numpy()


def nll_with_se(target, labels: torch.Tensor, tokens: torch.Tensor) -> dict:
    """Target NLL per token of generated codes (N, 49) given their classes, and its SE over the N images
    (relaxed rules move the output away from the target's law; vanilla and plain AR sample it exactly)."""
    per_image = per_image_nll(target, labels, tokens)
    return {"nll_per_token": float(per_image.mean()),
            "nll_per_token_se": float(per_image.std(ddof=1) / math.sqrt(len(per_image)))}


def real_floor(n: int, seed: int, repeats: int = 5) -> dict:
    """FD of n real train digits (never generated) to the held-out digits: the floor any generator faces
    at this sample size (mean and sd over random subsets)."""
    from real.zoo import data
    from real.zoo.metrics import frechet_distance_stats, gaussian_stats, image_features, reference_stats

    x, _ = data.train_split()
    f = image_features(x).numpy()
    rng = np.random.default_rng(seed)
    vals = [frechet_distance_stats(*gaussian_stats(f[rng.choice(len(f), n, replace=False)]), *reference_stats())
            for _ in range(repeats)]
    return {"n": n, "mean": float(np.mean(vals)), "sd": float(np.std(vals, ddof=1))}


def manifest_floor():
    """The FD of the classifier's training digits (train n) to the held-out digits recorded in the
    checkpoint manifest, or None when the manifest has no such entry."""
    from real.zoo.checkpoint import read_manifest

    try:
        return read_manifest()["files"]["classifier.safetensors"]["quality"]["fd_train_n_vs_heldout"]
    except KeyError:
        return None

