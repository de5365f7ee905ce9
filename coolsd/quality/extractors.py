"""Feature extractors of the quality metrics, loaded from local files only (nothing is downloaded).

Three kinds, told apart by what the weights path holds:

* **Inception-v3 for FID / IS** (the TensorFlow ``inception-2015-12-05`` graph ported to PyTorch, the network
  of ADM's evaluator and so of LlamaGen's published FIDs): torch-fidelity's ``FeatureExtractorInceptionV3``
  (torchmetrics' own ``FrechetInceptionDistance(feature=2048)`` wraps it) built from a local state-dict file,
  normally ``weights-inception-2015-12-05-6726825d.pth``. Its published hash is the sha256 prefix in the
  name (torch.hub's ``name-<sha256 prefix>.ext`` convention), checked here. Input: uint8 (N, 3, H, W) in
  [0, 255], any H, W, resized inside to 299 x 299 bilinearly as TensorFlow 1.x does; features pool3 (2048)
  and ``logits_unbiased`` (1008, the fc layer without bias: torchmetrics' InceptionScore default).
* **exported extractors** (``save_extractor``): any network saved with ``torch.export`` together with a JSON
  description (name, version, input (C, H, W), value range, dtype, resize, whether it gives logits) in the
  archive's extra files; ``forward`` gives features (N, d), or (features, logits) for IS. The tests' tiny
  random Inception-like nets travel this way; so can a user's own network.
* **The shipped MNIST classifier** (``mnist_extractor``): the zoo's 64-d penultimate features, images
  (N, 1, 28, 28) float in [-1, 1].

CLIP models (a transformers directory) are loaded by ``coolsd.quality.clip``.
"""
from __future__ import annotations

import json
import os
import pathlib
import zipfile
from dataclasses import dataclass

import numpy as np
import torch

from theory.core.checks import brief

from .stamp import Stamp, file_sha256, library_versions

__all__ = ["ENV_WEIGHTS", "INCEPTION_FILE", "INCEPTION_SOURCE", "Preprocessing", "FeatureExtractor",
           "load_extractor", "save_extractor", "mnist_extractor", "resolve_weights", "to_uint8", "eval_resize"]

ENV_WEIGHTS = "COOLSD_QUALITY_WEIGHTS"
# torch-fidelity's release file (its FeatureExtractorInceptionV3 URL_INCEPTION_V3); pytorch-fid publishes the
# same port as pt_inception-2015-12-05-6726825d.pth. "6726825d" is the published sha256 prefix.
INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_SHA256_PREFIX = "6726825d"
INCEPTION_SOURCE = ("github.com/toshas/torch-fidelity/releases/download/v0.2.0/" + INCEPTION_FILE)
META = "coolsd_extractor.json"       # the exported archive's extra file with the description
_BATCH = 64                          # images per extractor forward


@dataclass(frozen=True)
class Preprocessing:
    """What the extractor expects: ``size`` (C, H, W) of its input, or (C, None, None) for any H, W;
    ``resize`` applied inside the extractor (e.g. "bilinear to 299x299, TensorFlow 1.x compatible");
    ``value_range`` (lo, hi) and ``dtype`` of the input pixels."""
    size: tuple
    resize: str
    value_range: tuple
    dtype: str

    def as_dict(self) -> dict:
        return {"size": list(self.size), "resize": self.resize, "value_range": list(self.value_range),
                "dtype": self.dtype}


