"""Natural-image crops for the ``natural256`` zoo: 64x64 RGB crops of the photographs that ship inside
installed packages (no download at run time), class = source image.

Sources (16 classes, ``SOURCES`` order): scikit-image's bundled ``skimage.data`` images (astronaut, chelsea,
coffee, rocket, retina, hubble_deep_field, immunohistochemistry, brick, grass, gravel, camera, coins, moon;
grey ones replicated to 3 channels), scikit-learn's china.jpg and flower.jpg
(``sklearn.datasets.load_sample_images``) and matplotlib's grace_hopper.jpg (``matplotlib.cbook.get_sample_data``).
Each image is first resized (antialiased) so that its longer side is at most ``MAX_SIDE`` pixels.

**Split by region.** Along its longer dimension, each image's last ``max(HELDOUT_FRACTION * L, HELDOUT_MIN)``
pixels form the *held-out* strip and the rest the *train* region. Train crops are cut from the train region
only and held-out crops from the strip only, so no held-out crop shares a pixel with any training crop.

**Crops.** A crop is a square of side s ~ log-uniform[64, 128] source pixels (capped by its region), at a
uniform random position in its region, resized to 64x64 (bilinear, antialiased), and flipped left-right
with probability 1/2. ``N_TRAIN_PER_CLASS`` train and ``N_HELDOUT_PER_CLASS`` held-out crops per class are
cut once with a fixed seed (deterministic). Images come back as uint8 (N, 3, 64, 64);
``check_images`` turns them (or floats) into float32 in [-1, 1] as the models take them.

Public API, as ``real.zoo.data``: ``fingerprint()``, ``train_split()``, ``heldout_split()``, ``check_images()``.
"""
from __future__ import annotations

import functools
import hashlib

import numpy as np
import torch
import torch.nn.functional as F

SOURCES = ("astronaut", "chelsea", "coffee", "rocket", "retina", "hubble_deep_field", "immunohistochemistry",
           "brick", "grass", "gravel", "camera", "coins", "moon", "china", "flower", "grace_hopper")
N_CLASSES = len(SOURCES)
IMAGE_SIZE = 64
CHANNELS = 3
MAX_SIDE = 640
HELDOUT_FRACTION = 0.2
HELDOUT_MIN = 128
CROP_MIN, CROP_MAX = 64, 128
N_TRAIN_PER_CLASS = 1000
N_HELDOUT_PER_CLASS = 128
SPLIT_SEED = 0


def _load_source(name: str) -> np.ndarray:
    """One source photograph as uint8 (H, W, 3), from the package that bundles it (no download)."""
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image

        return np.asarray(load_sample_image(f"{name}.jpg"))
    if name == "grace_hopper":
        import matplotlib.cbook as cbook
        import matplotlib.image as mimage

        with cbook.get_sample_data("grace_hopper.jpg") as fh:
            return np.asarray(mimage.imread(fh, format="jpg"))
    import skimage.data

    img = np.asarray(getattr(skimage.data, name)())
    return np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img[..., :3]


@functools.lru_cache(maxsize=1)
def sources() -> tuple[torch.Tensor, ...]:
    """The 16 source images as uint8 tensors (3, H, W), longer side resized to at most ``MAX_SIDE``."""
    out = []
    for name in SOURCES:
        img = _load_source(name)
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(f"source image {name!r} loaded as {img.dtype} {img.shape}; expected uint8 (H, W, 3)")
        x = torch.from_numpy(np.array(img, copy=True)).permute(2, 0, 1)
        H, W = x.shape[1:]
        if max(H, W) > MAX_SIDE:
            r = MAX_SIDE / max(H, W)
            size = (round(H * r), round(W * r))
            x = F.interpolate(x[None].float(), size=size, mode="bilinear", antialias=True, align_corners=False)[0]
            x = x.round().clamp(0, 255).to(torch.uint8)
        out.append(x)
    return tuple(out)


def regions(shape: tuple[int, int]) -> dict[str, tuple[int, int, int, int]]:
    """{"train": (y0, y1, x0, x1), "heldout": (...)} pixel boxes of an image of ``shape`` (H, W): the held-out
    strip is the last ``max(HELDOUT_FRACTION * L, HELDOUT_MIN)`` pixels of the longer dimension L."""
    H, W = shape
    if W >= H:
        s = max(round(HELDOUT_FRACTION * W), HELDOUT_MIN)
        return {"train": (0, H, 0, W - s), "heldout": (0, H, W - s, W)}
    s = max(round(HELDOUT_FRACTION * H), HELDOUT_MIN)
    return {"train": (0, H - s, 0, W), "heldout": (H - s, H, 0, W)}


