"""EAGLE-1 drafter for AR image models, in the checkpoint layout of the LANTERN code release.

The drafter (Li et al. 2024, EAGLE; used by LANTERN / LANTERN++ for LlamaGen) predicts the target's next
last-hidden-state from pairs (token x_{t+1}, target hidden h_t):
  h'_t = fc([embed(x_{t+1}); h_t])  ->  one (or more) Llama decoder layers  ->  f_t,
and drafts from ``head(f_t)``, the target's own LM head. Facts from the LANTERN release (checked, not
copied): ``fc`` has a bias by default, decoder layer 0 has NO ``input_layernorm`` (later layers do),
there is no final norm, the token embedding ``embed_tokens`` is a frozen copy of the target's, RMSNorm
eps 1e-6, RoPE is LlamaGen's 2-D RoPE with zero rotary factors on the pairs whose token is a prefix
position (P - 1 of them; prefix tokens are fed as id 0), and the target hidden states are taken after
the target's final norm. State-dict keys: ``embed_tokens.weight``, ``fc.weight``, ``fc.bias``,
``layers.0.self_attn.{q,k,v,o}_proj.weight``, ``layers.0.mlp.{gate,up,down}_proj.weight``,
``layers.0.post_attention_layernorm.weight``.

In the engine the drafter is a ``real.protocol.FeatureDrafter``: it cannot propose the first image
token (it needs the target's hidden state at the last prefix position), so its first round is a
single target step; afterwards accepted tokens are re-fed with the target's features, replacing the
drafter's own predictions (EAGLE-1).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from real.nn.checkpoint import extract_state_dict, load_checked, read_checkpoint
from real.nn.blocks import EAGER
from real.nn.layers import HeadGeometry, RMSNorm, SwiGLU, complex_rope, linear, rope_table_2d, scoped, stale_inference
from real.nn.kvcache import CachedRows, KVCache
from real.protocol import ModelOutput, Placed

__all__ = ["EagleConfig", "EagleDrafter", "load_lantern_drafter", "save_lantern_drafter", "eagle_pairs",
           "record_features", "eagle_loss", "train_eagle"]

_INPUT_TYPES = {"c2i": 576, "t2i": 256, "t2i2": 1024}   # LANTERN's block sizes per drafter input_type


@dataclass(frozen=True)
class EagleConfig(HeadGeometry):
    """An EAGLE-1 drafter's sizes (LANTERN's ``config.json`` names): hidden size D, MLP width, attention
    (and key-value) heads, V image tokens, ``block_size`` image tokens per image
    (a square grid, for the 2-D RoPE), decoder layers, RMSNorm eps, RoPE base, and whether ``fc`` has a bias."""
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    block_size: int                     # image tokens per image (square grid) for the 2-D RoPE
    num_key_value_heads: int | None = None
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_base: float = 10000.0
    bias: bool = True                   # fc bias
    _head_fields = ("hidden_size", "num_attention_heads", "num_key_value_heads")   # not a field (no annotation)

    def __post_init__(self):
        self._check_heads()

    @classmethod
    def from_lantern_json(cls, d: dict) -> "EagleConfig":
        """From a LANTERN drafter ``config.json`` (HF LlamaConfig fields + ``input_type`` + optional ``bias``)."""
        missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in d]
        if missing:
            raise ValueError(f"drafter config.json lacks {missing}")
        bs = d.get("block_size") or _INPUT_TYPES.get(d.get("input_type", ""), None)
        if bs is None:
            raise ValueError(f"drafter config.json: unknown input_type {d.get('input_type')!r} and no block_size")
        return cls(hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
                   num_attention_heads=d["num_attention_heads"], vocab_size=d["vocab_size"], block_size=bs,
                   num_key_value_heads=d.get("num_key_value_heads"), num_hidden_layers=d.get("num_hidden_layers", 1),
                   rms_norm_eps=d.get("rms_norm_eps", 1e-6), rope_base=d.get("rope_base", 10000.0),
                   bias=d.get("bias", True))


class _Attention(nn.Module):
    def __init__(self, c: EagleConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, c.hidden_size, bias=False)

    def wqkv(self) -> tuple:
        """The q, k, v projection weights ((nh hd, hidden), (nkv hd, hidden) x 2), used as one fused projection."""
        return self.q_proj.weight, self.k_proj.weight, self.v_proj.weight


class _MLP(SwiGLU):
    names = ("gate_proj", "up_proj", "down_proj")     # transformers' / LANTERN's keys

    def __init__(self, c: EagleConfig):
        super().__init__(c.hidden_size, c.intermediate_size)


class _Layer(nn.Module):
    def __init__(self, c: EagleConfig, index: int):
        super().__init__()
        self.self_attn = _Attention(c)
        self.mlp = _MLP(c)
        if index != 0:
            self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.fns = EAGER            # real.nn.blocks.compile_blocks swaps in the compiled functions

    def forward(self, x, rot, mask, cache=None, i=0):
        """x (B, S, hidden), rot (S or B x S, hd/2) complex, mask (B or 1, 1, S, K) bool or None -> (B, S,
        hidden). With ``cache`` the block's keys/values go into layer i's slots (inference); without, causal
        attention over x (training). Norm, fused q/k/v projection and RoPE: ``real.nn.blocks.block_pre`` (no norm in
        layer 0); attention output, residual and SwiGLU: ``real.nn.blocks.block_post``."""
        ln_w, eps0, wqkv, nh, nkv, wo, n_w, eps, mlp = scoped(self, self._weights)
        q, k, v = self.fns.pre(x, rot, ln_w, eps0, wqkv, nh, nkv)
        if cache is not None:
            k, v = cache.update(i, k, v)
        return self.fns.post(x, q, k, v, mask, wo, n_w, eps, *mlp, cache is None)

    def _weights(self) -> tuple:
        """(input norm weight or None, its eps, q/k/v weights, heads, kv heads, o weight, post-attention norm weight,
        its eps, SwiGLU weights): what ``forward`` passes to the block functions."""
        a, n = self.self_attn, self.post_attention_layernorm
        ln = self._modules.get("input_layernorm")
        return (None if ln is None else ln.weight, 0.0 if ln is None else ln.eps, a.wqkv(), a.nh, a.nkv,
                a.o_proj.weight, n.weight, n.eps, self.mlp.weights())


class EagleDrafter(Placed, CachedRows, nn.Module):
    """EAGLE-1 drafter (``real.protocol.FeatureDrafter``) drafting through the target's LM head.

    ``head`` is the target's output ``nn.Linear`` (not registered here: it is the target's and stays
    frozen); ``head_index`` (V,) optionally maps image tokens 0..V-1 to the ids of a larger LM
    vocabulary (rows of the head and of ``embed_tokens``), as ``real.adapters.hf.HFCausalLM(image_token_ids=...)``."""
    _placed_by = "fc.weight"
    needs_features = True
    row_masks = True        # forward takes (rows, S, K) attention masks, one per row (real.nn.kvcache)

    def __init__(self, c: EagleConfig, head: nn.Linear, head_index: torch.Tensor | None = None, extra_slots: int = 64):
        """``c``: the drafter's sizes; ``head``: the target's output ``nn.Linear`` (D -> LM vocabulary), kept
        unregistered and frozen; ``head_index`` (V,) int64 or None: LM ids of image tokens 0..V-1 (rows of
        ``head`` and of ``embed_tokens``, which is (c.vocab_size, D) and frozen); ``extra_slots``: cache entries
        per row beyond prefix + block_size. Weights are default-initialised
        (``init_weights`` or ``load_lantern_drafter`` set them)."""
        super().__init__()
        self.config = c
        self.vocab_size = c.vocab_size if head_index is None else int(head_index.numel())
        self.extra_slots = extra_slots
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=c.bias)
        self.layers = nn.ModuleList(_Layer(c, i) for i in range(c.num_hidden_layers))
        self._head = (head,)
        self._head_index = head_index
        self.cache: KVCache | None = None
        self._zero_rows = -1
        self.rope = None

    @classmethod
    def from_target(cls, target, *, num_layers: int = 1, intermediate_size: int | None = None, seed: int = 0,
                    std: float = 0.02) -> "EagleDrafter":
        """A fresh drafter sized like a LlamaGen target (its embeddings copied, its head reused)."""
        tc = target.config
        c = EagleConfig(hidden_size=tc.dim, intermediate_size=intermediate_size or tc.ffn_hidden,
                        num_attention_heads=tc.n_head, vocab_size=tc.vocab_size, block_size=tc.block_size,
                        num_hidden_layers=num_layers, rope_base=tc.rope_base)
        d = cls(c, target.output).to(target.device)
        return d.init_weights(target.tok_embeddings.weight, seed, std).to(target.dtype)

    @torch.no_grad()
    def init_weights(self, embeddings: torch.Tensor, seed: int, std: float) -> "EagleDrafter":
        """Fresh weights: norms 1, fc bias 0, every other trained weight N(0, std^2) drawn in parameter
        order from a CPU generator seeded with ``seed`` (the same draws on every device), and the token
        embeddings (V, hidden) copied from the target's."""
        g = torch.Generator(device="cpu").manual_seed(seed)
        for name, p in self.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name == "fc.bias":
                p.zero_()
            elif name != "embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g) * std)
        self.embed_tokens.weight.copy_(embeddings.to(self.embed_tokens.weight))
        return self

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits over the image vocabulary from drafter features (target head, frozen)."""
        w, b = scoped(self, self._head_weights)
        if torch.is_grad_enabled():         # training the drafter: no gradient into the target's head
            w, b = w.detach(), (None if b is None else b.detach())
        out = linear(hidden if hidden.dtype == w.dtype else hidden.to(w.dtype), w, b)
        return out if out.dtype == torch.float32 else out.float()

    def _head_weights(self) -> tuple:
        lin = self._head[0]
        w = lin.weight if self._head_index is None else lin.weight[self._head_index]
        b = lin.bias if (lin.bias is None or self._head_index is None) else lin.bias[self._head_index]
        return w, b

    def _rope(self, zero_rows: int) -> torch.Tensor:
        if (self.rope is None or self._zero_rows != zero_rows or self.rope.device != self.device
                or stale_inference(self.rope)):
            c = self.config
            self.rope = complex_rope(rope_table_2d(math.isqrt(c.block_size), c.head_dim, c.rope_base, zero_rows)).to(self.device)
            self._zero_rows = zero_rows
        return self.rope

    def cache_bytes(self, rows: int, prefix_len: int) -> int:
        """Memory of the KV cache ``start(prefix_len, rows)`` allocates (``prefix_len``: the target's, its
        ``prefix_len``)."""
        c = self.config
        n = prefix_len - 1 + c.block_size + self.extra_slots
        return 2 * c.num_hidden_layers * rows * c.kv_heads * n * c.head_dim * self.fc.weight.element_size()

    # ---------------------------------------------------------------- inference (protocol)
    def start(self, prefix_len: int, batch: int, *, extra: int = 0) -> None:
        """Reset for new images whose target prefix has ``prefix_len`` positions; ``batch`` rows (one per
        image, two with CFG); ``extra`` cache entries per row beyond prefix + block_size + ``extra_slots``
        (teacher-forced scoring, ``real.decode.score``)."""
        if prefix_len < 1:
            raise ValueError(f"prefix_len must be >= 1, got {prefix_len}")
        if isinstance(extra, bool) or not isinstance(extra, (int, np.integer)) or extra < 0:
            raise ValueError(f"extra must be an int >= 0, got {extra!r}")
        c = self.config
        n = prefix_len - 1 + c.block_size + self.extra_slots + int(extra)
        if self.cache is None or not self.cache.fits(c.num_hidden_layers, batch, n, self.dtype, self.device):
            self.cache = KVCache(c.num_hidden_layers, batch, c.kv_heads, n, c.head_dim, dtype=self.dtype,
                                 device=self.device)
        self.cache.reset()
        self._rope(prefix_len - 1)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, *, features: torch.Tensor, position_ids=None,
                attn_mask: torch.Tensor | None = None, return_hidden: bool = True) -> ModelOutput:
        """Pairs (tokens (R, S), features (R, S, D)) appended on every row's cache -> logits (R, S, V), own
        features (R, S, D). ``position_ids`` (S,) or (R, S) (default: each row's length + arange(S)) and
        ``attn_mask`` as in ``real.protocol`` (drafter positions)."""
        if self.rope is None or self.cache is None:
            raise ValueError("EagleDrafter.forward before start(prefix_len, batch)")
        B, S = tokens.shape
        if B != self.cache.rows:
            raise ValueError(f"tokens must have {self.cache.rows} rows (as started), got {B}")
        if tuple(features.shape[:2]) != (B, S) or features.shape[-1] != self.config.hidden_size:
            raise ValueError(f"features must be ({B}, {S}, {self.config.hidden_size}), got {tuple(features.shape)}")
        if position_ids is None:
            position_ids = self.cache.lens[:, None] + np.arange(S)
        if isinstance(position_ids, np.ndarray) and int(position_ids.max()) >= self.rope.shape[0]:   # host: no sync
            raise ValueError(f"drafter position {int(position_ids.max())} beyond its RoPE table ({self.rope.shape[0]})")
        pos = torch.as_tensor(position_ids, dtype=torch.long, device=self.rope.device)
        mask = self.cache.begin(S, attn_mask)
        h = self._trunk(tokens, features, self.rope[pos], mask, self.cache)
        self.cache.commit()
        return ModelOutput(self.head(h), h)

    def _trunk(self, tokens, features, rot, mask, cache=None):
        if self._head_index is not None:
            tokens = self._head_index.to(tokens.device)[tokens]
        w = self.fc.weight
        e = F.embedding(tokens, self.embed_tokens.weight).to(w.dtype)
        h = linear(torch.cat([e, features.to(w.dtype)], dim=-1), w, self.fc.bias)
        for i, layer in enumerate(self.layers):
            h = layer.forward(h, rot, mask, cache, i)     # (no module hooks on the layers: skip __call__'s cost)
        return h

    # ---------------------------------------------------------------- training
    def train_forward(self, tokens: torch.Tensor, features: torch.Tensor, prefix_len: int) -> torch.Tensor:
        """Whole pair sequences without cache (causal): tokens (B, N), features (B, N, D) -> (B, N, D)."""
        N = tokens.shape[1]
        rope = self._rope(prefix_len - 1)
        if N > rope.shape[0]:
            raise ValueError(f"{N} pairs exceed the drafter's RoPE table ({rope.shape[0]})")
        return self._trunk(tokens, features, rope[:N], None)


# --------------------------------------------------------------------------- checkpoints

def load_lantern_drafter(path: str, head: nn.Linear, *, head_index: torch.Tensor | None = None,
                         config: EagleConfig | dict | None = None, device="cpu", dtype=torch.float32) -> EagleDrafter:
    """A drafter from the LANTERN release layout: a directory with ``config.json`` and
    ``model.safetensors`` or ``pytorch_model.bin`` (or a weights file plus ``config``)."""
    if os.path.isdir(path):
        cfg_path = os.path.join(path, "config.json")
        if config is None:
            if not os.path.exists(cfg_path):
                raise ValueError(f"{path}: no config.json (pass config=...)")
            with open(cfg_path) as f:
                config = json.load(f)
        for name in ("model.safetensors", "pytorch_model.bin"):
            if os.path.exists(os.path.join(path, name)):
                path = os.path.join(path, name)
                break
        else:
            raise ValueError(f"{path}: neither model.safetensors nor pytorch_model.bin found")
    if config is None:
        raise ValueError("load_lantern_drafter: a weights file needs config=EagleConfig(...) or a config dict")
    c = EagleConfig.from_lantern_json(config) if isinstance(config, dict) else config
    d = EagleDrafter(c, head, head_index)
    load_checked(d, extract_state_dict(read_checkpoint(path)), ignore=("rotary_emb",), what="LANTERN drafter checkpoint")
    return d.to(device=device, dtype=dtype).eval()


def save_lantern_drafter(drafter: EagleDrafter, directory: str, *, input_type: str | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` in the LANTERN release layout."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    c = drafter.config
    d = asdict(c)
    d.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu")
    if input_type is not None:
        d["input_type"] = input_type
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(d, f, indent=2)
    save_file({k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()},
              os.path.join(directory, "model.safetensors"))


# --------------------------------------------------------------------------- training on recorded features

def eagle_pairs(tokens: torch.Tensor, features: torch.Tensor, prefix_len: int):
    """Training pairs from recorded target runs.

    tokens (N, T) image tokens; features (N, P + T - 1, D) the target's last hidden states at its
    input positions [prefix; x_0 .. x_{T-2}] (``record_features``). Pair p = (token at target position
    p + 1 (id 0 inside the prefix), h_p); its regression target is h_{p+1}, scored for the pairs that
    predict image tokens x_1 .. x_{T-1} (p = P - 1 .. P + T - 3).
    Returns ids (N, M), inputs (N, M, D), targets (N, M, D), mask (N, M) with M = P + T - 1."""
    N, T = tokens.shape
    P = prefix_len
    M = P + T - 1
    if features.ndim != 3 or tuple(features.shape[:2]) != (N, M):
        raise ValueError(f"features must be (N={N}, P+T-1={M}, D), got {tuple(features.shape)}")
    ids = torch.cat([torch.zeros(N, P - 1, dtype=torch.long, device=tokens.device), tokens.long()], dim=1)
    targets = torch.cat([features[:, 1:], torch.zeros_like(features[:, :1])], dim=1)
    mask = torch.zeros(N, M, dtype=torch.bool, device=features.device)
    mask[:, P - 1:M - 1] = True
    return ids, features, targets, mask


@torch.no_grad()
def record_features(target, cond, tokens: torch.Tensor, *, cfg: bool = False) -> torch.Tensor:
    """Target hidden states (B, P + T - 1, D) along a whole image ``tokens`` (T,) (B = 2 with CFG),
    through the protocol's ``prefill(cond, tokens, return_hidden=True)``."""
    B = 2 if cfg else 1
    t = torch.as_tensor(tokens).reshape(1, -1).expand(B, -1)
    return target.prefill(cond, t[:, :-1], cfg=cfg, return_hidden=True).hidden


def eagle_loss(drafter, ids, x, y, mask, p_w: float, v_w: float, prefix_len: int):
    """EAGLE-1's loss (``real.drafter.train``'s module docstring; ``train_eagle``) on one batch: ids (B, M), noisy inputs x (B, M, D), targets y (B, M, D),
    mask (B, M) bool -> (loss, {"vloss", "ploss", "top1"} detached)."""
    m = mask.to(torch.float32)[..., None]
    n = m.sum()
    f = drafter.train_forward(ids, x, prefix_len)
    vloss = (F.smooth_l1_loss(f.float(), y.float(), reduction="none").mean(-1, keepdim=True) * m).sum() / n
    with torch.no_grad():
        tp = torch.softmax(drafter.head(y), -1)
    logq = torch.log_softmax(drafter.head(f), -1)
    ploss = -((tp * logq).sum(-1, keepdim=True) * m).sum() / n
    with torch.no_grad():
        top1 = ((logq.argmax(-1) == tp.argmax(-1)).float() * m[..., 0]).sum() / n
    return v_w * vloss + p_w * ploss, {"vloss": vloss.detach(), "ploss": ploss.detach(), "top1": top1}


def train_eagle(drafter: EagleDrafter, tokens: torch.Tensor, features: torch.Tensor, prefix_len: int, *,
                steps: int = 200, batch_size: int = 16, lr: float = 1e-3, p_w: float = 0.1, noise: float = 0.2,
                grad_clip: float = 0.5, seed: int = 0, progress: bool = False) -> list[dict]:
    """Fit the drafter to recorded target features in memory (EAGLE-1 objective, as in LANTERN's trainer):
    SmoothL1(f_p, h_{p+1}) + p_w * CE(softmax(head(h_{p+1})), head(f_p)) on the scored pairs, inputs
    perturbed by uniform noise of width ``noise``; AdamW (0.9, 0.95), gradient clipping. The loss is
    ``eagle_loss``, the one ``coolsd train-drafter`` trains with (its loop adds the on-disk
    cache, ranks and resumable state).

    tokens (N, T), features (N, P + T - 1, D) as in ``eagle_pairs``. Returns per-step
    {"loss", "vloss", "ploss", "top1"} (top1: drafter argmax == target argmax on scored pairs)."""
    from tqdm import tqdm

    ids, inp, tgt, mask = eagle_pairs(tokens.to(drafter.device), features.to(drafter.device), prefix_len)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95))
    g = torch.Generator(device="cpu").manual_seed(seed)
    N = ids.shape[0]
    log = []
    drafter.train()
    for _ in tqdm(range(steps), disable=not progress, desc="train eagle"):
        b = torch.randint(0, N, (min(batch_size, N),), generator=g).to(drafter.device)
        x = inp[b].to(drafter.dtype)
        if noise > 0:
            x = x + (torch.rand(x.shape, generator=g).to(x) - 0.5) * noise
        loss, st = eagle_loss(drafter, ids[b], x, tgt[b], mask[b], p_w, 1.0, prefix_len)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        log.append({"loss": float(loss.detach()), "vloss": float(st["vloss"]), "ploss": float(st["ploss"]),
                    "top1": float(st["top1"])})
    drafter.eval()
    return log