class FeatureExtractor:
    """A loaded feature network. ``name``, ``version``, ``preprocessing``, ``weights`` (path as given),
    ``weights_sha256``, ``num_features`` d, ``has_logits``. ``extract(images)`` -> (features (N, d) float64,
    logits (N, k) float64 or None) for images (N, C, H, W) in the preprocessing's dtype and range."""

    def __init__(self, name, version, preprocessing: Preprocessing, weights, weights_sha256, net, num_features,
                 logits=None, device="cpu"):
        self.name, self.version, self.preprocessing = name, version, preprocessing
        self.weights, self.weights_sha256 = str(weights), weights_sha256
        self.num_features = int(num_features)
        self._net, self._logits, self.device = net, logits, torch.device(device)
        self.has_logits = logits is not None

    def check_size(self, shape) -> None:
        """ValueError (one line) unless image shape (C, H, W) is what the extractor takes."""
        c, h, w = self.preprocessing.size
        shape = tuple(int(s) for s in shape)
        if len(shape) != 3 or shape[0] != c or (h is not None and shape[1:] != (h, w)):
            want = f"({c}, {h}, {w})" if h is not None else f"({c}, H, W)"
            raise ValueError(f"images of shape {shape} do not fit the feature extractor {self.name} (weights "
                             f"{self.weights}), which takes {want}: give a model whose images have that size, or "
                             "an extractor (--quality-weights) for this size")

    def check_images(self, images: torch.Tensor) -> None:
        if not isinstance(images, torch.Tensor) or images.ndim != 4 or len(images) == 0:
            raise ValueError(f"images must be a non-empty (N, C, H, W) tensor, got {getattr(images, 'shape', images)!r}")
        self.check_size(images.shape[1:])
        want = getattr(torch, self.preprocessing.dtype)
        if images.dtype != want:
            raise TypeError(f"images must be {self.preprocessing.dtype} for {self.name}, got {images.dtype}")

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
        self.check_images(images)
        feats, logits = [], []
        for a in range(0, len(images), _BATCH):  # batches bound the network's memory
            x = images[a:a + _BATCH].to(self.device)
            f, lg = self._net(x)
            feats.append(f.double().cpu())
            if lg is not None:
                logits.append(lg.double().cpu())
        f = torch.cat(feats).numpy()
        if f.shape != (len(images), self.num_features) or not np.isfinite(f).all():
            raise ValueError(f"extractor {self.name} gave features of shape {f.shape} (finite: "
                             f"{bool(np.isfinite(f).all())}), expected ({len(images)}, {self.num_features})")
        return f, (torch.cat(logits).numpy() if logits else None)

    def stamp(self, **kw) -> Stamp:
        return Stamp(library=library_versions(), extractor=f"{self.name} {self.version}", weights=self.weights,
                     weights_sha256=self.weights_sha256, preprocessing=self.preprocessing.as_dict(), **kw)


def resolve_weights(path, flag: str = "--quality-weights", need: str = "an Inception-v3 weights file or a coolsd.quality.save_extractor "
                    f"file (Inception: {INCEPTION_FILE} from {INCEPTION_SOURCE})",
                    env: str = ENV_WEIGHTS) -> pathlib.Path:
    """The weights path given (``path``), else the environment variable ``env``; one-line ValueError naming the
    file, where it comes from and the flag when neither is given or the path does not exist."""
    given = path if path is not None else os.environ.get(env)
    if not given:
        raise ValueError(f"{flag}: no weights given; quality needs {need}: download it and pass {flag} PATH "
                         f"(or set {env}); nothing is downloaded at run time")
    p = pathlib.Path(given).expanduser()
    if not p.exists():
        src = flag if path is not None else env
        raise ValueError(f"{src}: weights {str(p)!r} do not exist; quality needs {need}: download it and pass {flag} PATH")
    if not p.is_dir():       # a FIFO / device / oversized file refused before it is opened (coolsd.io)
        from theory.core.files import input_file

        input_file(flag if path is not None else env, p, "checkpoint", hint=f"quality needs {need}")
    return p


def _archive(p: pathlib.Path) -> str | None:
    """"export" for a torch.export archive (a zip with ``<name>/archive_format``), "torchscript" for a
    TorchScript one (``<name>/code/``), None for anything else (a ``torch.save`` file, other bytes)."""
    if not zipfile.is_zipfile(p):
        return None
    with zipfile.ZipFile(p) as z:
        names = z.namelist()
    if any(n.endswith("/archive_format") for n in names):
        return "export"
    return "torchscript" if any("/code/" in n for n in names) else None


def load_extractor(path=None, device="cpu", flag: str = "--quality-weights") -> FeatureExtractor:
    """The feature extractor in file ``path`` (or ``$COOLSD_QUALITY_WEIGHTS``): a torch.export archive written by
    ``save_extractor``, else the Inception-v3 state dict (hash-checked against the published prefix). Every
    failure is a one-line ValueError naming the file and the flag."""
    p = resolve_weights(path, flag)
    if p.is_dir():
        raise ValueError(f"{flag}: {str(p)!r} is a directory (a CLIP model? that is --quality-clip); FID / IS / KID "
                         f"need a feature extractor file: {INCEPTION_FILE} from {INCEPTION_SOURCE}, or one written by "
                         "coolsd.quality.save_extractor")
    kind = _archive(p)
    if kind == "torchscript":
        raise ValueError(f"{flag}: {str(p)!r} is a TorchScript archive (deprecated by torch); save the network with "
                         "coolsd.quality.save_extractor (torch.export) instead")
    return _load_exported(p, device, flag) if kind == "export" else _load_inception(p, device, flag)


