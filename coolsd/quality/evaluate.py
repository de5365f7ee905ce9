"""The one quality interface: a ``QualitySpec`` (which metrics, which local weights and reference) is
``prepare``d once, before any image is generated, which loads and checks everything (weights, reference
arrays, image size against the extractor and the reference, CLIP only for text-conditioned models, one
caption per condition); ``Quality.evaluate`` then turns decoded images into the figures, each with its stamp.

Metrics (``QualitySpec.metrics``):

* ``fid``: FID with its jackknife interval, KID, Inception Score (when the extractor has logits) and
  precision/recall (when the reference has features), in the extractor's feature space (``--quality-weights``:
  Inception-v3, a save_extractor file, or "mnist" for the shipped digit classifier) against the reference
  (``--quality-ref``). sFID is not computed (no maintained library has it).
* ``clip``: CLIP score (``--quality-clip``) of each image against its caption (``--quality-captions``: a text
  file, one caption per line, one line per condition of the model, in order).
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["QualitySpec", "Quality", "prepare", "METRICS", "read_captions"]

METRICS = ("fid", "clip")


@dataclass(frozen=True)
class QualitySpec:
    """What to measure: ``metrics`` (subset of METRICS); ``weights`` the feature extractor file (or "mnist");
    ``reference`` the reference statistics (ADM npz, statistics npz, image folder, or "mnist"); ``clip`` the CLIP
    directory; ``captions`` the caption file; ``image_size`` a bicubic resize of the generated images before the
    extractor (LlamaGen's --image-size-eval; None: none); ``device`` of the networks."""
    metrics: tuple
    weights: str | None = None
    reference: str | None = None
    clip: str | None = None
    captions: str | None = None
    image_size: int | None = None
    device: str = "cpu"

    @classmethod
    def parse(cls, text: str, **kw) -> "QualitySpec":
        """From ``--quality fid,clip``: a comma-separated subset of METRICS."""
        items = tuple(dict.fromkeys(t.strip() for t in str(text).split(",") if t.strip()))
        bad = [t for t in items if t not in METRICS]
        if not items or bad:
            raise ValueError(f"--quality: unknown metric(s) {bad or [text]}; choose from {', '.join(METRICS)} "
                             "(comma-separated)")
        for key, flag, metric in (("captions", "--quality-captions", "clip"), ("clip", "--quality-clip", "clip"),
                                  ("reference", "--quality-ref", "fid")):
            if kw.get(key) is not None and metric not in items:     # given but never read: refused, not ignored
                raise ValueError(f"{flag} configures {'CLIP score' if metric == 'clip' else 'FID'}; --quality {text} "
                                 f"does not measure it: add {metric} (--quality {','.join(items + (metric,))}) or "
                                 f"drop {flag}")
        return cls(items, **kw)

    def identity(self) -> dict:
        """What a cached per-setting quality file must match (paths as given; the hashes are in the stamp)."""
        return {"metrics": list(self.metrics), "weights": self.weights, "reference": self.reference,
                "clip": self.clip, "captions": self.captions, "image_size": self.image_size}


def check_finite_images(images, where: str, offset: int = 0) -> None:
    """Decoded images hold no NaN / inf (a NaN image would give a NaN FID, or a linear-algebra library's own error
    line): one-line ValueError naming ``where`` (the file or unit directory) and the first bad image."""
    import torch

    t = torch.as_tensor(images)
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int(torch.nonzero(~torch.isfinite(t.reshape(len(t), -1)).all(dim=1))[0, 0]) + offset
        raise ValueError(f"{where}: generated image {bad} holds NaN or inf values (a decoder or model in a bad state?); "
                         "its quality cannot be measured: regenerate it (delete the units named) or check the model")


def read_captions(path) -> list[str]:
    """Captions, one per non-empty line of a UTF-8 text file (``--quality-captions``)."""
    p = pathlib.Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"--quality-captions: {str(p)!r} is not a file (one caption per line, one per prompt)")
    lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"--quality-captions: {str(p)!r} holds no caption")
    return lines


