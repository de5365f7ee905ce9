"""Reference statistics of the quality metrics: a Gaussian (mu (d,), sigma (d, d)) for FID and, where images
are at hand, their features (n, d) for KID and precision/recall, each with its stamp.

Sources (``load_reference``):

* **an ADM reference batch** (``VIRTUAL_imagenet256_labeled.npz`` and the like, the batches of openai/
  guided-diffusion's ``evaluations/``): ``arr_0`` uint8 images (N, H, W, 3) in [0, 255] (10,000 images in the
  published ImageNet batches), optionally ``arr_1`` labels (N,), and the statistics ADM's evaluator reads
  first when present: ``mu`` (2048,), ``sigma`` (2048, 2048) of pool_3 over the whole dataset, ``mu_s`` /
  ``sigma_s`` of its spatial features (sFID). With the Inception extractor (the port of the same TensorFlow
  graph) the file's ``mu``/``sigma`` are the FID reference, as in ADM's evaluator and so in LlamaGen's
  published FIDs, and ``arr_0``'s features serve KID and precision/recall (as ADM uses them for P/R). With
  any other extractor the file's statistics are another network's and are not used: everything comes from
  ``arr_0`` through that extractor.
* **a statistics file written by ``save_reference``** (npz with ``mu``, ``sigma``, ``n``, optional ``features``
  and the JSON stamp ``coolsd_stamp``): accepted only when its extractor, weights hash and preprocessing are
  the ones asked for (``stamp.StampMismatch`` otherwise).
* **a folder of images** (PNG / JPEG / WebP, e.g. COCO val images resized to the model's size), all of one size.
* **"mnist"**: the zoo's 1,000 held-out digits (``real.zoo.data.heldout_split``) through the shipped classifier.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
from dataclasses import dataclass

import numpy as np
import torch

from .extractors import FeatureExtractor
from .stamp import EXTRACTOR_FIELDS, Stamp, StampMismatch, file_sha256, files_sha256, require_same

__all__ = ["Reference", "load_reference", "check_statistics", "save_reference", "read_adm_npz", "AdmBatch", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
STAMP_KEY = "coolsd_stamp"
_CHUNK = 1000      # reference images converted to tensors per step (bounds the float copy)


@dataclass
class Reference:
    """mu (d,), sigma (d, d) float64 over ``n`` reference samples (None: unknown, ADM's whole-dataset
    statistics); ``features`` (m, d) float64 or None (for KID,
    P/R; m may differ from n: ADM's whole-dataset statistics with its 10,000 images); ``image_size`` (C, H, W)
    the reference images had (None when unknown); ``stamp`` (extractor, reference file and hash)."""
    mu: np.ndarray
    sigma: np.ndarray
    n: int | None
    features: np.ndarray | None
    image_size: tuple | None
    stamp: Stamp
    source: str             # what the statistics are, in words (report)

    def check_images(self, shape) -> None:
        """ValueError unless generated images of shape (C, H, W) have the reference images' size."""
        shape = tuple(int(s) for s in shape)
        if self.image_size is not None and shape != tuple(self.image_size):
            raise ValueError(f"generated images of shape {shape} do not match the reference {self.stamp.reference} "
                             f"(images {tuple(self.image_size)}): FID across sizes is not comparable; generate at "
                             "that size or resize with --quality-image-size (bicubic, as LlamaGen's --image-size-eval)")


@dataclass
class AdmBatch:
    """An ADM reference batch: ``images`` (N, H, W, 3) uint8 or None, ``labels`` (N,) or None, ``stats``
    {"mu", "sigma", "mu_s", "sigma_s"} present in the file (may be empty)."""
    images: np.ndarray | None
    labels: np.ndarray | None
    stats: dict


def read_adm_npz(path, arrays: dict | None = None) -> AdmBatch:
    """Read an ADM-format reference batch npz (layout in the module docstring; ``arrays``: its arrays when already
    read); ValueError (one line, naming the file and its arrays) when it is not a readable npz, has neither ``arr_0``
    images nor ``mu``/``sigma``, or they are malformed."""
    p = pathlib.Path(path)
    z = _npz("--quality-ref", p) if arrays is None else arrays
    keys = sorted(z)
    images = z["arr_0"] if "arr_0" in keys else None
    labels = z["arr_1"] if "arr_1" in keys else None
    try:
        stats = {k: np.asarray(z[k], np.float64) for k in ("mu", "sigma", "mu_s", "sigma_s") if k in keys}
    except (TypeError, ValueError) as e:
        raise ValueError(f"--quality-ref: {str(p)!r}: 'mu' / 'sigma' are not numbers ({e})") from None
    if images is None and not {"mu", "sigma"} <= set(stats):
        raise ValueError(f"--quality-ref: {str(p)!r} has arrays {keys}, expected the ADM reference-batch layout: "
                         "'arr_0' (N, H, W, 3) uint8 images and/or 'mu' (d,) + 'sigma' (d, d)")
    if images is not None and (images.ndim != 4 or images.shape[-1] not in (1, 3) or images.dtype != np.uint8):
        raise ValueError(f"--quality-ref: {str(p)!r}: 'arr_0' must be (N, H, W, 3) uint8 images, got "
                         f"{images.shape} {images.dtype}")
    if images is not None and len(images) < 2:
        raise ValueError(f"--quality-ref: {str(p)!r}: 'arr_0' has {len(images)} image(s); statistics need >= 2")
    if labels is not None and (labels.ndim != 1 or images is None or len(labels) != len(images)):
        raise ValueError(f"--quality-ref: {str(p)!r}: 'arr_1' must be (N,) labels of the N 'arr_0' images")
    if "mu" in stats:
        d = stats["mu"].shape
        if len(d) != 1 or stats.get("sigma", np.zeros(0)).shape != (d[0], d[0]):
            raise ValueError(f"--quality-ref: {str(p)!r}: 'mu' must be (d,) and 'sigma' (d, d), got {d} and "
                             f"{stats.get('sigma', np.zeros(0)).shape}")
    return AdmBatch(images, labels, stats)


def _folder_files(p: pathlib.Path) -> list[pathlib.Path]:
    files = sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())
    if len(files) < 2:
        raise ValueError(f"--quality-ref: folder {str(p)!r} holds {len(files)} image(s) ({', '.join(IMAGE_SUFFIXES)}); "
                         "reference statistics need at least 2")
    return files


