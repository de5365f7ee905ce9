"""Image classifier whose penultimate features (64 dims) define the Frechet distance of a zoo
(an "FID in classifier space") and whose predictions give the class accuracy of generated images
(mnist: the digit; natural256: the source photograph).

Public API (shipped weights ``classifier.safetensors`` of each zoo; ``zoo`` defaults to "mnist")::

    features(images (N, C, S, S) in [-1, 1], zoo=) -> (N, 64) float64   penultimate activations
    predict(images, zoo=) -> labels (N,) int64
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import zoos

CHECKPOINT = "classifier.safetensors"


class Classifier(nn.Module):
    """conv(ch) pool conv(2ch) pool conv(2ch) [pool when S / 4 > 8] -> fc(feature_dim) ReLU [features] ->
    fc(n_classes)."""

    def __init__(self, ch: int = 32, feature_dim: int = 64, n_classes: int = 10, dropout: float = 0.3,
                 in_ch: int = 1, image_size: int = 28):
        """Sizes: ``ch`` conv channels, ``feature_dim`` features, ``n_classes`` outputs, ``dropout`` before the
        head; inputs are (N, in_ch, image_size, image_size) (default MNIST's (N, 1, 28, 28))."""
        super().__init__()
        # in_ch / image_size are recorded only when not MNIST's, so its manifest config stays as written
        self.config = dict(ch=ch, feature_dim=feature_dim, n_classes=n_classes, dropout=dropout) | (
            {"in_ch": in_ch, "image_size": image_size} if (in_ch, image_size) != (1, 28) else {})
        grid = image_size // 4
        self.extra_pool = grid > 8
        grid = grid // 2 if self.extra_pool else grid
        self.conv1 = nn.Conv2d(in_ch, ch, 3, padding=1)
        self.conv2 = nn.Conv2d(ch, 2 * ch, 3, padding=1)
        self.conv3 = nn.Conv2d(2 * ch, 2 * ch, 3, padding=1)
        self.fc = nn.Linear(2 * ch * grid * grid, feature_dim)
        self.head = nn.Linear(feature_dim, n_classes)
        self.dropout = nn.Dropout(dropout)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, in_ch, S, S) -> (N, feature_dim) post-ReLU penultimate activations."""
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)  # 28 -> 14 (64 -> 32)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)  # 14 -> 7 (32 -> 16)
        h = F.relu(self.conv3(h))
        if self.extra_pool:
            h = F.max_pool2d(h, 2)                  # (16 -> 8)
        return F.relu(self.fc(h.flatten(1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (N, n_classes)."""
        return self.head(self.dropout(self.features(x)))


@functools.lru_cache(maxsize=4)
def load_classifier(zoo: str = "mnist") -> Classifier:
    """The shipped classifier of ``zoo`` (hash-verified, eval mode, no grad)."""
    from .checkpoint import load_shipped

    return load_shipped(Classifier, CHECKPOINT, zoos.get(zoo).directory)


def _batches(images, zoo: str, batch_size: int):
    """The zoo's images (checked; natural256 also uint8) as float batches in [-1, 1]."""
    check = zoos.get(zoo).data.check_images
    images = torch.as_tensor(images)
    check(images[:0])                                  # the shape check, before any work
    return [check(b) for b in images.split(batch_size)]


@torch.no_grad()
def features(images: torch.Tensor, batch_size: int = 500, zoo: str = "mnist") -> torch.Tensor:
    """Penultimate features (N, 64) float64 of the shipped classifier of ``zoo``."""
    model = load_classifier(zoo)
    out = [model.features(b).double() for b in _batches(images, zoo, batch_size)]
    return torch.cat(out) if out else torch.empty(0, model.config["feature_dim"], dtype=torch.float64)


@torch.no_grad()
def predict(images: torch.Tensor, batch_size: int = 500, zoo: str = "mnist") -> torch.Tensor:
    """Predicted labels (N,) int64 of the shipped classifier of ``zoo``."""
    model = load_classifier(zoo)
    out = [model(b).argmax(1) for b in _batches(images, zoo, batch_size)]
    return torch.cat(out) if out else torch.empty(0, dtype=torch.int64)
