"""VQ tokenizer for 28x28 digits: conv encoder (downsample 4 -> 7x7 tokens), l2-normalised
codebook (LlamaGen-style: low code dimension, nearest code by cosine similarity, which equals the
l2 nearest code on unit vectors), conv decoder.

Public API (shipped weights ``checkpoints/vq.safetensors``)::

    encode(images (N, 1, 28, 28) in [-1, 1]) -> codes (N, 7, 7) int64
    decode(codes (N, 7, 7) or (N, 49) int) -> images (N, 1, 28, 28) float32 in [-1, 1]
    codebook_embeddings() -> (V, d) float64 unit rows   (the vectors the tokenizer uses)
    raw_codebook() -> (V, d) float64 stored rows        (LANTERN's release ranks neighbours on these)
    token_dataset() -> (codes (4000, 49) int64, labels (4000,)) the train split (``data``) tokenized
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from . import data

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
    """Digits (N, 1, 28, 28) -> (N, code_dim, 7, 7): conv, two stride-2 convs, a ResBlock, 1x1 conv."""

    def __init__(self, ch: int, code_dim: int):
        """Layers of width ``ch`` (``ch // 2`` at 28 x 28) and ``code_dim`` outputs."""
        super().__init__()
        self.conv_in = nn.Conv2d(1, ch // 2, 3, padding=1)
        self.down1 = nn.Conv2d(ch // 2, ch, 4, stride=2, padding=1)  # 28 -> 14
        self.down2 = nn.Conv2d(ch, ch, 4, stride=2, padding=1)  # 14 -> 7
        self.res = ResBlock(ch)
        self.conv_out = nn.Conv2d(ch, code_dim, 1)

    def forward(self, x):
        """x (N, 1, 28, 28) -> (N, code_dim, 7, 7), not normalised."""
        h = F.silu(self.down1(F.silu(self.conv_in(x))))
        h = self.res(self.down2(h))
        return self.conv_out(F.silu(h))


class Decoder(nn.Module):
    """Code vectors (N, code_dim, 7, 7) -> digits (N, 1, 28, 28): conv, ResBlock, two stride-2 transposed convs,
    conv."""

    def __init__(self, ch: int, code_dim: int):
        """Layers of width ``ch`` (``ch // 2`` at 28 x 28) from ``code_dim`` inputs."""
        super().__init__()
        self.conv_in = nn.Conv2d(code_dim, ch, 3, padding=1)
        self.res = ResBlock(ch)
        self.up1 = nn.ConvTranspose2d(ch, ch, 4, stride=2, padding=1)  # 7 -> 14
        self.up2 = nn.ConvTranspose2d(ch, ch // 2, 4, stride=2, padding=1)  # 14 -> 28
        self.conv_out = nn.Conv2d(ch // 2, 1, 3, padding=1)

    def forward(self, z):
        """z (N, code_dim, 7, 7) -> (N, 1, 28, 28) (unbounded; about [-1, 1] once trained)."""
        h = F.silu(self.res(self.conv_in(z)))
        h = F.silu(self.up2(F.silu(self.up1(h))))
        return self.conv_out(h)


class VQModel(nn.Module):
    """Encoder -> unit vectors z (N, d, 7, 7) -> nearest unit code -> decoder.

    ``codebook`` (V, d) is stored unnormalised and normalised on use (as in LlamaGen's VQ with
    l2-normalised codes), so only directions matter.
    """

    def __init__(self, codebook_size: int = 512, code_dim: int = 8, ch: int = 32):
        """``codebook`` (codebook_size, code_dim) uniform(-1, 1) (normalised on use), encoder and decoder of width
        ``ch``."""
        super().__init__()
        self.config = dict(codebook_size=codebook_size, code_dim=code_dim, ch=ch)
        self.encoder = Encoder(ch, code_dim)
        self.decoder = Decoder(ch, code_dim)
        self.codebook = nn.Parameter(torch.empty(codebook_size, code_dim).uniform_(-1, 1))

    def unit_codebook(self) -> torch.Tensor:
        """The (V, d) l2-normalised code vectors."""
        return F.normalize(self.codebook, dim=1)

    def encode_continuous(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 1, 28, 28) -> unit vectors (N, d, 7, 7)."""
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
    """Losses of a batch: images x and recon (N, 1, 28, 28), encoder outputs z and their quantised codes zq
    (N, d, 7, 7) -> 0-d tensors: reconstruction MSE, codebook loss |sg(z) - z_q|^2 and commitment beta |z -
    sg(z_q)|^2."""
    return {
        "recon": F.mse_loss(recon, x),
        "codebook": F.mse_loss(zq, z.detach()),
        "commit": beta * F.mse_loss(z, zq.detach()),
    }


@functools.lru_cache(maxsize=1)
def load_vq() -> VQModel:
    """The shipped tokenizer (hash-verified, eval mode, no grad)."""
    from .checkpoint import load_shipped

    return load_shipped(VQModel, CHECKPOINT)


@torch.no_grad()
def encode(images: torch.Tensor, batch_size: int = 1000) -> torch.Tensor:
    """Images (N, 1, 28, 28) in [-1, 1] -> codes (N, 7, 7) int64 under the shipped tokenizer."""
    model = load_vq()
    images = data.check_images(images)
    return torch.cat([model.nearest(model.encode_continuous(b)) for b in images.split(batch_size)]
                     or [torch.empty(0, TOKENS, TOKENS, dtype=torch.int64)])


@torch.no_grad()
def decode(codes: torch.Tensor, batch_size: int = 1000) -> torch.Tensor:
    """Codes (N, 7, 7) or (N, 49) ints -> images (N, 1, 28, 28) float32, clamped to [-1, 1]."""
    model = load_vq()
    codes = torch.as_tensor(codes)
    if codes.ndim == 2 and codes.shape[1] == TOKENS * TOKENS:
        codes = codes.reshape(-1, TOKENS, TOKENS)
    if codes.ndim != 3 or codes.shape[1:] != (TOKENS, TOKENS):
        raise ValueError(f"codes must be (N, 7, 7) or (N, 49), got {tuple(codes.shape)}")
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise ValueError(f"codes must be integers, got {codes.dtype}")
    V = model.config["codebook_size"]
    if codes.numel() and (codes.min() < 0 or codes.max() >= V):
        raise ValueError(f"codes must lie in [0, {V}), got range [{int(codes.min())}, {int(codes.max())}]")
    codes = codes.long()
    out = [model.decoder(model.embed(b)).clamp(-1, 1) for b in codes.split(batch_size)]
    return torch.cat(out) if out else torch.empty(0, 1, 28, 28)


def codebook_embeddings() -> torch.Tensor:
    """(V, d) float64 unit code vectors of the shipped tokenizer (input of lantern_neighbors)."""
    return load_vq().unit_codebook().double().clone()


def raw_codebook() -> torch.Tensor:
    """(V, d) float64 code vectors as stored (before l2-normalisation): the input of LANTERN's neighbour
    table as released (Euclidean distance between the VQ's raw embedding weights)."""
    return load_vq().codebook.detach().double().clone()


@functools.lru_cache(maxsize=1)
def _token_dataset() -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = data.train_split()
    codes = encode(images).reshape(len(images), -1)
    return codes, labels


def token_dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """(codes (4000, 49) int64 in raster order, labels (4000,) int64) of the train split under the
    shipped VQ tokenizer. Deterministic; computed once per process and cached (clones returned)."""
    codes, labels = _token_dataset()
    return codes.clone(), labels.clone()


def codebook_usage(codes: torch.Tensor, codebook_size: int) -> dict[str, float]:
    """Codes (any shape) ints in [0, codebook_size) -> the number and fraction of codes used at least once, and the
    perplexity exp(H(usage)) of the code histogram."""
    counts = torch.bincount(codes.reshape(-1), minlength=codebook_size).double()
    p = counts / counts.sum()
    nz = p[p > 0]  # 0 log 0 = 0
    return {"used": int((counts > 0).sum()), "usage": float((counts > 0).double().mean()),
            "perplexity": float(torch.exp(-(nz * nz.log()).sum()))}
