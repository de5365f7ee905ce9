"""LlamaGen (Sun et al. 2024) class- and caption-conditional GPT, written from its published description.

Architecture (facts checked against the public release, code not copied): a Llama decoder over
[condition prefix; image tokens]. RMSNorm (statistics in float32), SwiGLU with hidden size
``find_multiple(int(2 * 4 * dim / 3) [* ffn_dim_multiplier], multiple_of)``, no biases, final norm and
an untied output head over the VQ codebook (V = 16384). Prefix: c2i, one class-embedding token
(``num_classes + 1`` rows, the last being the CFG null class, present when class_dropout_prob > 0);
t2i, 120 caption tokens of dim 2048 (flan-t5-xl) through a 2-layer GELU(tanh) MLP, the null caption
being a learned ``uncond_embedding`` (120, 2048). Positions: 2-D RoPE on image tokens (half of each
head's rotary pairs for the row, half for the column, interleaved pairs), and for prefix positions the
rotary factors are zero, which (as upstream) zeroes the prefix queries and keys. A static KV cache
(gpt-fast style) with rollback and compaction, following ``real.protocol``.

State-dict keys are upstream's (``tok_embeddings``, ``cls_embedding.*``, ``layers.N.attention.wqkv|wo``,
``layers.N.feed_forward.w1|w2|w3``, ``layers.N.attention_norm|ffn_norm``, ``norm``, ``output``), so the
published checkpoints load with ``load_llamagen``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from real.nn.blocks import EAGER
from real.nn.devpath import to_device
from real.nn.checkpoint import extract_state_dict, load_checked, read_checkpoint
from real.nn.kvcache import CachedRows, KVCache
from real.nn.layers import (HeadGeometry, RMSNorm, SwiGLU, gqa_heads, complex_rope, linear, rms_norm, rope_qkv, scoped,
                             stale_inference,
                             rope_table_2d)
from real.protocol import Caption, ModelOutput, Placed, as_conds

__all__ = ["LlamaGenConfig", "LlamaGen", "CONFIGS", "config", "load_llamagen", "truncated", "find_multiple"]


def find_multiple(n: int, k: int) -> int:
    """Smallest multiple of k that is >= n (upstream's SwiGLU sizing rule)."""
    return n if n % k == 0 else n + k - n % k


@dataclass(frozen=True)
class LlamaGenConfig(HeadGeometry):
    """A LlamaGen GPT's sizes (names as in the release's ``ModelArgs``): width ``dim``, layers, heads
    (``n_kv_head`` None: all), FFN sizing (``multiple_of``, ``ffn_dim_multiplier``), RoPE base, norm eps, the
    prefix (``cls_token_num`` = P positions: a class, or caption features (caption_tokens, caption_dim)), V
    image tokens and ``block_size`` image tokens per image (a square grid)."""
    dim: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    num_classes: int = 1000
    caption_dim: int = 2048
    caption_tokens: int = 120          # rows of the t2i uncond_embedding
    class_dropout_prob: float = 0.1    # > 0 means the checkpoint has the CFG null class / caption
    model_type: str = "c2i"
    vocab_size: int = 16384
    cls_token_num: int = 1             # prefix length P (c2i 1, t2i 120)
    block_size: int = 256              # image tokens per image (a square grid)

    def __post_init__(self):
        if self.model_type not in ("c2i", "t2i"):
            raise ValueError(f"model_type must be 'c2i' or 't2i', got {self.model_type!r}")
        self._check_heads()
        if (self.head_dim // 2) % 2:
            raise ValueError(f"2-D RoPE needs head_dim divisible by 4, got {self.head_dim}")

    @property
    def ffn_hidden(self) -> int:
        """SwiGLU width: int(2/3 of 4 dim), times ``ffn_dim_multiplier`` when set, rounded up to a multiple of
        ``multiple_of``."""
        h = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            h = int(self.ffn_dim_multiplier * h)
        return find_multiple(h, self.multiple_of)


# published sizes (head dim 64) and tiny ones for tests / CPU demos
_SIZES = {
    "B": dict(n_layer=12, n_head=12, dim=768),
    "L": dict(n_layer=24, n_head=16, dim=1024),
    "XL": dict(n_layer=36, n_head=20, dim=1280),
    "XXL": dict(n_layer=48, n_head=24, dim=1536),
    "tiny": dict(n_layer=4, n_head=4, dim=128, vocab_size=256, num_classes=10, block_size=64, multiple_of=64),
    "tiny-draft": dict(n_layer=1, n_head=2, dim=64, vocab_size=256, num_classes=10, block_size=64, multiple_of=64),
    # the published vocabulary (16,384 codes) and classes (1,000), 2 narrow layers: the real-size tier (real.realsize)
    "shallow": dict(n_layer=2, n_head=2, dim=64, multiple_of=64),
}
CONFIGS = tuple(_SIZES)


def config(name: str, *, image_size: int | None = None, downsample: int = 16, model_type: str = "c2i",
           **overrides) -> LlamaGenConfig:
    """Config ``B``/``L``/``XL``/``XXL`` (or ``tiny``/``tiny-draft``); ``image_size`` sets
    block_size = (image_size / downsample)^2; t2i sets the 120-token caption prefix."""
    if name not in _SIZES:
        raise ValueError(f"unknown LlamaGen config {name!r}; choose from {CONFIGS}")
    kw = dict(_SIZES[name])
    if image_size is not None:
        if image_size % downsample:
            raise ValueError(f"image_size {image_size} not divisible by downsample {downsample}")
        kw["block_size"] = (image_size // downsample) ** 2
    if model_type == "t2i":
        kw["cls_token_num"] = 120
        if name.startswith("tiny"):
            kw.update(cls_token_num=8, caption_tokens=8, caption_dim=32)
    kw["model_type"] = model_type
    kw.update(overrides)
    return LlamaGenConfig(**kw)


# --------------------------------------------------------------------------- layers

class Attention(nn.Module):
    """LlamaGen's attention: fused q/k/v projection ``wqkv`` (dim -> (n_head + 2 kv_heads) head_dim), 2-D RoPE on q
    and k, grouped-query ``gqa_heads``, output ``wo`` (dim -> dim)."""

    def __init__(self, c: LlamaGenConfig):
        """Projections sized by ``c`` (default-initialised)."""
        super().__init__()
        self.n_head, self.n_kv, self.hd, self.dim = c.n_head, c.kv_heads, c.head_dim, c.dim
        self.wqkv = nn.Linear(c.dim, (c.n_head + 2 * c.kv_heads) * c.head_dim, bias=False)
        self.wo = nn.Linear(c.dim, c.dim, bias=False)

    def forward(self, x, rot, mask, cache: KVCache | None = None, i: int = 0):
        """x (B, S, dim), rot (S or B x S, head_dim/2, 2), mask (B or 1, 1, S, K) bool or None; with
        ``cache`` the block is written into layer i's slots and attends over the row's cached entries."""
        q, k, v = rope_qkv(self.wqkv(x), rot, self.n_head, self.n_kv)
        if cache is not None:
            k, v = cache.update(i, k, v)
        return self.wo(gqa_heads(q, k, v, mask))


class FeedForward(SwiGLU):
    """LlamaGen's SwiGLU MLP (dim -> ffn_hidden -> dim): x (B, S, dim) -> (B, S, dim)."""

    def __init__(self, c: LlamaGenConfig):
        """dim -> ffn_hidden -> dim, sized by ``c``."""
        super().__init__(c.dim, c.ffn_hidden)


class Block(nn.Module):
    """One pre-norm transformer layer: attention and SwiGLU feed-forward, each after an RMSNorm and added back
    (residual); x (B, S, dim) -> (B, S, dim)."""

    def __init__(self, c: LlamaGenConfig):
        """Attention, feed-forward and their two RMSNorms, sized by ``c``."""
        super().__init__()
        self.attention = Attention(c)
        self.feed_forward = FeedForward(c)
        self.attention_norm = RMSNorm(c.dim, c.norm_eps)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.fns = EAGER            # real.nn.blocks.compile_blocks swaps in the compiled functions

    def forward(self, x, rot, mask, cache=None, i=0):
        """Pre-norm attention + SwiGLU residual block (``real.nn.blocks.block_pre`` / ``block_post``, compilable):
        x (B, S, dim) -> (B, S, dim); rot, mask, cache, i as ``Attention.forward``."""
        an_w, an_eps, wqkv, nh, nkv, wo, n_w, eps, ff = scoped(self, self._weights)
        q, k, v = self.fns.pre(x, rot, an_w, an_eps, wqkv, nh, nkv)
        if cache is not None:
            k, v = cache.update(i, k, v)
        return self.fns.post(x, q, k, v, mask, wo, n_w, eps, *ff)

    def _weights(self) -> tuple:
        """(attention norm weight, eps, wqkv weight, heads, kv heads, wo weight, ffn norm weight, eps, SwiGLU
        weights): what ``forward`` passes to the block functions."""
        a, n, an = self.attention, self.ffn_norm, self.attention_norm
        return (an.weight, an.eps, a.wqkv.weight, a.n_head, a.n_kv, a.wo.weight, n.weight, n.eps,
                self.feed_forward.weights())


class LabelEmbedder(nn.Module):
    """c2i prefix: class embeddings ``embedding_table`` (num_classes + 1 with the CFG null class, dim); class id k
    -> row k."""

    def __init__(self, c: LlamaGenConfig):
        """The (num_classes + [class_dropout_prob > 0], dim) table."""
        super().__init__()
        self.embedding_table = nn.Embedding(c.num_classes + int(c.class_dropout_prob > 0), c.dim)


class MLP(nn.Module):
    """Two bias-free linear layers with GELU(tanh) between (LlamaGen's caption projection)."""

    def __init__(self, cin: int, hidden: int, cout: int):
        """fc1 (cin -> hidden) and fc2 (hidden -> cout)."""
        super().__init__()
        self.fc1 = nn.Linear(cin, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, cout, bias=False)

    def forward(self, x):
        """x (..., cin) -> (..., cout) through GELU(tanh)."""
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """t2i prefix: caption features (N, caption_dim) projected to (N, dim) by ``cap_proj``; ``uncond_embedding``
    (caption_tokens, caption_dim) is the CFG null caption."""

    def __init__(self, c: LlamaGenConfig):
        """``cap_proj`` = MLP(caption_dim -> dim -> dim) and the (caption_tokens, caption_dim) null-caption buffer
        (N(0, 1/caption_dim) until loaded)."""
        super().__init__()
        self.cap_proj = MLP(c.caption_dim, c.dim, c.dim)
        self.register_buffer("uncond_embedding", torch.randn(c.caption_tokens, c.caption_dim) / c.caption_dim ** 0.5)


# --------------------------------------------------------------------------- model

class LlamaGen(Placed, CachedRows, nn.Module):
    """LlamaGen GPT implementing ``real.protocol.ARModel`` for a batch of images (``real.nn.kvcache.KVCache``,
    one row per image, two with CFG).

    Conditions: c2i an int class id (or 0-d tensor); t2i a ``Caption`` (left-padded flan-t5 features,
    mask); ``prefill`` takes one condition or a list. The cache is (re)allocated by ``prefill`` for
    ``P + block_size + extra_slots`` entries per row."""
    _placed_by = "tok_embeddings.weight"
    needs_features = False
    row_masks = True        # forward takes (rows, S, K) attention masks, one per row (real.nn.kvcache)

    def __init__(self, c: LlamaGenConfig, extra_slots: int = 64):
        """Layers sized by ``c``, default-initialised (``random_init`` or a checkpoint loader set the weights);
        ``extra_slots``: cache entries per row beyond P + block_size. ``rope`` (P + block_size, head_dim/2)
        complex64 stays float32-based under a bf16 cast."""
        super().__init__()
        self.config = c
        self.vocab_size = c.vocab_size
        self.extra_slots = extra_slots
        self.cls_embedding = LabelEmbedder(c) if c.model_type == "c2i" else CaptionEmbedder(c)
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        # a plain attribute, not a buffer: it stays float32 when the model is cast to bf16 (as upstream)
        self.rope = complex_rope(rope_table_2d(math.isqrt(c.block_size), c.head_dim, c.rope_base, c.cls_token_num))
        self.cache: KVCache | None = None
        self._prefix_mask: torch.Tensor | None = None   # (R, P) bool, t2i caption padding

    # ---------------------------------------------------------------- weights
    @torch.no_grad()
    def random_init(self, seed: int = 0, std: float = 0.02, output_std: float | None = None,
                    embed_std: float | None = None) -> "LlamaGen":
        """Normal(0, std) weights (norms 1), seeded; the output head gets ``output_std`` and the token /
        class embeddings ``embed_std`` (both default std)."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                s = std
                if name == "output.weight" and output_std is not None:
                    s = output_std
                elif (name.startswith("tok_embeddings") or name.startswith("cls_embedding.embedding_table")) \
                        and embed_std is not None:
                    s = embed_std
                p.normal_(0.0, s, generator=g)
        if isinstance(self.cls_embedding, CaptionEmbedder):
            u = self.cls_embedding.uncond_embedding
            u.normal_(0.0, u.shape[-1] ** -0.5, generator=g)
        return self

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) float32 from last hidden states (..., dim) (the EAGLE drafter reuses this head)."""
        return linear(hidden, self.output.weight).float()

    # ---------------------------------------------------------------- cache
    def cache_bytes(self, rows: int) -> int:
        """Memory of the KV cache ``prefill`` allocates for ``rows`` rows."""
        c = self.config
        n = c.cls_token_num + c.block_size + self.extra_slots
        return 2 * c.n_layer * rows * c.kv_heads * n * c.head_dim * self.tok_embeddings.weight.element_size()

    def setup_cache(self, rows: int, max_len: int) -> None:
        """Empty KV cache of ``rows`` rows x ``max_len`` entries (reused when the allocated one fits)."""
        c = self.config
        if self.cache is None or not self.cache.fits(c.n_layer, rows, max_len, self.dtype, self.device):
            self.cache = KVCache(c.n_layer, rows, c.kv_heads, max_len, c.head_dim, dtype=self.dtype, device=self.device)
        self.cache.reset()

    @property
    def cache_floor(self) -> int:
        """Cache entries a rollback never removes: the condition prefix (``real.nn.kvcache.CachedRows``)."""
        return self.config.cls_token_num

    @property
    def prefix_len(self) -> int:
        """Positions of the condition prefix (class token or caption): a feature drafter's cache is sized by it."""
        return self.config.cls_token_num

    # ---------------------------------------------------------------- forward
    def _run(self, h: torch.Tensor, position_ids, attn_mask, return_hidden: bool, logits_from: int):
        """h (R, S, dim) embedded block; position_ids (S,) or (R, S) absolute, host or device."""
        cache = self.cache
        S = h.shape[1]
        if isinstance(position_ids, np.ndarray) and position_ids.size:   # host positions: checked without a sync
            lo, hi = int(position_ids.min()), int(position_ids.max())
            if hi >= self.rope.shape[0] or lo < 0:
                raise ValueError(f"positions must lie in [0, prefix + block_size = {self.rope.shape[0]}), got "
                                 f"[{lo}, {hi}]")
        pos = torch.as_tensor(position_ids, dtype=torch.long)
        if pos.shape[-1] != S or pos.ndim > 2 or (pos.ndim == 2 and pos.shape[0] != h.shape[0]):
            raise ValueError(f"position_ids must be ({S},) or ({h.shape[0]}, {S}), got {tuple(pos.shape)}")
        if self.rope.device != h.device or stale_inference(self.rope):
            self.rope = self.rope.to(h.device) if not self.rope.is_inference() else self.rope.clone().to(h.device)
        rot = self.rope[to_device(pos, h.device) if isinstance(position_ids, np.ndarray) else pos.to(h.device)]
        mask = cache.begin(S, attn_mask)
        for i, layer in enumerate(self.layers):
            h = layer.forward(h, rot, mask, cache, i)     # (no module hooks on the blocks: skip __call__'s cost)
        h = rms_norm(h, self.norm.weight, self.norm.eps)
        cache.commit()
        logits = self.head(h[:, logits_from:])
        return ModelOutput(logits, h if return_hidden else None)

    def _prefix(self, conds: list, cfg: bool) -> torch.Tensor:
        """(R, P, dim) prefix embeddings of the batch's conditions: R = B, or 2B with CFG ([cond; uncond])."""
        c = self.config
        B = len(conds)
        if c.model_type == "c2i":
            labels = []
            for cond in conds:
                if isinstance(cond, Caption):
                    raise ValueError("c2i LlamaGen needs class ids, got a Caption")
                label = int(cond)
                if not 0 <= label < c.num_classes:
                    raise ValueError(f"class id {label} out of range [0, {c.num_classes})")
                labels.append(label)
            if cfg:
                if c.class_dropout_prob <= 0:
                    raise ValueError("this LlamaGen has no null class (class_dropout_prob = 0): CFG unavailable")
                labels += [c.num_classes] * B
            self._prefix_mask = None
            return self.cls_embedding.embedding_table(to_device(labels, self.device, torch.long))[:, None]
        if not all(isinstance(cond, Caption) for cond in conds):
            bad = next(type(x).__name__ for x in conds if not isinstance(x, Caption))
            raise ValueError(f"t2i LlamaGen needs Caption conditions, got {bad}")
        rows = []
        for cond in conds:
            emb = cond.embedding.to(self.device, self.dtype)
            if tuple(emb.shape) != (c.cls_token_num, c.caption_dim):
                raise ValueError(f"caption embedding must be ({c.cls_token_num}, {c.caption_dim}), got {tuple(emb.shape)}")
            rows.append(emb)
        masks = [torch.ones(c.cls_token_num, dtype=torch.bool, device=self.device) if x.mask is None
                 else x.mask.to(self.device, torch.bool) for x in conds]
        if cfg:
            rows += [self.cls_embedding.uncond_embedding[: c.cls_token_num].to(self.dtype)] * B
            masks += masks
        pm = torch.stack(masks)
        self._prefix_mask = None if bool(pm.all()) else pm
        return self.cls_embedding.cap_proj(torch.stack(rows))[:, : c.cls_token_num]

    @torch.no_grad()
    def prefill(self, cond, tokens: torch.Tensor | None = None, *, cfg: bool = False,
                return_hidden: bool = False) -> ModelOutput:
        """Reset the cache, run [prefix; tokens] for a condition or a list of B conditions: tokens (R, S),
        logits (R, 1 + S, V), hidden (R, P + S, D); R = B, or 2B with CFG (rows [cond; uncond])."""
        conds = as_conds(cond)
        R = len(conds) * (2 if cfg else 1)
        P = self.config.cls_token_num
        self.setup_cache(R, P + self.config.block_size + self.extra_slots)
        h = self._prefix(conds, cfg)
        self.cache.hide_prefix(self._prefix_mask)        # t2i caption padding: hidden except from itself (upstream)
        if tokens is not None and tokens.numel():
            tokens = self._check_tokens(tokens, R)
            h = torch.cat([h, self.tok_embeddings(tokens)], dim=1)
        S = h.shape[1]
        return self._run(h, np.arange(S), None, return_hidden, P - 1)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, *, position_ids=None, attn_mask: torch.Tensor | None = None,
                return_hidden: bool = False) -> ModelOutput:
        """Append image tokens (R, S) on every row's cache: logits (R, S, V) (+ hidden (R, S, D)).
        ``position_ids`` (S,) or (R, S) absolute positions (numpy: range-checked on the host; default:
        each row's own cache length + arange(S)); ``attn_mask`` as ``real.nn.kvcache.KVCache.begin``."""
        cache = self._need_cache()
        tokens = self._check_tokens(tokens, cache.rows)
        S = tokens.shape[1]
        if position_ids is None:
            position_ids = cache.lens[:, None] + np.arange(S)
        return self._run(self.tok_embeddings(tokens), position_ids, attn_mask, return_hidden, 0)

    def _check_tokens(self, tokens, B):
        tokens = torch.as_tensor(tokens, device=self.device, dtype=torch.long)
        if tokens.ndim != 2 or tokens.shape[0] != B:
            raise ValueError(f"tokens must be (B={B}, S), got shape {tuple(tokens.shape)}")
        return tokens


# --------------------------------------------------------------------------- helpers

def truncated(model: LlamaGen, n_layer: int) -> LlamaGen:
    """A layer-skip draft: the first ``n_layer`` blocks of ``model`` with its embeddings, final norm
    and head (same tokenizer, shares nothing mutable with ``model``)."""
    c = replace(model.config, n_layer=n_layer)
    d = LlamaGen(c, model.extra_slots).to(model.device, model.dtype)
    sd = {k: v for k, v in model.state_dict().items() if not k.startswith("layers.") or int(k.split(".")[1]) < n_layer}
    load_checked(d, sd, what="truncated LlamaGen")
    return d


def load_llamagen(source, cfg: LlamaGenConfig | str, *, device="cpu", dtype=torch.float32, **config_kw) -> LlamaGen:
    """LlamaGen from an upstream checkpoint (path or loaded object; state dict raw or under
    "model"/"module"/"state_dict") and a config (``LlamaGenConfig`` or a name for ``config``).
    Mismatches raise ValueError naming missing/unexpected keys and bad shapes."""
    c = config(cfg, **config_kw) if isinstance(cfg, str) else cfg
    obj = read_checkpoint(source) if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__") else source
    sd = extract_state_dict(obj)
    m = LlamaGen(c)
    load_checked(m, sd, ignore=("freqs_cis", "kv_cache", "causal_mask"), what="LlamaGen checkpoint")
    return m.to(device=device, dtype=dtype).eval()
