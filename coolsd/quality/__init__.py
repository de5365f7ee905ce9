"""Image quality through the field's maintained metric libraries (torchmetrics for the arithmetic,
torch-fidelity's port of the TensorFlow Inception-v3 for FID / IS features, transformers CLIP for CLIP score),
with every network loaded from local files and every figure stamped (library, extractor and weights hash,
reference and its hash, image count, preprocessing).

Modules: ``stamp`` (the reproducibility stamp, mismatch errors), ``extractors`` (feature networks and their
preprocessing), ``reference`` (ADM reference batches, statistics files, image folders, the MNIST held-out
digits), ``metrics`` (FID / KID / IS from torchmetrics, our jackknife interval and precision/recall), ``clip``
(CLIP score), ``evaluate`` (the interface the sweep uses: ``QualitySpec`` -> ``prepare`` -> ``evaluate``).
"""
from __future__ import annotations

from .evaluate import METRICS, Quality, QualitySpec, prepare, read_captions
from .extractors import FeatureExtractor, load_extractor, mnist_extractor, save_extractor
from .reference import Reference, load_reference, read_adm_npz, save_reference
from .stamp import Stamp, StampMismatch, require_same

__all__ = ["METRICS", "Quality", "QualitySpec", "prepare", "read_captions", "FeatureExtractor", "load_extractor",
           "mnist_extractor", "save_extractor", "Reference", "load_reference", "read_adm_npz", "save_reference",
           "Stamp", "StampMismatch", "require_same"]
