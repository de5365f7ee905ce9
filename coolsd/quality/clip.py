"""CLIP score of text-to-image generations: torchmetrics' ``CLIPScore`` arithmetic (100 x cosine of the CLIP
image and text embeddings, the mean clamped at 0) with a transformers CLIP model loaded from a local
directory (``save_pretrained`` layout: config.json, weights, tokenizer and preprocessor files; e.g. a copy of
openai/clip-vit-large-patch14, torchmetrics' default). open_clip is not used: it needs torchvision, whose
wheels pin torch to another version than this project's.
"""
from __future__ import annotations

import json

import numpy as np
import torch

from .extractors import resolve_weights
from .stamp import Stamp, files_sha256, library_versions

__all__ = ["ClipModel", "ClipScorer", "load_clip", "clip_score", "ENV_CLIP"]

ENV_CLIP = "COOLSD_QUALITY_CLIP"
CLIP_SOURCE = "a transformers CLIP directory (e.g. huggingface.co/openai/clip-vit-large-patch14, all files)"
_BATCH = 32


class _Features(torch.nn.Module):
    """CLIPModel whose get_image_features / get_text_features return the projected embedding tensor: from
    transformers 5 they return a BaseModelOutputWithPooling, which torchmetrics 1.9's CLIPScore cannot
    normalise (Lightning-AI/torchmetrics issue 3407, fixed after 1.9.0); ``pooler_output`` is that tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config

    @staticmethod
    def _tensor(out):
        return out if isinstance(out, torch.Tensor) else out.pooler_output

    def get_image_features(self, *a, **kw):
        return self._tensor(self.model.get_image_features(*a, **kw))

    def get_text_features(self, *a, **kw):
        return self._tensor(self.model.get_text_features(*a, **kw))


def _plain(x):
    """A processor size (dict or transformers SizeDict) as a plain dict without unset entries."""
    d = x if isinstance(x, dict) else getattr(x, "__dict__", None)
    return {k: v for k, v in d.items() if v is not None} if isinstance(d, dict) else x


class ClipModel:
    """A loaded CLIP: ``model`` (CLIPModel), ``processor`` (CLIPProcessor), ``path``, ``sha256`` (our hash of the
    directory's files), ``preprocessing`` (the image processor's resize / crop / normalisation)."""

    def __init__(self, model, processor, path, sha256, device="cpu"):
        self.model, self.processor, self.path, self.sha256 = _Features(model).to(device).eval(), processor, path, sha256
        ip = processor.image_processor
        crop = getattr(ip, "crop_size", None) or {}
        self.image_size = (3, crop.get("height"), crop.get("width"))
        self.preprocessing = {"processor": type(ip).__name__,   # transformers picks a PIL or torchvision backend
                              "size": list(self.image_size), "dtype": "uint8", "value_range": [0, 255],
                              "resize": f"size {_plain(getattr(ip, 'size', None))}, resample "
                                        f"{getattr(ip, 'resample', None)}, center crop {_plain(crop)}",
                              "normalize": {"mean": list(getattr(ip, "image_mean", []) or []),
                                            "std": list(getattr(ip, "image_std", []) or [])}}

    def stamp(self, **kw) -> Stamp:
        return Stamp(library=library_versions(), extractor=f"CLIP {self.model.config.model_type} "
                     f"(projection {self.model.config.projection_dim})", weights=str(self.path), weights_sha256=self.sha256,
                     preprocessing=self.preprocessing, **kw)


def load_clip(path=None, device="cpu", flag: str = "--quality-clip") -> ClipModel:
    """The CLIP model in local directory ``path`` (or ``$COOLSD_QUALITY_CLIP``), loaded with
    ``local_files_only`` (never downloaded); one-line ValueError naming the path and the flag otherwise."""
    p = resolve_weights(path, flag, need=CLIP_SOURCE, env=ENV_CLIP)
    if not p.is_dir() or not (p / "config.json").is_file():
        raise ValueError(f"{flag}: {str(p)!r} is not a transformers CLIP directory (config.json, weights, tokenizer "
                         f"files); CLIP score needs {CLIP_SOURCE}")
    try:
        kind = json.loads((p / "config.json").read_text()).get("model_type")
    except ValueError:
        kind = None
    if kind != "clip":
        raise ValueError(f"{flag}: {str(p)!r} holds a {kind!r} model, CLIP score needs a 'clip' one ({CLIP_SOURCE})")
    from transformers import CLIPModel, CLIPProcessor

    try:
        model = CLIPModel.from_pretrained(str(p), local_files_only=True)
        processor = CLIPProcessor.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"{flag}: cannot load the CLIP model in {str(p)!r} ({str(e).splitlines()[0]})") from None
    files = [f for f in p.rglob("*") if f.is_file()]
    return ClipModel(model, processor, p, files_sha256(files, p), device)


class ClipScorer:
    """torchmetrics' CLIPScore accumulated batch by batch (``add``) from its own update arithmetic
    (``_clip_score_update``), keeping the per-image scores for the standard error; ``result()`` ->
    {"clip_score", "clip_score_se", "clip_scores" (N,)}."""

    def __init__(self, clip: ClipModel):
        from torchmetrics.multimodal.clip_score import CLIPScore

        self.metric = CLIPScore(model_name_or_path=lambda: (clip.model, clip.processor), sync_on_compute=False)  # per rank
        self.scores: list = []

    @torch.no_grad()
    def add(self, images: torch.Tensor, captions) -> None:
        from torchmetrics.functional.multimodal.clip_score import _clip_score_update

        captions = list(captions)
        if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1] != 3 or images.dtype != torch.uint8:
            raise ValueError(f"images must be uint8 (N, 3, H, W), got {getattr(images, 'shape', images)!r} "
                             f"{getattr(images, 'dtype', '')}")
        if len(captions) != len(images) or not all(isinstance(c, str) and c for c in captions):
            raise ValueError(f"captions must be {len(images)} non-empty str (one per image), got {len(captions)}")
        m = self.metric
        for a in range(0, len(images), _BATCH):  # batches bound the CLIP forward's memory
            s, n = _clip_score_update(list(images[a:a + _BATCH]), captions[a:a + _BATCH], m.model, m.processor)
            m.score += s.sum(0).to(m.score)
            m.n_samples += n
            self.scores.append(s.double().cpu())

    def result(self) -> dict:
        import warnings

        if not self.scores:
            raise ValueError("CLIP score of no image")
        scores = torch.cat(self.scores).numpy()
        with warnings.catch_warnings():   # the states were filled from _clip_score_update, not through update()
            warnings.filterwarnings("ignore", message=".*called before the ``update`` method.*")
            value = float(self.metric.compute())
        se = float(scores.std(ddof=1) / np.sqrt(len(scores))) if len(scores) > 1 else None
        return {"clip_score": value, "clip_score_se": se, "clip_scores": scores}


def clip_score(clip: ClipModel, images: torch.Tensor, captions) -> dict:
    """CLIP score of uint8 images (N, 3, H, W) against their captions (N str) (``ClipScorer``)."""
    scorer = ClipScorer(clip)
    scorer.add(images, captions)
    return scorer.result()
