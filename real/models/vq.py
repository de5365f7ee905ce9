"""LlamaGen's VQ image tokenizer (VQ-16 / VQ-8), written from its published description.

A VQGAN-style conv autoencoder: encoder (conv_in, ``conv_blocks`` of 2 ResNet blocks per level with
stride-2 downsampling and attention at the last level, mid ResNet-attention-ResNet, GroupNorm(32) +
swish + conv_out to z_channels = 256), ``quant_conv`` 1x1 to the codebook dim 8, a codebook of 16384
entries l2-normalised at use, ``post_quant_conv`` back to 256 channels and a mirrored decoder (3 ResNet
blocks per level, nearest-neighbour x2 upsampling) to RGB in [-1, 1]. Keys follow the published
checkpoints (``encoder.*``, ``decoder.*``, ``quantize.embedding.weight``, ``quantize.codebook_used``,
``quant_conv``, ``post_quant_conv``), so ``load_vq`` reads ``vq_ds16_c2i.pt`` / ``vq_ds16_t2i.pt``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from real.nn.checkpoint import extract_state_dict, load_checked, read_checkpoint

__all__ = ["VQConfig", "VQModel", "VQ_CONFIGS", "vq_config", "load_vq", "codebook_neighbors"]


@dataclass(frozen=True)
class VQConfig:
    """LlamaGen's VQ sizes (VQ-16 defaults): codebook_size codes of dimension codebook_embed_dim
    (l2-normalised at use), base channels ``ch`` times ``ch_mult`` per level, z_channels latent channels,
    ``num_res_blocks`` ResNet blocks per encoder level."""
    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    codebook_show_usage: bool = True     # the checkpoints carry a ``codebook_used`` (65536,) buffer
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    z_channels: int = 256
    num_res_blocks: int = 2

    @property
    def downsample(self) -> int:
        """Pixels per code side: 2^(len(ch_mult) - 1)."""
        return 2 ** (len(self.ch_mult) - 1)


VQ_CONFIGS = {
    "VQ-16": VQConfig(),
    "VQ-8": VQConfig(ch_mult=(1, 2, 2, 4)),
    "tiny": VQConfig(codebook_size=256, ch=32, ch_mult=(1, 2), z_channels=32, num_res_blocks=1, codebook_show_usage=False),
    # VQ-16's codebook (16,384 x 8) behind a narrow two-level coder: the real-size tier (real.realsize)
    "shallow": VQConfig(ch=32, ch_mult=(1, 2), z_channels=32, num_res_blocks=1, codebook_show_usage=False),
}


def vq_config(name: str, **overrides) -> VQConfig:
    """A copy of ``VQ_CONFIGS[name]`` with ``overrides`` applied; ValueError for an unknown name."""
    if name not in VQ_CONFIGS:
        raise ValueError(f"unknown VQ config {name!r}; choose from {sorted(VQ_CONFIGS)}")
    from dataclasses import replace

    return replace(VQ_CONFIGS[name], **overrides)


def code_grid(codes, grid: tuple[int, int] | None, V: int, device) -> tuple[torch.Tensor, tuple[int, int]]:
    """Checked codes (B, n) long on ``device`` (a 1-D row becomes B = 1) and their (h, w) grid (square
    when not given); ValueError for a non-square n without a grid, a grid that does not hold n codes,
    or codes outside [0, V)."""
    codes = torch.as_tensor(codes, device=device).long()
    if codes.ndim == 1:
        codes = codes[None]
    n = codes.shape[1]
    if grid is None:
        h = int(round(n ** 0.5))
        if h * h != n:
            raise ValueError(f"{n} codes are not a square grid; pass grid=(h, w)")
        grid = (h, h)
    if grid[0] * grid[1] != n:
        raise ValueError(f"grid {grid} does not hold {n} codes")
    if int(codes.min()) < 0 or int(codes.max()) >= V:
        raise ValueError(f"codes must lie in [0, {V})")
    return codes, tuple(grid)


def reset_convs(model: nn.Module, seed: int) -> None:
    """Seeded default initialisation (``torch.manual_seed(seed)``, then ``reset_parameters`` in module
    order) of every Conv2d and GroupNorm of a VQ model; the caller fills its codebook."""
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.GroupNorm)):
            m.reset_parameters()


def group_norm(c: int) -> nn.GroupNorm:
    """GroupNorm(32 groups, eps 1e-6) of the taming-transformers blocks."""
    return nn.GroupNorm(32, c, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """The taming-transformers residual block (LlamaGen's VQ, Chameleon's VQGAN); dropout has no
    parameters, so the state-dict keys are the same with or without it."""

    def __init__(self, cin: int, cout: int, dropout: float = 0.0):
        """GroupNorm, swish and conv3x3 twice (cin -> cout -> cout), dropout before the second conv, and a 1x1
        ``nin_shortcut`` when cin != cout."""
        super().__init__()
        self.norm1, self.conv1 = group_norm(cin), nn.Conv2d(cin, cout, 3, 1, 1)
        self.norm2, self.conv2 = group_norm(cout), nn.Conv2d(cout, cout, 3, 1, 1)
        self.dropout = nn.Dropout(dropout)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        """x (B, cin, H, W) -> (B, cout, H, W)."""
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with a residual: x (B, c, H, W) -> (B, c, H, W)."""

    def __init__(self, c: int):
        """GroupNorm and 1x1 q, k, v and proj_out convs (c -> c)."""
        super().__init__()
        self.norm = group_norm(c)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x):
        """x (B, c, H, W) -> (B, c, H, W): each of the H*W positions attends to all of them."""
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (t(y).reshape(b, 1, c, h * w).transpose(-1, -2) for t in (self.q, self.k, self.v))
        o = F.scaled_dot_product_attention(q, k, v)          # softmax(q k^T / sqrt(c)) v over positions
        return x + self.proj_out(o.transpose(-1, -2).reshape(b, c, h, w))