class Quality:
    """A prepared ``QualitySpec``: ``extractor``, ``reference`` (for fid), ``clip`` and ``captions`` (for clip),
    ``image_shape`` (C, H, W) of the decoder's images before the optional resize."""

    def __init__(self, spec: QualitySpec, extractor, reference, clip, captions, image_shape):
        self.spec, self.extractor, self.reference, self.clip, self.captions = spec, extractor, reference, clip, captions
        self.image_shape = tuple(image_shape)

    def _prepared(self, images: torch.Tensor, dtype: str) -> torch.Tensor:
        from .extractors import eval_resize, to_uint8

        x = eval_resize(images, self.spec.image_size)
        return to_uint8(x) if dtype == "uint8" else x.float()

    def stamps(self, n: int) -> dict:
        """{metric: stamp dict} for figures over ``n`` generated images."""
        out = {}
        resize = {"eval_size": self.spec.image_size, "eval_resize": "bicubic" if self.spec.image_size else None}
        if "fid" in self.spec.metrics:
            s = self.reference.stamp.with_(images=int(n), reference=f"{self.reference.stamp.reference} "
                                                                     f"[{self.reference.source}]")
            out["fid"] = s.with_(preprocessing={**s.preprocessing, **resize}).as_dict()
        if "clip" in self.spec.metrics:
            s = self.clip.stamp(images=int(n))
            out["clip"] = s.with_(preprocessing={**s.preprocessing, **resize}).as_dict()
        return out

    @torch.no_grad()
    def measure(self, batches, where: str = "the generated images") -> dict:
        """Figures of decoded images given batch by batch: ``batches`` yields (images (b, C, H, W) float in
        [-1, 1], captions (b str) or None); features, logits and CLIP scores are kept, images are not. Returns
        "quality_stamp" {metric: stamp} and, for fid: fid, fid_ci, fid_se, kid, kid_std, kid_subset_size,
        inception_score, inception_score_std, precision, recall, precision_recall_k, sfid (None: no library
        has it); for clip: clip_score, clip_score_se."""
        from . import metrics

        feats, logits, scorer, n = [], [], None, 0
        if "clip" in self.spec.metrics:
            from .clip import ClipScorer

            scorer = ClipScorer(self.clip)
        for images, captions in batches:  # batches of decoded images: memory holds one at a time
            if tuple(images.shape[1:]) != self.image_shape:
                raise ValueError(f"images {tuple(images.shape[1:])} are not the prepared shape {self.image_shape}")
            check_finite_images(images, where, n)
            n += len(images)
            if self.extractor is not None:
                f, lg = self.extractor.extract(self._prepared(images, self.extractor.preprocessing.dtype))
                feats.append(f)
                if lg is not None:
                    logits.append(lg)
            if scorer is not None:
                if captions is None or len(captions) != len(images):
                    raise ValueError(f"clip needs one caption per image ({len(images)})")
                scorer.add(self._prepared(images, "uint8"), captions)
        out = {}
        if self.extractor is not None:
            f = np.concatenate(feats)
            lg = np.concatenate(logits) if logits else None
            ci = metrics.fid_with_ci(self.reference, f) if len(f) >= 3 else {"fd": metrics.fid(self.reference, f),
                                                                             "ci": None, "se": None, "se_method": None}
            out |= {"fid": ci["fd"], "fid_ci": ci["ci"], "fid_se": ci["se"], "fid_se_method": ci["se_method"],
                    **metrics.kid(self.reference, f),
                    **(metrics.inception_score(lg, splits=min(10, len(f))) if lg is not None else
                       {"inception_score": None, "inception_score_std": None}),
                    **metrics.precision_recall(self.reference, f), "sfid": None}
        if scorer is not None:
            r = scorer.result()
            out |= {"clip_score": r["clip_score"], "clip_score_se": r["clip_score_se"]}
        out["quality_stamp"] = self.stamps(n)
        return out

    def evaluate(self, images: torch.Tensor, captions=None) -> dict:
        """``measure`` of one batch: images (N, C, H, W) float in [-1, 1], captions N str (for clip)."""
        return self.measure([(images, captions)])


def prepare(spec: QualitySpec, *, image_shape, conds, prompts=None) -> Quality:
    """Load and check everything ``spec`` needs for a model whose decoder gives images of ``image_shape``
    (C, H, W) under conditions ``conds`` (ints: class-conditional; else text-conditioned), before generation.
    The captions of CLIP score are ``spec.captions``' lines, else the model's text ``prompts`` (one per condition).
    One-line ValueError for: CLIP score of a class-conditional model, missing / wrong weights, a reference
    without the expected arrays or computed with another extractor (StampMismatch), images the extractor or the
    reference cannot take, a caption count that is not one per condition."""
    from theory.core import checks

    from .extractors import load_extractor, mnist_extractor
    from .reference import load_reference

    checks.instance("prepare: spec", spec, QualitySpec, "a QualitySpec (QualitySpec.parse)")
    if isinstance(conds, (str, bytes)) or not hasattr(conds, "__iter__"):
        raise TypeError(f"prepare: conds must be a list of conditions, got {type(conds).__name__}")
    class_conditional = all(isinstance(c, (int, np.integer)) for c in conds)
    extractor = reference = clip = captions = None
    shape = tuple(int(s) for s in image_shape)
    if spec.image_size is not None:
        if not (isinstance(spec.image_size, int) and spec.image_size > 0):
            raise ValueError(f"--quality-image-size must be a positive int, got {spec.image_size!r}")
        shape = (shape[0], spec.image_size, spec.image_size)
    if "clip" in spec.metrics:
        if class_conditional:
            raise ValueError("--quality clip: CLIP score compares images with their text prompts; this model is "
                             "class-conditional (use --quality fid)")
        if spec.captions is None and not prompts:
            raise ValueError("--quality clip needs --quality-captions FILE (one caption per line, one per prompt) "
                             "when the model has no text prompts")
        captions = read_captions(spec.captions) if spec.captions is not None else [str(t) for t in prompts]
        if len(captions) != len(conds):
            raise ValueError(f"--quality-captions: {len(captions)} caption(s) for {len(conds)} prompt(s); give one "
                             "per prompt, in order")
        if shape[0] != 3:
            raise ValueError(f"--quality clip needs RGB images, the model's have {shape[0]} channel(s)")
        from .clip import load_clip

        clip = load_clip(spec.clip, spec.device)
    if "fid" in spec.metrics:
        extractor = mnist_extractor() if spec.weights == "mnist" else load_extractor(spec.weights, spec.device)
        extractor.check_size(shape)
        reference = load_reference(spec.reference, extractor)
        reference.check_images(shape)
    return Quality(spec, extractor, reference, clip, captions, image_shape)