def _crops(img: torch.Tensor, box: tuple[int, int, int, int], n: int, rng: np.random.Generator) -> torch.Tensor:
    """``n`` random crops (n, 3, 64, 64) uint8 from ``box`` of ``img`` (3, H, W): log-uniform side, uniform
    position, random left-right flip."""
    y0, y1, x0, x1 = box
    cap = min(CROP_MAX, y1 - y0, x1 - x0)
    if cap < CROP_MIN:
        raise ValueError(f"region {box} is smaller than a {CROP_MIN}-pixel crop")
    out = torch.empty(n, CHANNELS, IMAGE_SIZE, IMAGE_SIZE, dtype=torch.uint8)
    for k in range(n):
        s = int(round(np.exp(rng.uniform(np.log(CROP_MIN), np.log(cap)))))
        y = int(rng.integers(y0, y1 - s + 1))
        x = int(rng.integers(x0, x1 - s + 1))
        c = img[:, y:y + s, x:x + s].float()[None]
        if s != IMAGE_SIZE:
            c = F.interpolate(c, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", antialias=True, align_corners=False)
        c = c[0].round().clamp(0, 255).to(torch.uint8)
        out[k] = c.flip(-1) if rng.random() < 0.5 else c
    return out


@functools.lru_cache(maxsize=2)
def _split(part: str, seed: int = SPLIT_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    n = N_TRAIN_PER_CLASS if part == "train" else N_HELDOUT_PER_CLASS
    rng = np.random.default_rng([seed, 0 if part == "train" else 1])
    xs, ys = [], []
    with torch.no_grad():
        for c, img in enumerate(sources()):
            xs.append(_crops(img, regions(tuple(img.shape[1:]))[part], n, rng))
            ys.append(torch.full((n,), c, dtype=torch.int64))
    order = torch.from_numpy(rng.permutation(n * N_CLASSES))
    return torch.cat(xs)[order], torch.cat(ys)[order]


def train_split(seed: int = SPLIT_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (16000, 3, 64, 64) uint8, labels (16000,) int64) cut from the train regions, seeded random order."""
    x, y = _split("train", seed)
    return x.clone(), y.clone()


def heldout_split(seed: int = SPLIT_SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (2048, 3, 64, 64) uint8, labels (2048,) int64) cut from the held-out strips; never trained on."""
    x, y = _split("heldout", seed)
    return x.clone(), y.clone()


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """sha256 of the source pixels, the split geometry and every train and held-out crop with its label:
    recorded in the manifest so a changed package image (or crop code) shows up."""
    h = hashlib.sha256()
    for img in sources():
        h.update(str(tuple(img.shape)).encode())
        h.update(img.numpy().tobytes())
    h.update(repr((SOURCES, MAX_SIDE, HELDOUT_FRACTION, HELDOUT_MIN, CROP_MIN, CROP_MAX)).encode())
    for part in ("train", "heldout"):
        x, y = _split(part)
        h.update(x.numpy().tobytes())
        h.update(y.numpy().tobytes())
    return h.hexdigest()


def check_images(images) -> torch.Tensor:
    """Crops as float32 (N, 3, 64, 64) in [-1, 1]: uint8 input is scaled from [0, 255], float input is taken
    as already in [-1, 1]; ValueError for another shape or NaN / inf entries."""
    images = torch.as_tensor(images)
    if images.ndim != 4 or images.shape[1:] != (CHANNELS, IMAGE_SIZE, IMAGE_SIZE):
        raise ValueError(f"images must be (N, 3, 64, 64) (uint8, or float in [-1, 1]), got {tuple(images.shape)}")
    if images.dtype == torch.uint8:
        return images.float() / 127.5 - 1.0
    images = images.float()
    if not torch.isfinite(images).all():
        raise ValueError("images contain NaN or inf")
    return images


def to_pixels(images: torch.Tensor) -> np.ndarray:
    """Float images (N, 3, 64, 64) in [-1, 1] -> uint8 (N, 64, 64, 3) for display."""
    x = ((torch.as_tensor(images).float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).numpy()