class Upsample(nn.Module):
    """Nearest-neighbour x2 then conv3x3: (B, c, H, W) -> (B, c, 2H, 2W)."""

    def __init__(self, c: int):
        """The conv3x3 (c -> c)."""
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x):
        """x (B, c, H, W) -> (B, c, 2H, 2W)."""
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Downsample(nn.Module):
    """Pad right and bottom by 1, then conv3x3 with stride 2: (B, c, H, W) -> (B, c, H/2, W/2) (H, W even)."""

    def __init__(self, c: int):
        """The stride-2 conv3x3 (c -> c)."""
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 2, 0)

    def forward(self, x):
        """x (B, c, H, W) -> (B, c, H/2, W/2)."""
        return self.conv(F.pad(x, (0, 1, 0, 1)))


def resnet_level(cin: int, cout: int, n_blocks: int, attn: bool, dropout: float = 0.0,
                 blocks: str = "res") -> nn.Module:
    """One resolution level of a taming VQ encoder / decoder: ``n_blocks`` ResNet blocks cin -> cout
    -> cout ... (under attribute ``blocks``: "res" in LlamaGen's keys, "block" in Chameleon's), each
    followed by a spatial ``AttnBlock(cout)`` in ``attn`` when ``attn`` is true. Modules are created in
    that order (so seeded default inits are unchanged); the caller adds the down- or upsampler."""
    lvl = nn.Module()
    res, att = nn.ModuleList(), nn.ModuleList()
    setattr(lvl, blocks, res)
    lvl.attn = att
    for _ in range(n_blocks):
        res.append(ResnetBlock(cin, cout, dropout))
        cin = cout
        if attn:
            att.append(AttnBlock(cout))
    return lvl


def run_level(lvl: nn.Module, h: torch.Tensor, blocks: str = "res") -> torch.Tensor:
    """A ``resnet_level`` on h (B, cin, H, W): each block (then its attention, if any), then the level's
    ``downsample`` / ``upsample`` when it has one -> (B, cout, H', W') (H' = H/2, 2H or H)."""
    for j, r in enumerate(getattr(lvl, blocks)):
        h = r(h)
        if len(lvl.attn):
            h = lvl.attn[j](h)
    for name in ("downsample", "upsample"):
        if hasattr(lvl, name):
            h = getattr(lvl, name)(h)
    return h


