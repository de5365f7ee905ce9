"""Transformer pieces shared by the LlamaGen GPT (``real.models.llamagen``), the EAGLE-1 drafter (``real.models.eagle``)
and the transformers adapters' heads (FastLlama, ``real.models.llama``, uses only ``RMSNorm``): dense layers (``linear``, with packed / fused weight copies inside an
``inference_weights`` scope), attention-head geometry of a config, RMSNorm, LlamaGen's 2-D RoPE (table,
complex form, rotation), attention (``attend``) and its grouped-query form (``gqa_heads``), and the SwiGLU MLP
with checkpoint-specific projection names.
"""
from __future__ import annotations

import contextlib
import math
import os
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .devpath import host_path


__all__ = ["linear", "inference_weights", "scoped", "stale_inference", "HeadGeometry", "RMSNorm", "rms_norm", "rope_table_2d",
           "complex_rope", "apply_rope", "rope_qkv", "attend", "gqa_heads", "SwiGLU", "swiglu"]


# CPU dense layers: weights (nn.Parameters) are packed once into oneDNN's blocked layout and multiplied by its
# GEMM (``torch.ops.mkldnn``, as inductor does after freezing). Measured on the dev machine (AMD Zen 5, torch
# 2.13, one thread, 30 weights of 256 x 704-768 cycled as in a forward): 0.34-0.45x the time of ``F.linear`` (MKL
# sgemm) at 52-400 rows, 0.47-0.6x at 2-8 rows; on small weights oneDNN's ~13 us call overhead loses to MKL's
# ~5 us (benchmarks/bench_kernels.py measures both on any machine; results/kernels.txt).
_ONEDNN = (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
           and os.environ.get("COOLSD_CPU_GEMM", "onednn") != "default")
# oneDNN for products of >= 2^21 multiply-adds, or weights of > 2^17 entries (streamed from past L2 in a forward,
# where packing pays even at 2 rows); MKL for the small rest (in the engine's batch-1 rounds, per call: 256 x 256
# at 2-8 rows 19-27 us MKL vs 28-31 us oneDNN, 704 x 256 at 2 rows 43 vs 36 us, 1024 x 256 at 8 rows 92 vs 58 us)
ONEDNN_MIN_MACS = 1 << 21
ONEDNN_MIN_WEIGHT = 1 << 17
_onednn_linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_CACHE: dict = {}     # ids of a weight tuple -> [weak refs, signature, concatenation, packed copy or None]
_SCOPE = 0            # open ``inference_weights`` scopes


@contextlib.contextmanager
def inference_weights():
    """A scope in which ``linear`` keeps concatenated / oneDNN-packed copies of the ``nn.Parameter`` weights it
    multiplies (the weights must not change inside; ``real.decode.engine.generate`` runs in one). Leaving the outermost
    scope drops the copies, so outside one no weight is ever read from a copy (training with fused optimisers,
    ``swap_tensors`` conversions, in-place writes through ``.data`` or numpy views are all safe)."""
    global _SCOPE
    _SCOPE += 1
    try:
        yield
    finally:
        _SCOPE -= 1
        if _SCOPE == 0:
            _CACHE.clear()


def _inference(*tensors) -> bool:
    """Whether the fast kernels may run: inside an ``inference_weights`` scope and no gradient wanted through
    any of ``tensors`` (None entries ignored)."""
    return bool(_SCOPE) and not (torch.is_grad_enabled()
                                 and any(t is not None and t.requires_grad for t in tensors))


def _signature(w: torch.Tensor) -> tuple:
    # an inference tensor (made inside engine.generate's inference mode) has no version counter and cannot change
    return -1 if w.is_inference() else w._version, w.data_ptr(), w.dtype, w.shape, w.stride(), w.storage_offset()


def stale_inference(t: torch.Tensor | None) -> bool:
    """Whether ``t`` is a buffer made inside ``torch.inference_mode`` (``engine.generate`` runs in one) that is now
    used outside it, where such a tensor can be neither written in place nor saved for autograd: its owner then
    rebuilds it (KV caches, RoPE tables)."""
    return t is not None and t.is_inference() and not torch.is_inference_mode_enabled()


def _entry(ws: tuple) -> list:
    """The cache entry of the weights ws ((out_i, in) each): [weak refs, signatures, their concatenation along out,
    its oneDNN-packed copy (filled by ``linear`` at first use), whether all are ``nn.Parameter``s, whether oneDNN
    can multiply them (float32 on CPU, ``_ONEDNN``)], cached for the current ``inference_weights`` scope and rebuilt
    whenever one of them changed within it (torch's version counter, storage, dtype, shape or strides)."""
    key = tuple(map(id, ws))
    e = _CACHE.get(key)
    if e is not None:
        for r, s, w in zip(e[0], e[1], ws):
            if r() is not w or s != _signature(w):
                break
        else:
            return e
    drop = lambda _, key=key: _CACHE.pop(key, None)  # noqa: E731  (ids may be reused once a weight dies)
    cat = ws[0].detach() if len(ws) == 1 else torch.cat([w.detach() for w in ws])
    e = _CACHE[key] = [tuple(weakref.ref(w, drop) for w in ws), tuple(map(_signature, ws)), cat, None,
                       all(isinstance(t, nn.Parameter) for t in ws),
                       _ONEDNN and cat.dtype is torch.float32 and host_path(cat.device)]
    return e