def _load_exported(p: pathlib.Path, device, flag) -> FeatureExtractor:
    extra = {META: ""}
    try:
        net = torch.export.load(str(p), extra_files=extra).module()
    except (RuntimeError, ValueError, KeyError) as e:
        raise ValueError(f"{flag}: {str(p)!r} is not a loadable torch.export extractor ({str(e).splitlines()[0]})") from None
    try:
        meta = json.loads(extra[META])
        c, h, w = meta["size"]
        pre = Preprocessing((int(c), None if h is None else int(h), None if w is None else int(w)), str(meta["resize"]),
                            tuple(float(v) for v in meta["value_range"]), str(meta["dtype"]))
        name, version, d, has_logits = str(meta["name"]), str(meta["version"]), int(meta["num_features"]), bool(meta["has_logits"])
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{flag}: extractor file {str(p)!r} has no valid {META} description (name, version, size, "
                         "resize, value_range, dtype, num_features, has_logits): write it with "
                         "coolsd.quality.save_extractor") from None
    net = net.to(device)

    def run(x):
        out = net(x)
        return (out[0], out[1]) if has_logits else (out, None)

    return FeatureExtractor(name, version, pre, p, file_sha256(p), run, d, logits=has_logits or None, device=device)


def save_extractor(module: torch.nn.Module, path, *, name: str, version: str, size, num_features: int,
                   has_logits: bool = False, value_range=(0, 255), dtype: str = "uint8", resize: str = "none") -> pathlib.Path:
    """Export ``module`` with ``torch.export`` (forward: images (N, C, H, W) of ``dtype`` -> features
    (N, num_features), or (features, logits (N, k)) when ``has_logits``, for IS; the batch dimension dynamic)
    and save it to ``path`` with its description, for ``load_extractor``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {brief(name)}")
    if len(tuple(size)) != 3 or any(s is None for s in size):
        raise ValueError(f"size must be (C, H, W) ints, got {size!r}")
    example = torch.zeros((2, *size), dtype=getattr(torch, dtype))
    ep = torch.export.export(module.eval(), (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    meta = {"name": name, "version": str(version), "size": list(size), "num_features": int(num_features),
            "value_range": list(value_range), "dtype": dtype, "resize": resize, "has_logits": bool(has_logits)}
    path = pathlib.Path(path)
    torch.export.save(ep, str(path), extra_files={META: json.dumps(meta)})
    return path


def _load_inception(p: pathlib.Path, device, flag) -> FeatureExtractor:
    sha = file_sha256(p)
    if not sha.startswith(INCEPTION_SHA256_PREFIX):
        raise ValueError(f"{flag}: {str(p)!r} is neither an extractor written by coolsd.quality.save_extractor nor the published Inception weights "
                         f"(sha256 {sha[:12]}..., the published {INCEPTION_FILE} starts {INCEPTION_SHA256_PREFIX}): "
                         f"download {INCEPTION_SOURCE}")
    try:
        from importlib import metadata

        from torch_fidelity import FeatureExtractorInceptionV3
    except ImportError:
        raise ValueError(f"{flag}: the Inception network comes from torch-fidelity: pip install torch-fidelity (with "
                         "the torchvision build matching your torch; see docs/guide/quality.md)") from None
    net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048", "logits_unbiased"],
                                      feature_extractor_weights_path=str(p)).to(device).eval()
    pre = Preprocessing((3, None, None), "bilinear to 299x299 (TensorFlow 1.x compatible, torch-fidelity)", (0, 255),
                        "uint8")
    version = f"2015-12-05 (torch-fidelity {metadata.version('torch-fidelity')})"
    return FeatureExtractor("inception-v3-compat", version, pre, p, sha, lambda x: net(x), 2048,
                            logits=True, device=device)


def mnist_extractor() -> FeatureExtractor:
    """The shipped digit classifier's 64-d features (``real.zoo.metrics.image_features``) as an extractor:
    images (N, 1, 28, 28) float32 in [-1, 1], no resize, no logits."""
    from real.zoo import checkpoint, classifier
    from real.zoo.metrics import image_features

    path = checkpoint.CHECKPOINTS / classifier.CHECKPOINT
    pre = Preprocessing((1, 28, 28), "none", (-1, 1), "float32")
    return FeatureExtractor("mnist-classifier", "zoo", pre, path.name, file_sha256(path),
                            lambda x: (image_features(x), None), 64)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Decoder images (N, C, H, W) in [-1, 1] -> uint8 in [0, 255] as LlamaGen's sample_c2i_ddp.py writes its
    PNGs: clamp(127.5 x + 128, 0, 255), truncated to uint8."""
    return torch.clamp(127.5 * images.float() + 128.0, 0, 255).to(torch.uint8)


def eval_resize(images: torch.Tensor, size: int | None) -> torch.Tensor:
    """Decoder images (N, C, H, W) float resized to (size, size) bicubically, as LlamaGen's sample_c2i_ddp.py
    does for ``--image-size-eval`` (384 -> 256) before quantising; unchanged when ``size`` is None or equal."""
    if size is None or tuple(images.shape[-2:]) == (size, size):
        return images
    return torch.nn.functional.interpolate(images.float(), size=(size, size), mode="bicubic")