class Encoder(nn.Module):
    """LlamaGen's VQ encoder: images (B, in_channels, H, W) -> latents (B, z_channels, H/f, W/f), f =
    ``c.downsample``."""

    def __init__(self, c: VQConfig, in_channels: int = 3):
        """conv_in, one ``resnet_level`` per ch_mult entry
        (attention at the last; stride-2 ``downsample`` between levels), the mid ResNet-attention-ResNet, norm
        and conv_out, sized by ``c``."""
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, c.ch, 3, 1, 1)
        self.conv_blocks = nn.ModuleList()
        cin = c.ch
        n = len(c.ch_mult)
        for i, m in enumerate(c.ch_mult):
            blk = resnet_level(cin, c.ch * m, c.num_res_blocks, attn=i == n - 1)
            cin = c.ch * m
            if i != n - 1:
                blk.downsample = Downsample(cin)
            self.conv_blocks.append(blk)
        self.mid = nn.ModuleList([ResnetBlock(cin, cin), AttnBlock(cin), ResnetBlock(cin, cin)])
        self.norm_out = group_norm(cin)
        self.conv_out = nn.Conv2d(cin, c.z_channels, 3, 1, 1)

    def forward(self, x):
        """images x (B, in_channels, H, W) -> latents (B, z_channels, H/f, W/f)."""
        h = self.conv_in(x)
        for blk in self.conv_blocks:
            h = run_level(blk, h)
        for mod in self.mid:
            h = mod(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    """The mirrored decoder: latents (B, z_channels, h, w) -> images (B, out_channels, h*f, w*f)."""

    def __init__(self, c: VQConfig, out_channels: int = 3):
        """conv_in, the mid ResNet-attention-ResNet, one ``resnet_level`` of num_res_blocks + 1 blocks per ch_mult
        entry from the last (attention at the first built; nearest x2 ``upsample`` between levels), norm and
        conv_out."""
        super().__init__()
        n = len(c.ch_mult)
        cin = c.ch * c.ch_mult[-1]
        self.conv_in = nn.Conv2d(c.z_channels, cin, 3, 1, 1)
        self.mid = nn.ModuleList([ResnetBlock(cin, cin), AttnBlock(cin), ResnetBlock(cin, cin)])
        self.conv_blocks = nn.ModuleList()
        for i in reversed(range(n)):
            blk = resnet_level(cin, c.ch * c.ch_mult[i], c.num_res_blocks + 1, attn=i == n - 1)
            cin = c.ch * c.ch_mult[i]
            if i != 0:
                blk.upsample = Upsample(cin)
            self.conv_blocks.append(blk)
        self.norm_out = group_norm(cin)
        self.conv_out = nn.Conv2d(cin, out_channels, 3, 1, 1)

    def forward(self, z):
        """latents z (B, z_channels, h, w) -> images (B, out_channels, h*f, w*f)."""
        h = self.conv_in(z)
        for mod in self.mid:
            h = mod(h)
        for blk in self.conv_blocks:
            h = run_level(blk, h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """The codebook ``embedding`` (codebook_size, codebook_embed_dim), plus the checkpoints' ``codebook_used``
    (65536,) buffer when ``codebook_show_usage``."""

    def __init__(self, c: VQConfig):
        """The (codebook_size, codebook_embed_dim) embedding, sized by ``c``."""
        super().__init__()
        self.l2_norm = c.codebook_l2_norm
        self.embedding = nn.Embedding(c.codebook_size, c.codebook_embed_dim)
        if c.codebook_show_usage:
            self.register_buffer("codebook_used", torch.zeros(65536))

    def codebook(self) -> torch.Tensor:
        """(V, d) code vectors as used (l2-normalised when the tokenizer does so)."""
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w

    def quantize(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, d, h, w) -> codes (B, h*w), nearest code (after l2-normalising both sides)."""
        zf = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        if self.l2_norm:
            zf = F.normalize(zf, p=2, dim=-1)
        e = self.codebook()
        d = zf.pow(2).sum(1, keepdim=True) + e.pow(2).sum(1) - 2 * zf @ e.T
        return d.argmin(1).reshape(z.shape[0], -1)


class VQModel(nn.Module):
    """LlamaGen's VQ tokenizer: ``encode`` images (B, 3, H, W) -> codes (B, (H/f)(W/f)), ``decode_code`` codes ->
    images."""

    def __init__(self, c: VQConfig):
        """Encoder, decoder, quantizer and the 1x1 convs ``quant_conv`` (z_channels -> codebook_embed_dim) and
        ``post_quant_conv`` (back), default-initialised (``load_vq`` or ``random_init`` set the weights)."""
        super().__init__()
        self.config = c
        self.encoder = Encoder(c)
        self.decoder = Decoder(c)
        self.quantize = VectorQuantizer(c)
        self.quant_conv = nn.Conv2d(c.z_channels, c.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(c.codebook_embed_dim, c.z_channels, 1)

    @torch.no_grad()
    def random_init(self, seed: int = 0) -> "VQModel":
        """Seeded random weights (convs default-initialised, codebook l2-normalised)."""
        reset_convs(self, seed)
        w = torch.randn(self.quantize.embedding.weight.shape, generator=torch.Generator().manual_seed(seed))
        self.quantize.embedding.weight.copy_(F.normalize(w, dim=-1))
        return self

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) in [-1, 1] -> codes (B, (H/f)*(W/f))."""
        return self.quantize.quantize(self.quant_conv(self.encoder(images)))

    @torch.no_grad()
    def decode_code(self, codes: torch.Tensor, grid: tuple[int, int] | None = None, clamp: bool = True) -> torch.Tensor:
        """codes (B, h*w) ints -> images (B, 3, h*f, w*f) in [-1, 1] (clamped unless ``clamp=False``)."""
        codes, grid = code_grid(codes, grid, self.config.codebook_size, self.post_quant_conv.weight.device)
        z = self.quantize.codebook()[codes].reshape(len(codes), grid[0], grid[1], -1).permute(0, 3, 1, 2)
        x = self.decoder(self.post_quant_conv(z.to(self.post_quant_conv.weight.dtype)))
        return x.clamp(-1, 1) if clamp else x


def load_vq(source, cfg: VQConfig | str = "VQ-16", *, device="cpu", dtype=torch.float32) -> VQModel:
    """VQ tokenizer from a published checkpoint (path or loaded object; state dict under "model" or raw)."""
    c = vq_config(cfg) if isinstance(cfg, str) else cfg
    obj = read_checkpoint(source) if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__") else source
    m = VQModel(c)
    load_checked(m, extract_state_dict(obj), what="VQ checkpoint")
    return m.to(device=device, dtype=dtype).eval()


@torch.no_grad()
def codebook_neighbors(codebook: torch.Tensor, K: int, chunk: int = 1024, normalize: bool = False) -> torch.Tensor:
    """(V, K) int64: for each code the K nearest OTHER codes by Euclidean distance, nearest first
    (the LANTERN neighbour table of docs/theory.md section 6 at full V = 16384 without a dense V x V matrix in
    memory: one (chunk, V) block at a time; ``theory.rules.lantern_neighbors`` is the small-V reference; ties broken
    by lower index).
    Pass the raw code vectors (``quantize.embedding.weight``), as LANTERN's release does; ``normalize=True``
    l2-normalises them first (our earlier table)."""
    E = codebook.double()
    if normalize:
        E = F.normalize(E, p=2, dim=-1)
    V = E.shape[0]
    if not 1 <= K <= V - 1:
        raise ValueError(f"K must be in [1, {V - 1}], got {K}")
    sq = (E * E).sum(1)
    out = []
    for s in range(0, V, chunk):
        d2 = sq[s:s + chunk, None] + sq[None, :] - 2 * E[s:s + chunk] @ E.T
        d2[torch.arange(d2.shape[0]), torch.arange(s, s + d2.shape[0])] = float("inf")
        # stable order: sort by (distance, index)
        # the K columns copied out: a slice would keep each chunk's whole (chunk, V) sorted index array alive (2 GiB
        # over V = 16,384 codes); held this way the build's memory is one chunk's arrays plus the (V, K) table
        order = torch.sort(d2, dim=1, stable=True).indices[:, :K].clone()
        out.append(order)
    return torch.cat(out).cpu()
