"""Chameleon's image decoder (the VQGAN of Meta's Chameleon release, used by Lumina-mGPT), written from
its published description: codes -> pixels.

Chameleon tokenises 512 px images into 32 x 32 codes of an 8192-entry codebook (downsampling 16) with a
taming-transformers VQGAN. Its ``vqgan.yaml`` (``model.params``) gives ``embed_dim`` (256),
``n_embed`` (8192) and ``ddconfig`` (``ch`` 128, ``ch_mult`` [1, 1, 2, 2, 4], ``num_res_blocks`` 2,
``attn_resolutions`` [], ``z_channels`` 256, ``resolution`` 512, ``out_ch`` 3, ``double_z`` false,
``dropout`` 0); ``vqgan.ckpt`` holds the weights under ``"state_dict"``.

Decoder (taming layout, state-dict keys as in the checkpoint): ``quantize.embedding`` (n_embed,
embed_dim) looked up without normalisation -> ``post_quant_conv`` 1x1 (embed_dim -> z_channels) ->
``decoder.conv_in`` 3x3 (z -> ch * ch_mult[-1]) -> ``decoder.mid.block_1`` ResNet, ``mid.attn_1``
single-head spatial self-attention, ``mid.block_2`` ResNet -> levels i = L-1 .. 0, each
``decoder.up.{i}.block.{0..num_res_blocks}`` ResNet blocks to ch * ch_mult[i] channels (an
``attn.{j}`` after block j when the level's resolution is in attn_resolutions) and, for i > 0,
``decoder.up.{i}.upsample.conv`` after nearest x2 -> GroupNorm(32, eps 1e-6) + swish +
``decoder.conv_out`` 3x3 to RGB in about [-1, 1]. ResNet block: norm1, swish, conv1 (3x3), norm2,
swish, (dropout), conv2 (3x3), plus ``nin_shortcut`` 1x1 when the channel count changes; no
time embedding. The encoder half (``encoder.*``, ``quant_conv``) is transformers'
``ChameleonVQVAE`` with the same key names: ``load_chameleon_vqgan(..., with_encoder=True)`` loads it
there for pixels -> codes. Training-only keys (``loss.*``) are skipped.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from real.nn.checkpoint import extract_state_dict, load_checked, read_checkpoint
from .vq import AttnBlock, ResnetBlock, Upsample, code_grid, group_norm, reset_convs, resnet_level, run_level  # shared with LlamaGen's VQ

__all__ = ["VQGANConfig", "ChameleonVQGAN", "read_vqgan_yaml", "load_chameleon_vqgan", "CHAMELEON_VQGAN",
           "split_vqgan_state"]


@dataclass(frozen=True)
class VQGANConfig:
    """A taming VQGAN's ``vqgan.yaml`` values (module docstring); every ch * ch_mult[i] must be divisible by 32
    (GroupNorm(32))."""
    n_embed: int = 8192
    embed_dim: int = 256
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = ()
    z_channels: int = 256
    resolution: int = 512
    out_ch: int = 3
    in_channels: int = 3
    double_z: bool = False
    dropout: float = 0.0

    def __post_init__(self):
        if any(self.ch * m % 32 for m in self.ch_mult):
            raise ValueError(f"GroupNorm(32) needs channel counts divisible by 32: ch={self.ch}, ch_mult={self.ch_mult}")

    @property
    def downsample(self) -> int:
        """Pixels per code side: 2^(len(ch_mult) - 1)."""
        return 2 ** (len(self.ch_mult) - 1)

    def to_hf(self):
        """The matching transformers ``ChameleonVQVAEConfig`` (encoder side)."""
        from transformers import ChameleonVQVAEConfig

        return ChameleonVQVAEConfig(embed_dim=self.embed_dim, num_embeddings=self.n_embed, double_latent=self.double_z,
                                    latent_channels=self.z_channels, resolution=self.resolution,
                                    in_channels=self.in_channels, base_channels=self.ch,
                                    channel_multiplier=list(self.ch_mult), num_res_blocks=self.num_res_blocks,
                                    attn_resolutions=list(self.attn_resolutions) or None, dropout=self.dropout)


CHAMELEON_VQGAN = VQGANConfig()   # Chameleon's published vqgan.yaml values (8192 codes, ds16)


def read_vqgan_yaml(path: str) -> VQGANConfig:
    """``vqgan.yaml`` (taming format: model.params.{embed_dim, n_embed, ddconfig}) -> VQGANConfig."""
    import yaml

    with open(path) as f:
        y = yaml.safe_load(f)
    try:
        p = y["model"]["params"]
        dd = p["ddconfig"]
        return VQGANConfig(n_embed=int(p["n_embed"]), embed_dim=int(p["embed_dim"]), ch=int(dd["ch"]),
                           ch_mult=tuple(int(x) for x in dd["ch_mult"]), num_res_blocks=int(dd["num_res_blocks"]),
                           attn_resolutions=tuple(int(x) for x in dd.get("attn_resolutions", []) or []),
                           z_channels=int(dd["z_channels"]), resolution=int(dd.get("resolution", 512)),
                           out_ch=int(dd.get("out_ch", 3)), in_channels=int(dd.get("in_channels", 3)),
                           double_z=bool(dd.get("double_z", False)), dropout=float(dd.get("dropout", 0.0)))
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a taming VQGAN config (model.params.ddconfig / n_embed / embed_dim): missing {e}") from e


class _Decoder(nn.Module):
    def __init__(self, c: VQGANConfig):
        super().__init__()
        n = len(c.ch_mult)
        cin = c.ch * c.ch_mult[-1]
        res = c.resolution // 2 ** (n - 1)
        self.conv_in = nn.Conv2d(c.z_channels, cin, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(cin, cin, c.dropout)
        self.mid.attn_1 = AttnBlock(cin)
        self.mid.block_2 = ResnetBlock(cin, cin, c.dropout)
        levels: list[nn.Module] = [None] * n
        for i in reversed(range(n)):
            lvl = resnet_level(cin, c.ch * c.ch_mult[i], c.num_res_blocks + 1, res in c.attn_resolutions,
                               c.dropout, blocks="block")
            cin = c.ch * c.ch_mult[i]
            if i != 0:
                lvl.upsample = Upsample(cin)
                res *= 2
            levels[i] = lvl
        self.up = nn.ModuleList(levels)
        self.norm_out = group_norm(cin)
        self.conv_out = nn.Conv2d(cin, c.out_ch, 3, padding=1)

    def forward(self, z):
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for i in reversed(range(len(self.up))):
            h = run_level(self.up[i], h, "block")
        return self.conv_out(F.silu(self.norm_out(h)))


class _Quantize(nn.Module):
    def __init__(self, c: VQGANConfig):
        super().__init__()
        self.embedding = nn.Embedding(c.n_embed, c.embed_dim)


class ChameleonVQGAN(nn.Module):
    """Codes (B, h*w) or (B, h, w) -> images (B, 3, 16h, 16w) in [-1, 1] (Chameleon: 8192 codes, ds16).
    ``encoder`` (optional): transformers' ``ChameleonVQVAE`` for pixels -> codes."""

    def __init__(self, c: VQGANConfig = CHAMELEON_VQGAN):
        """The decoder half with default-initialised weights
        (``load_chameleon_vqgan`` or ``random_init`` set them): codebook (n_embed, embed_dim),
        ``post_quant_conv`` (embed_dim -> z_channels) and the decoder; no encoder (``encoder_model`` None)."""
        super().__init__()
        self.config = c
        self.quantize = _Quantize(c)
        self.post_quant_conv = nn.Conv2d(c.embed_dim, c.z_channels, 1)
        self.decoder = _Decoder(c)
        self.encoder_model = None

    @property
    def codebook(self) -> torch.Tensor:
        """The code vectors (n_embed, embed_dim), as looked up (no normalisation)."""
        return self.quantize.embedding.weight

    @torch.no_grad()
    def random_init(self, seed: int = 0) -> "ChameleonVQGAN":
        """Seeded random weights: convs and norms default-initialised, codebook (n_embed, embed_dim) N(0, 1)."""
        reset_convs(self, seed)
        self.quantize.embedding.weight.copy_(torch.randn(self.codebook.shape, generator=torch.Generator().manual_seed(seed)))
        return self

    @torch.no_grad()
    def decode_code(self, codes: torch.Tensor, grid: tuple[int, int] | None = None, clamp: bool = True) -> torch.Tensor:
        """Codes (B, h*w) (grid (h, w), square when None) or (B, h, w), ints in [0, n_embed) -> images
        (B, out_ch, h*f, w*f) in the model dtype, f = 2^(len(ch_mult) - 1), in about [-1, 1]
        (clamped unless ``clamp=False``). ValueError for codes that do not fill the grid or lie outside
        [0, n_embed)."""
        c = torch.as_tensor(codes)
        if c.ndim == 3:                 # (B, h, w) grids
            grid = tuple(c.shape[1:])
            c = c.flatten(1)
        c, grid = code_grid(c, grid, self.config.n_embed, self.codebook.device)
        z = self.codebook[c].view(len(c), grid[0], grid[1], -1).permute(0, 3, 1, 2)
        x = self.decoder(self.post_quant_conv(z.to(self.post_quant_conv.weight.dtype)))
        return x.clamp(-1, 1) if clamp else x

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) in [-1, 1] -> codes (B, H/16 * W/16) through transformers' encoder."""
        if self.encoder_model is None:
            raise ValueError("no encoder loaded: load_chameleon_vqgan(..., with_encoder=True)")
        return self.encoder_model.encode(images.to(self.codebook.dtype)).image_tokens.view(images.shape[0], -1)

    @staticmethod
    def to_uint8(images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, H, W, 3) uint8 (Chameleon's post-processing: clamp, (x+1)/2, *255)."""
        return ((images.clamp(-1, 1) + 1) / 2 * 255).to(torch.uint8).permute(0, 2, 3, 1)


_DECODER_PREFIXES = ("decoder.", "post_quant_conv.", "quantize.embedding.")
_ENCODER_PREFIXES = ("encoder.", "quant_conv.")
_SKIP_PREFIXES = ("loss.",)


def split_vqgan_state(state: dict) -> tuple[dict, dict]:
    """(decoder-side keys, encoder-side keys) of a VQGAN state dict; ``loss.*`` dropped; any other key
    stays in the decoder part so that the strict load names it as unexpected."""
    dec, enc = {}, {}
    for k, v in state.items():
        if k.startswith(_SKIP_PREFIXES):
            continue
        (enc if k.startswith(_ENCODER_PREFIXES) else dec)[k] = v
    return dec, enc


def load_chameleon_vqgan(ckpt, config: VQGANConfig | str | None = None, *, with_encoder: bool = False,
                         device="cpu", dtype=torch.float32) -> ChameleonVQGAN:
    """The decoder from ``vqgan.ckpt`` (a path or a loaded object) and ``vqgan.yaml`` (a path, a
    ``VQGANConfig``, or None for Chameleon's published values). Missing / unexpected keys and bad shapes
    raise one ValueError naming them. ``with_encoder``: also load the encoder half into transformers'
    ``ChameleonVQVAE`` (same key names) for ``encode``."""
    c = read_vqgan_yaml(config) if isinstance(config, str) else (config or CHAMELEON_VQGAN)
    obj = read_checkpoint(ckpt) if isinstance(ckpt, (str, bytes)) or hasattr(ckpt, "__fspath__") else ckpt
    dec, enc = split_vqgan_state(extract_state_dict(obj))
    m = ChameleonVQGAN(c)
    load_checked(m, dec, what="Chameleon VQGAN checkpoint (decoder)")
    if with_encoder:
        from transformers.models.chameleon.modeling_chameleon import ChameleonVQVAE

        e = ChameleonVQVAE(c.to_hf())
        enc = {**enc, "quantize.embedding.weight": dec["quantize.embedding.weight"],
               "post_quant_conv.weight": dec["post_quant_conv.weight"], "post_quant_conv.bias": dec["post_quant_conv.bias"]}
        load_checked(e, enc, what="Chameleon VQGAN checkpoint (encoder)")
        m.encoder_model = e.eval()
    m = m.to(device=device, dtype=dtype).eval()
    if m.encoder_model is not None:
        m.encoder_model.to(device=device, dtype=dtype)
    return m