def _read_folder(files, channels: int) -> np.ndarray:
    """(N, H, W, C) uint8 of the images (converted to RGB / L), all of one size (ValueError otherwise)."""
    from PIL import Image

    arrays = []
    for f in files:  # one file at a time: decoding is per file
        with Image.open(f) as im:
            arrays.append(np.asarray(im.convert("RGB" if channels == 3 else "L"), np.uint8))
    sizes = {a.shape[:2] for a in arrays}
    if len(sizes) > 1:
        raise ValueError(f"--quality-ref: folder {str(files[0].parent)!r} mixes image sizes {sorted(sizes)}: resize "
                         "the references to the generated images' size first")
    out = np.stack(arrays)
    return out[..., None] if out.ndim == 3 else out


def _features_of(images_nhwc: np.ndarray, ex: FeatureExtractor) -> np.ndarray:
    """Features (N, d) of uint8 images (N, H, W, C) through ``ex`` (uint8 extractors take them as they are)."""
    if ex.preprocessing.dtype != "uint8":
        raise ValueError(f"extractor {ex.name} takes {ex.preprocessing.dtype} images; reference images are uint8")
    ex.check_size((images_nhwc.shape[3], *images_nhwc.shape[1:3]))
    out = []
    for a in range(0, len(images_nhwc), _CHUNK):  # chunks bound the NCHW copy
        x = torch.from_numpy(np.ascontiguousarray(images_nhwc[a:a + _CHUNK].transpose(0, 3, 1, 2)))
        out.append(ex.extract(x)[0])
    return np.concatenate(out)


