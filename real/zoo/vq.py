"""VQ tokenizer of the zoo: conv encoder (downsample 4: 28x28 digits -> 7x7 tokens, 64x64 crops -> 16x16),
l2-normalised codebook (LlamaGen-style: low code dimension, nearest code by cosine similarity, which equals
the l2 nearest code on unit vectors), conv decoder.

Public API (shipped weights ``vq.safetensors`` of each zoo, ``real.zoo.zoos``; ``zoo`` defaults to "mnist")::

    encode(images (N, C, S, S) in [-1, 1], zoo=) -> codes (N, side, side) int64      (mnist: C = 1, S = 28, side 7)
    decode(codes (N, side, side) or (N, side**2) int, zoo=) -> images (N, C, S, S) float32 in [-1, 1]
    codebook_embeddings(zoo=) -> (V, d) float64 unit rows   (the vectors the tokenizer uses)
    raw_codebook(zoo=) -> (V, d) float64 stored rows        (LANTERN's release ranks neighbours on these)
    token_dataset(zoo=) -> (codes (N, side**2) int64, labels (N,)) the zoo's train split tokenized
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import zoos

CHECKPOINT = "vq.safetensors"
TOKENS = 7  # tokens per side


class ResBlock(nn.Module):
    """x + conv3x3(silu(conv3x3(silu(x)))): (N, ch, H, W) -> (N, ch, H, W)."""

    def __init__(self, ch: int):
        """Two conv3x3 (ch -> ch)."""
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        """x (N, ch, H, W) -> (N, ch, H, W)."""
        return x + self.conv2(F.silu(self.conv1(F.silu(x))))


class Encoder(nn.Module):
    """Images (N, in_ch, S, S) -> (N, code_dim, S/4, S/4): conv, two stride-2 convs, a ResBlock, 1x1 conv."""

    def __init__(self, ch: int, code_dim: int, in_ch: int = 1):
        """Layers of width ``ch`` (``ch // 2`` at full resolution), ``in_ch`` inputs and ``code_dim`` outputs."""
        super().__init__()
        self.conv_in = nn.Conv2d(in_ch, ch // 2, 3, padding=1)
        self.down1 = nn.Conv2d(ch // 2, ch, 4, stride=2, padding=1)  # 28 -> 14
        self.down2 = nn.Conv2d(ch, ch, 4, stride=2, padding=1)  # 14 -> 7
        self.res = ResBlock(ch)
        self.conv_out = nn.Conv2d(ch, code_dim, 1)

    def forward(self, x):
        """x (N, in_ch, S, S) -> (N, code_dim, S/4, S/4), not normalised."""
        h = F.silu(self.down1(F.silu(self.conv_in(x))))
        h = self.res(self.down2(h))
        return self.conv_out(F.silu(h))


class Decoder(nn.Module):
    """Code vectors (N, code_dim, s, s) -> images (N, out_ch, 4s, 4s): conv, ResBlock, two stride-2 transposed
    convs, conv."""

    def __init__(self, ch: int, code_dim: int, out_ch: int = 1):
        """Layers of width ``ch`` (``ch // 2`` at full resolution) from ``code_dim`` inputs to ``out_ch`` outputs."""
        super().__init__()
        self.conv_in = nn.Conv2d(code_dim, ch, 3, padding=1)
        self.res = ResBlock(ch)
        self.up1 = nn.ConvTranspose2d(ch, ch, 4, stride=2, padding=1)  # 7 -> 14
        self.up2 = nn.ConvTranspose2d(ch, ch // 2, 4, stride=2, padding=1)  # 14 -> 28
        self.conv_out = nn.Conv2d(ch // 2, out_ch, 3, padding=1)

    def forward(self, z):
        """z (N, code_dim, s, s) -> (N, out_ch, 4s, 4s) (unbounded; about [-1, 1] once trained)."""
        h = F.silu(self.res(self.conv_in(z)))
        h = F.silu(self.up2(F.silu(self.up1(h))))
        return self.conv_out(h)


class VQModel(nn.Module):
    """Encoder -> unit vectors z (N, d, s, s) -> nearest unit code -> decoder.

    ``codebook`` (V, d) is stored unnormalised and normalised on use (as in LlamaGen's VQ with
    l2-normalised codes), so only directions matter.
    """

    def __init__(self, codebook_size: int = 512, code_dim: int = 8, ch: int = 32, in_ch: int = 1):
        """``codebook`` (codebook_size, code_dim) uniform(-1, 1) (normalised on use), encoder and decoder of width
        ``ch`` for images of ``in_ch`` channels."""
        super().__init__()
        # in_ch is recorded only when not 1, so the MNIST manifest's config (written before it existed) stays as is
        self.config = dict(codebook_size=codebook_size, code_dim=code_dim, ch=ch) | ({"in_ch": in_ch} if in_ch != 1 else {})
        self.encoder = Encoder(ch, code_dim, in_ch)
        self.decoder = Decoder(ch, code_dim, in_ch)
        self.codebook = nn.Parameter(torch.empty(codebook_size, code_dim).uniform_(-1, 1))

    def unit_codebook(self) -> torch.Tensor:
        """The (V, d) l2-normalised code vectors."""
        return F.normalize(self.codebook, dim=1)

    def encode_continuous(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, S, S) -> unit vectors (N, d, S/4, S/4)."""
        return F.normalize(self.encoder(x), dim=1)

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """Unit vectors (N, d, H, W) -> codes (N, H, W): argmax cosine = argmin l2 on the sphere."""
        sim = torch.einsum("ndhw,vd->nhwv", z, self.unit_codebook())
        return sim.argmax(-1)

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (N, H, W) -> unit code vectors (N, d, H, W)."""
        return self.unit_codebook()[codes].permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor):
        """Returns (reconstruction, z, z_q, codes); z_q carries the straight-through gradient."""
        z = self.encode_continuous(x)
        codes = self.nearest(z)
        zq = self.embed(codes)
        zq_st = z + (zq - z).detach()
        return self.decoder(zq_st), z, zq, codes


def vq_losses(x, recon, z, zq, beta: float = 0.25) -> dict[str, torch.Tensor]:
    """Losses of a batch: images x and recon (N, C, S, S), encoder outputs z and their quantised codes zq
    (N, d, S/4, S/4) -> 0-d tensors: reconstruction MSE, codebook loss |sg(z) - z_q|^2 and commitment beta |z -
    sg(z_q)|^2."""
    return {
        "recon": F.mse_loss(recon, x),
        "codebook": F.mse_loss(zq, z.detach()),
        "commit": beta * F.mse_loss(z, zq.detach()),
    }


@functools.lru_cache(maxsize=4)
def load_vq(zoo: str = "mnist") -> VQModel:
    """The shipped tokenizer of ``zoo`` (hash-verified, eval mode, no grad)."""
    from .checkpoint import load_shipped

    return load_shipped(VQModel, CHECKPOINT, zoos.get(zoo).directory)


@torch.no_grad()
def encode(images: torch.Tensor, batch_size: int = 1000, zoo: str = "mnist") -> torch.Tensor:
    """Images (N, C, S, S) in [-1, 1] (natural256 also takes uint8) -> codes (N, side, side) int64 under the
    shipped tokenizer of ``zoo``."""
    z = zoos.get(zoo)
    model = load_vq(z.name)
    images = torch.as_tensor(images)
    z.data.check_images(images[:0])      # the shape check, before any work (batches are converted one by one)
    out = [model.nearest(model.encode_continuous(z.data.check_images(b))) for b in images.split(batch_size)]
    return torch.cat(out) if out else torch.empty(0, z.side, z.side, dtype=torch.int64)


@torch.no_grad()
def decode(codes: torch.Tensor, batch_size: int = 1000, zoo: str = "mnist") -> torch.Tensor:
    """Codes (N, side, side) or (N, side**2) ints -> images (N, C, S, S) float32, clamped to [-1, 1]."""
    z = zoos.get(zoo)
    model = load_vq(z.name)
    n = z.side
    codes = torch.as_tensor(codes)
    if codes.ndim == 2 and codes.shape[1] == n * n:
        codes = codes.reshape(-1, n, n)
    if codes.ndim != 3 or codes.shape[1:] != (n, n):
        raise ValueError(f"codes must be (N, {n}, {n}) or (N, {n * n}), got {tuple(codes.shape)}")
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise ValueError(f"codes must be integers, got {codes.dtype}")
    V = model.config["codebook_size"]
    if codes.numel() and (codes.min() < 0 or codes.max() >= V):
        raise ValueError(f"codes must lie in [0, {V}), got range [{int(codes.min())}, {int(codes.max())}]")
    codes = codes.long()
    out = [model.decoder(model.embed(b)).clamp(-1, 1) for b in codes.split(batch_size)]
    return torch.cat(out) if out else torch.empty(0, z.channels, z.image_size, z.image_size)


def codebook_embeddings(zoo: str = "mnist") -> torch.Tensor:
    """(V, d) float64 unit code vectors of the shipped tokenizer (input of lantern_neighbors)."""
    return load_vq(zoo).unit_codebook().double().clone()


def raw_codebook(zoo: str = "mnist") -> torch.Tensor:
    """(V, d) float64 code vectors as stored (before l2-normalisation): the input of LANTERN's neighbour
    table as released (Euclidean distance between the VQ's raw embedding weights)."""
    return load_vq(zoo).codebook.detach().double().clone()


def cached_tokens(zoo: str, part: str, compute):
    """``compute()`` -> (codes, labels), kept on disk under ``$COOLSD_ZOO_CACHE`` (when set) in a file named by
    the zoo, ``part``, the shipped VQ's sha256 and the data fingerprint, so training processes tokenize a large
    split once; without the variable, ``compute()``."""
    import os
    import pathlib

    root = os.environ.get("COOLSD_ZOO_CACHE")
    if not root:
        return compute()
    from .checkpoint import manifest_entry

    z = zoos.get(zoo)
    key = f"{z.name}-{part}-vq{manifest_entry(CHECKPOINT, z.directory)['sha256'][:16]}-data{z.data.fingerprint()[:16]}"
    path = pathlib.Path(root) / f"{key}.pt"
    if path.exists():
        codes, labels = torch.load(path)
        return codes, labels
    codes, labels = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save((codes, labels), path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)
    return codes, labels


@functools.lru_cache(maxsize=2)
def _token_dataset(zoo: str) -> tuple[torch.Tensor, torch.Tensor]:
    def compute():
        images, labels = zoos.get(zoo).data.train_split()
        return encode(images, zoo=zoo).reshape(len(images), -1), labels

    return cached_tokens(zoo, "train", compute)


def token_dataset(zoo: str = "mnist") -> tuple[torch.Tensor, torch.Tensor]:
    """(codes (N, side**2) int64 in raster order, labels (N,) int64) of the zoo's train split under its
    shipped VQ tokenizer (mnist: 4,000 x 49). Deterministic; computed once per process and cached (clones
    returned)."""
    codes, labels = _token_dataset(zoos.get(zoo).name)
    return codes.clone(), labels.clone()


def codebook_usage(codes: torch.Tensor, codebook_size: int) -> dict[str, float]:
    """Codes (any shape) ints in [0, codebook_size) -> the number and fraction of codes used at least once, and the
    perplexity exp(H(usage)) of the code histogram."""
    counts = torch.bincount(codes.reshape(-1), minlength=codebook_size).double()
    p = counts / counts.sum()
    nz = p[p > 0]  # 0 log 0 = 0
    return {"used": int((counts > 0).sum()), "usage": float((counts > 0).double().mean()),
            "perplexity": float(torch.exp(-(nz * nz.log()).sum()))}


class ZooDecoder:
    """A zoo's VQ decoder behind the ``decode_code`` name the CLI uses (``real.registry``'s zoo bundles): codes (N, T)
    -> images (N, C, S, S) (mnist: (N, 49) -> (N, 1, 28, 28); natural256: (N, 256) -> (N, 3, 64, 64))."""

    def __init__(self, zoo: str = "mnist"):
        """The decoder of zoo ``zoo`` (``real.zoo.zoos``)."""
        self.zoo = zoo

    def decode_code(self, codes: torch.Tensor) -> torch.Tensor:
        return decode(torch.as_tensor(codes).cpu(), zoo=self.zoo)
