"""Transformer pieces shared by the LlamaGen GPT (``real.llamagen``), the EAGLE-1 drafter (``real.eagle``)
and the fast Llama (``real.llama``): attention-head geometry of a config, RMSNorm, LlamaGen's 2-D RoPE
(table, complex form, rotation), attention (``attend``) and its grouped-query form (``gqa_heads``), and
the SwiGLU MLP with checkpoint-specific projection names.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


__all__ = ["HeadGeometry", "RMSNorm", "rms_norm", "rope_table_2d", "complex_rope", "apply_rope", "rope_qkv", "attend",
           "gqa_heads", "SwiGLU", "swiglu"]


class HeadGeometry:
    """Attention-head geometry of a transformer config (a mixin for frozen dataclasses): ``head_dim``
    and ``kv_heads`` from the fields named by ``_head_fields`` = (width, heads, kv heads or None), and
    ``_check_heads``, the checks a config with a square image grid needs (width divisible by heads, heads
    by kv heads, ``block_size`` a square number of image tokens)."""
    _head_fields = ("dim", "n_head", "n_kv_head")

    @property
    def head_dim(self) -> int:
        """Channels per attention head: width / heads."""
        width, heads, _ = self._head_fields
        return getattr(self, width) // getattr(self, heads)

    @property
    def kv_heads(self) -> int:
        """Key-value heads (the kv field; all heads when it is None)."""
        _, heads, kv = self._head_fields
        return getattr(self, kv) or getattr(self, heads)

    def _check_heads(self) -> None:
        width, heads, kv = self._head_fields
        w, h = getattr(self, width), getattr(self, heads)
        if w % h:
            raise ValueError(f"{width} {w} not divisible by {heads} {h}")
        if h % self.kv_heads:
            raise ValueError(f"{heads} {h} not divisible by {kv} {self.kv_heads}")
        if math.isqrt(self.block_size) ** 2 != self.block_size:
            raise ValueError(f"block_size must be a square number of image tokens, got {self.block_size}")


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension: weight (dim,), statistics in float32."""

    def __init__(self, dim: int, eps: float):
        """weight (dim,) ones; ``eps`` is added to the mean square."""
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        """x (..., dim) -> (..., dim): ``rms_norm`` with this weight."""
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., dim) -> (..., dim): x / rms(x) (statistics in float32) times weight (dim,)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def rope_table_2d(grid: int, head_dim: int, base: float, prefix: int) -> torch.Tensor:
    """(prefix + grid^2, head_dim/2, 2) cos/sin per absolute position; zeros for the prefix rows.
    Image token j = (row a, col b), j = a * grid + b: pair m < head_dim/4 rotates with a * w_m, the
    others with b * w_m, w_m = base^(-2m / (head_dim/2))."""
    half = head_dim // 2
    w = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    ang = torch.outer(torch.arange(grid).float(), w)                      # (grid, head_dim/4)
    grid_ang = torch.cat([ang[:, None, :].expand(grid, grid, -1), ang[None, :, :].expand(grid, grid, -1)], -1)
    tab = torch.stack([grid_ang.cos(), grid_ang.sin()], -1).flatten(0, 1)  # (grid^2, head_dim/2, 2)
    return torch.cat([torch.zeros(prefix, half, 2), tab])


def complex_rope(table: torch.Tensor) -> torch.Tensor:
    """The (N, Dh/2, 2) cos/sin table of ``rope_table_2d`` as (N, Dh/2) complex cos + i sin (what the
    models keep: a rotation is then one complex product)."""
    return torch.view_as_complex(table.float().contiguous())


def apply_rope(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x (B, S, H, Dh), rot (S, Dh/2) or (B, S, Dh/2) complex (``complex_rope``), or the real (..., 2)
    table: rotate interleaved pairs (in float32)."""
    if not rot.is_complex():
        rot = complex_rope(rot)
    r = rot[:, :, None] if rot.ndim == 3 else rot[None, :, None]
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    if xs.stride(-1) != 1 or any(st % 2 for st in xs.stride()[:-1]):
        xs = xs.contiguous()
    return torch.view_as_real(torch.view_as_complex(xs) * r).flatten(3).type_as(x)


def rope_qkv(qkv: torch.Tensor, rot: torch.Tensor, n_head: int, n_kv: int):
    """Fused projections qkv (B, S, (n_head + 2 n_kv) Dh) -> q (B, n_head, S, Dh), k, v (B, n_kv, S, Dh),
    q and k rotated by ``apply_rope`` in one rotation (rot as there)."""
    B, S, _ = qkv.shape
    hd = qkv.shape[-1] // (n_head + 2 * n_kv)
    qk, v = qkv.split([(n_head + n_kv) * hd, n_kv * hd], dim=-1)
    qk = apply_rope(qk.view(B, S, n_head + n_kv, hd), rot)
    return (qk[:, :, :n_head].transpose(1, 2), qk[:, :, n_head:].transpose(1, 2),
            v.view(B, S, n_kv, hd).transpose(1, 2))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v: q (B, H, S, d), k, v (B, H, K, d), mask (B or 1, 1, S, K) bool
    (True = visible) or None; ``causal`` (no mask, S = K) for whole sequences. On CPU the three
    operations written out (the engine's blocks are small: S <= 58 queries over <= a few hundred keys, where
    this is ~3x faster than torch's fused CPU kernel); elsewhere ``scaled_dot_product_attention``."""
    if q.device.type != "cpu" or q.dtype != torch.float32:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    a = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril_(k.shape[-2] - q.shape[-2])
    if mask is not None:
        a = a.masked_fill(~mask, float("-inf"))
    return a.softmax(-1) @ v


def gqa_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              causal: bool = False) -> torch.Tensor:
    """Grouped-query attention: q (B, H, S, d), k, v (B, Hkv, K, d) (H a multiple of Hkv: each kv head serves
    H / Hkv query heads), then ``attend`` (mask (B or 1, 1, S, K) bool or None, ``causal`` as there).
    Returns the heads concatenated, (B, S, H * d)."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    B, H, S, d = q.shape
    return attend(q, k, v, mask, causal).transpose(1, 2).reshape(B, S, H * d)


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)): x (..., dim), w_gate, w_up (hidden, dim), w_down (dim, hidden) -> (..., dim)."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): x (..., dim) -> (..., dim) through ``hidden`` units, no biases. The three
    projections are registered (in this order) under the names ``names`` = (gate, up, down): LlamaGen's
    ``w1, w3, w2`` here; a subclass renames them to fit its checkpoints."""
    names = ("w1", "w3", "w2")

    def __init__(self, dim: int, hidden: int):
        """gate and up (dim -> hidden) and down (hidden -> dim) projections, no biases, registered under ``names``."""
        super().__init__()
        gate, up, down = self.names
        setattr(self, gate, nn.Linear(dim, hidden, bias=False))
        setattr(self, up, nn.Linear(dim, hidden, bias=False))
        setattr(self, down, nn.Linear(hidden, dim, bias=False))

    def forward(self, x):
        """x (..., dim) -> (..., dim)."""
        return swiglu(x, *self.weights())

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate (hidden, dim), up (hidden, dim), down (dim, hidden)) weights."""
        return tuple(getattr(self, n).weight for n in self.names)