def _gaussian(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from real.zoo.metrics import gaussian_stats

    return gaussian_stats(f)


def load_reference(ref, ex: FeatureExtractor) -> Reference:
    """``_load_reference`` (below), then its numbers checked before any metric uses them (``check_statistics``)."""
    r = _load_reference(ref, ex)
    check_statistics(r.mu, r.sigma, r.features, f"--quality-ref {str(ref)!r}")
    d, want = int(np.asarray(r.mu).shape[0]), getattr(ex, "num_features", None)
    if want is not None and d != int(want):        # before any image is generated, not at the merge (issue 50)
        raise ValueError(f"--quality-ref {str(ref)!r}: its statistics are {d}-dimensional but extractor {ex.name} "
                         f"gives {int(want)} features: compute the reference with the same extractor")
    return r


def check_statistics(mu, sigma, features, where: str) -> None:
    """Reference statistics a Frechet distance can use: mu (d,) and sigma (d, d) finite, sigma symmetric and
    positive semi-definite, features (m, d) finite; a one-line ValueError naming ``where`` otherwise (instead of a
    NaN FID or a linear-algebra library's own error line)."""
    mu, sigma = np.asarray(mu, np.float64), np.asarray(sigma, np.float64)
    d = mu.shape[0] if mu.ndim == 1 else -1
    if mu.ndim != 1 or sigma.shape != (d, d):
        raise ValueError(f"{where}: mu must be (d,) and sigma (d, d), got {mu.shape} and {sigma.shape}")
    if not (np.isfinite(mu).all() and np.isfinite(sigma).all()):
        raise ValueError(f"{where}: the reference mean or covariance holds NaN or infinite values")
    scale = max(1.0, float(np.abs(sigma).max()))
    # covariances computed in float32 (ADM's files) are symmetric and PSD to ~1e-6 relative; 1e-4 leaves room and
    # still catches a matrix that is not a covariance (a negative eigenvalue of the data's own scale)
    if np.abs(sigma - sigma.T).max() > 1e-4 * scale:
        raise ValueError(f"{where}: the reference covariance is not symmetric (largest asymmetry "
                         f"{np.abs(sigma - sigma.T).max():.3g})")
    lo = float(np.linalg.eigvalsh((sigma + sigma.T) / 2).min())
    if lo < -1e-4 * scale:
        raise ValueError(f"{where}: the reference covariance is not positive semi-definite (smallest eigenvalue "
                         f"{lo:.3g})")
    if features is not None and not np.isfinite(np.asarray(features)).all():
        raise ValueError(f"{where}: the reference features hold NaN or infinite values")


def _load_reference(ref, ex: FeatureExtractor) -> Reference:
    """The reference statistics ``ref`` (path of an ADM npz, a ``save_reference`` npz or an image folder, or
    "mnist") in the feature space of ``ex``; errors (one line, naming the file and ``--quality-ref``) for a
    missing path, unexpected arrays, images the extractor cannot take, or a stats file of another extractor."""
    if ref is None:
        raise ValueError("--quality-ref: no reference given: an ADM reference batch npz (e.g. "
                         "VIRTUAL_imagenet256_labeled.npz), a statistics npz, an image folder, or 'mnist'")
    if str(ref) == "mnist":
        return _mnist_reference(ex)
    p = pathlib.Path(ref).expanduser()
    if not p.exists():
        raise ValueError(f"--quality-ref: {str(p)!r} does not exist")
    if p.is_dir():
        files = _folder_files(p)
        imgs = _read_folder(files, ex.preprocessing.size[0])
        f = _features_of(imgs, ex)
        mu, sigma = _gaussian(f)
        stamp = ex.stamp(reference=str(p), reference_sha256=files_sha256(files, p))
        return Reference(mu, sigma, len(f), f, (imgs.shape[3], *imgs.shape[1:3]), stamp,
                         f"{len(f)} images of folder {p.name}")
    arrays = _npz("--quality-ref", p)       # read and checked whole now: type, size, format, damage
    sha = file_sha256(p)
    if STAMP_KEY in arrays:
        return _read_own(p, ex, sha, arrays)
    adm = read_adm_npz(p, arrays)
    stamp = ex.stamp(reference=str(p), reference_sha256=sha)
    feats = _features_of(adm.images, ex) if adm.images is not None else None
    size = None if adm.images is None else (adm.images.shape[3], *adm.images.shape[1:3])
    if "mu" in adm.stats and ex.name == "inception-v3-compat":
        if adm.stats["mu"].shape != (ex.num_features,):
            raise ValueError(f"--quality-ref: {str(p)!r}: 'mu' has {adm.stats['mu'].shape[0]} dims, the Inception pool "
                             f"features {ex.num_features}")
        n = len(feats) if feats is not None else 0
        return Reference(adm.stats["mu"], adm.stats["sigma"], None, feats, size, stamp,
                         "ADM statistics (mu/sigma of the file, TensorFlow Inception pool_3)"
                         + (f"; {n} images (arr_0) for KID and P/R" if n else ""))
    if feats is None:
        raise StampMismatch(f"--quality-ref: {str(p)!r} holds only 'mu'/'sigma' (ADM's TensorFlow Inception statistics) "
                            f"and no 'arr_0' images, but the extractor is {ex.name} {ex.version}: its statistics "
                            "cannot come from this file")
    mu, sigma = _gaussian(feats)
    return Reference(mu, sigma, len(feats), feats, size, stamp, f"{len(feats)} images (arr_0) of {p.name}")


def _npz(flag: str, p) -> dict:
    """Every array of the npz ``p``, after ``coolsd.io.check_input_file`` (a FIFO, a device, a directory, a .npy or
    an oversized file refused unopened) and ``theory.core.checks.npz_arrays`` (a truncated or damaged archive: one
    line naming the file)."""
    from theory.core import checks
    from theory.core.files import input_file

    input_file(flag, p, "npz", hint="expected an ADM reference batch or a coolsd.quality.save_reference file")
    return checks.npz_arrays(flag, p)


def _read_own(p: pathlib.Path, ex: FeatureExtractor, sha: str, z: dict) -> Reference:
    """A ``save_reference`` file ``p`` (its arrays ``z``, read by ``_npz``) as a ``Reference`` for extractor ``ex``."""
    missing = {"mu", "sigma", "n", STAMP_KEY} - set(z)
    if missing:
        raise ValueError(f"--quality-ref: statistics file {str(p)!r} lacks arrays {sorted(missing)}")
    try:
        stamp = Stamp.from_dict(json.loads(str(z[STAMP_KEY])))
        mu, sigma, n = np.asarray(z["mu"], np.float64), np.asarray(z["sigma"], np.float64), int(z["n"])
        n = None if n < 0 else n
        feats = np.asarray(z["features"], np.float64) if "features" in z else None
        size = tuple(int(s) for s in z["image_size"]) if "image_size" in z else None
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"--quality-ref: statistics file {str(p)!r} is malformed ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:100] if str(e) else '-'})") from None
    try:
        require_same([stamp, ex.stamp()], f"--quality-ref {str(p)!r} against --quality-weights", EXTRACTOR_FIELDS)
    except StampMismatch as e:
        raise StampMismatch(f"{e} (the statistics were computed with {stamp.extractor}, weights sha256 "
                            f"{stamp.weights_sha256[:12]}...)") from None
    return Reference(mu, sigma, n, feats, size, stamp.with_(reference=str(p), reference_sha256=sha),
                     f"statistics file {p.name} ({n} samples)")


