"""Digit classifier whose penultimate features (64 dims) define the Frechet distance of this zoo
(an "FID in classifier space") and whose predictions give the class accuracy of generated digits.

Public API (shipped weights ``checkpoints/classifier.safetensors``)::

    features(images (N, 1, 28, 28) in [-1, 1]) -> (N, 64) float64   penultimate activations
    predict(images) -> labels (N,) int64
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import data

CHECKPOINT = "classifier.safetensors"


class Classifier(nn.Module):
    """conv(ch) pool conv(2ch) pool conv(2ch) -> fc(feature_dim) ReLU [features] -> fc(10)."""

    def __init__(self, ch: int = 32, feature_dim: int = 64, n_classes: int = 10, dropout: float = 0.3):
        """Sizes: ``ch`` conv channels, ``feature_dim`` features, ``n_classes`` outputs, ``dropout`` before the
        head; inputs are (N, 1, 28, 28)."""
        super().__init__()
        self.config = dict(ch=ch, feature_dim=feature_dim, n_classes=n_classes, dropout=dropout)
        self.conv1 = nn.Conv2d(1, ch, 3, padding=1)
        self.conv2 = nn.Conv2d(ch, 2 * ch, 3, padding=1)
        self.conv3 = nn.Conv2d(2 * ch, 2 * ch, 3, padding=1)
        self.fc = nn.Linear(2 * ch * 7 * 7, feature_dim)
        self.head = nn.Linear(feature_dim, n_classes)
        self.dropout = nn.Dropout(dropout)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 1, 28, 28) -> (N, feature_dim) post-ReLU penultimate activations."""
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)  # 28 -> 14
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)  # 14 -> 7
        h = F.relu(self.conv3(h))
        return F.relu(self.fc(h.flatten(1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (N, n_classes)."""
        return self.head(self.dropout(self.features(x)))


@functools.lru_cache(maxsize=1)
def load_classifier() -> Classifier:
    """The shipped classifier (hash-verified, eval mode, no grad)."""
    from .checkpoint import load_shipped

    return load_shipped(Classifier, CHECKPOINT)


@torch.no_grad()
def features(images: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    """Penultimate features (N, 64) float64 of the shipped classifier."""
    model = load_classifier()
    images = data.check_images(images)
    out = [model.features(b).double() for b in images.split(batch_size)]
    return torch.cat(out) if out else torch.empty(0, model.config["feature_dim"], dtype=torch.float64)


@torch.no_grad()
def predict(images: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    """Predicted labels (N,) int64 of the shipped classifier."""
    model = load_classifier()
    images = data.check_images(images)
    out = [model(b).argmax(1) for b in images.split(batch_size)]
    return torch.cat(out) if out else torch.empty(0, dtype=torch.int64)