def scoped(module: nn.Module, build):
    """``build()`` (a decoder layer's weights and constants, gathered by module attribute lookups at ~1 us each, ~20
    per layer call), built once per ``inference_weights`` scope for ``module`` and on every call outside one. Inside
    a scope the module's parameters must stay the same objects (as ``linear``'s cached copies assume)."""
    if not _SCOPE:
        return build()
    key = ("layer", id(module))
    e = _CACHE.get(key)
    if e is None or e[0]() is not module:
        e = _CACHE[key] = (weakref.ref(module), build())
    return e[1]


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``: x (..., in), w (out, in) or a tuple of weights (out_i, in) applied as one (their outputs
    concatenated: a fused q/k/v projection of separately stored weights), b (out,) or None -> (..., out).
    Every dense layer of the engine's models calls this. Inside ``inference_weights()`` (``engine.generate``),
    without autograd, with ``nn.Parameter`` weights: a tuple is one GEMM on the cached concatenation, and on
    CPU in float32, above ``ONEDNN_MIN_WEIGHT`` weight entries or ``ONEDNN_MIN_MACS`` multiply-adds, the
    product runs on oneDNN with the weights packed once (``_entry``; the same result up to float rounding;
    ``COOLSD_CPU_GEMM=default`` in the environment turns oneDNN off). Elsewhere (training included, so the
    arithmetic of the shipped checkpoints' training runs is unchanged) each weight is its own ``F.linear``."""
    if type(w) is not tuple:
        n = w.numel()
        if n <= ONEDNN_MIN_WEIGHT and x.numel() // w.shape[-1] * n < ONEDNN_MIN_MACS:
            return F.linear(x, w, b)      # what every path below does for one small weight: no cache lookup
        ws = (w,)
    else:
        ws = w
    if _SCOPE and (not torch.is_grad_enabled() or _inference(x, b, *ws)) and not torch.compiler.is_compiling():
        e = _entry(ws)
        if e[4]:                            # nn.Parameters: the cached concatenation (and packed copy)
            cat = e[2]
            if e[5] and x.dtype is torch.float32 and (
                    cat.numel() > ONEDNN_MIN_WEIGHT or x.numel() // cat.shape[1] * cat.numel() >= ONEDNN_MIN_MACS):
                if e[3] is None:
                    e[3] = torch.ops.mkldnn._reorder_linear_weight(cat)
                return _onednn_linear(x, e[3], b, "none", [], "")
            return F.linear(x, cat, b)
    if len(ws) == 1:
        return F.linear(x, ws[0], b)
    if b is not None:
        return F.linear(x, torch.cat(ws), b)
    return torch.cat([F.linear(x, t) for t in ws], -1)


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
    if x.dtype == torch.float32 and weight.dtype == torch.float32 and _inference(x, weight):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)   # one call (inference_weights scopes only, as attend)
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
    f32 = x.dtype is torch.float32
    xs = (x if f32 else x.float()).reshape(*x.shape[:-1], -1, 2)
    if xs.stride(-1) != 1 or any(st % 2 for st in xs.stride()[:-1]):
        xs = xs.contiguous()
    y = torch.view_as_real(torch.view_as_complex(xs) * r).flatten(3)
    return y if f32 else y.type_as(x)


def rope_qkv(qkv: torch.Tensor, rot: torch.Tensor, n_head: int, n_kv: int):
    """Fused projections qkv (B, S, (n_head + 2 n_kv) Dh) -> q (B, n_head, S, Dh), k, v (B, n_kv, S, Dh),
    q and k rotated by ``apply_rope`` in one rotation (rot as there)."""
    B, S, _ = qkv.shape
    hd = qkv.shape[-1] // (n_head + 2 * n_kv)
    qk, v = qkv.split_with_sizes([(n_head + n_kv) * hd, n_kv * hd], dim=-1)
    qk = apply_rope(qk.view(B, S, n_head + n_kv, hd), rot)
    return (qk[:, :, :n_head].transpose(1, 2), qk[:, :, n_head:].transpose(1, 2),
            v.view(B, S, n_kv, hd).transpose(1, 2))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v: q (B, H, S, d), k, v (B, H, K, d), mask (B or 1, 1, S, K) bool
    (True = visible) or None; ``causal`` (no mask, S = K) for whole sequences. ``scaled_dot_product_attention``,
    except for single-query blocks of more than 8 (row, head) pairs on CPU in float32 (ragged batched decoding),
    where the three operations written out are faster (torch 2.13, one thread: 0.70-0.97x the fused kernel's
    time at 8-64 rows x 4 heads over 200 keys; the fused kernel takes 0.73-0.92x the written-out time for
    B x H <= 8 or S > 1; benchmarks/results/kernels.txt). The fused kernel is used on CPU in float32 only inside
    ``inference_weights()`` without autograd: elsewhere (training, feature extraction for it) the written-out form
    keeps the arithmetic, hence the bits, of the shipped checkpoints' training runs."""
    if q.dtype != torch.float32 or not host_path(q.device) or (
            _inference(q, k, v) and (q.shape[-2] > 1 or q.shape[0] * q.shape[1] <= 8)):
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
    g, u = linear(x, (w_gate, w_up)).split_with_sizes([w_gate.shape[0], w_up.shape[0]], dim=-1)   # one GEMM
    return linear(F.silu(g) * u, w_down)


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