def save_reference(ref: Reference, path) -> pathlib.Path:
    """Write ``ref`` as a statistics npz (mu, sigma, n, features, image_size, coolsd_stamp) for later runs."""
    p = pathlib.Path(path)
    arrays = {"mu": ref.mu, "sigma": ref.sigma, "n": np.int64(-1 if ref.n is None else ref.n), STAMP_KEY: np.array(json.dumps(ref.stamp.as_dict()))}
    if ref.features is not None:
        arrays["features"] = ref.features
    if ref.image_size is not None:
        arrays["image_size"] = np.asarray(ref.image_size, np.int64)
    with open(p, "wb") as fh:
        np.savez(fh, **arrays)
    return p


def _mnist_reference(ex: FeatureExtractor) -> Reference:
    from real.zoo import data
    from real.zoo.metrics import image_features

    if ex.name != "mnist-classifier":
        raise StampMismatch(f"--quality-ref mnist: the held-out digits are in the shipped classifier's feature space, "
                            f"not {ex.name}'s")
    images = data.heldout_split()[0]
    f = image_features(images).numpy()
    mu, sigma = _gaussian(f)
    stamp = ex.stamp(reference="mnist held-out digits (real.zoo.data.heldout_split)",
                     reference_sha256=hashlib.sha256(np.ascontiguousarray(images.numpy())).hexdigest())
    return Reference(mu, sigma, len(f), f, tuple(images.shape[1:]), stamp, f"{len(f)} held-out MNIST digits")
