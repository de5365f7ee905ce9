"""A gpt-fast-style Llama (static KV cache, no framework overhead) loaded from a transformers
``LlamaForCausalLM``: the same weights and outputs as ``real.adapters.hf.HFCausalLM`` on that model, at a
fraction of the per-call cost, which dominates small drafts.

Architecture as in transformers' Llama (facts checked on 5.24): RMSNorm (float32 statistics), separate
q/k/v/o projections (optional biases), grouped-query attention, 1-D RoPE on half-split pairs
(``rotate_half``) with ``rope_theta``, SwiGLU MLP (gate, up, down), final norm, LM head. Only the
default RoPE type is supported (scaled variants raise NotImplementedError).

The forward takes LlamaGen's CPU fast paths (``real.nn.layers``): q/k/v and gate/up each one fused weight
(one ``linear``, oneDNN-packed inside ``inference_weights`` when large enough), q and k rotated by one complex
product (``rope_qkv``; the q/k rows are reordered from half-split to interleaved pairs at load, which leaves
the attention scores unchanged), ``attend`` over the one static per-row cache of the models that own theirs
(``real.nn.kvcache.KVCache``: per-row lengths, rollback and keep), RoPE rotations looked up in a table; layers are
called without the module-call machinery. Logits agree with transformers' up to float rounding
(tests/test_real_hf.py: within 1e-4).

Batched (``real.protocol.BatchedTarget``): ``prefill`` takes a list of ``Prompt``s, one image each; their rows (and
with CFG the unconditional rows after them) are left-padded to the longest prompt, the padded entries hidden
(``KVCache.hide_prefix``) and every RoPE position counted from the row's first real token (cache slot - padding),
as transformers does with an attention mask.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import numpy as np

from real.nn.devpath import host_path, to_device
from real.nn.kvcache import KVCache, PromptRows
from real.nn.layers import RMSNorm, gqa_heads, linear, rms_norm, rope_qkv
from real.protocol import ModelOutput, Placed, Prompt, as_conds, left_pad_ids

__all__ = ["FastLlama", "LlamaStack", "layer_weights"]


def _interleave_rows(w: torch.Tensor, heads: int, hd: int) -> torch.Tensor:
    """q or k projection rows (heads hd, ...) reordered within each head from transformers' half-split RoPE
    pairs (j, j + hd/2) to interleaved pairs (2j, 2j + 1), so that ``real.nn.layers.apply_rope`` (one complex
    product) rotates them. Attention scores are unchanged: q and k get the same permutation, and q . k
    sums over it (v and the cache layout of v are untouched)."""
    perm = torch.arange(hd).view(2, hd // 2).t().reshape(-1)          # [0, hd/2, 1, hd/2 + 1, ...]
    return w.view(heads, hd, *w.shape[1:])[:, perm].reshape(w.shape)


class _Layer(nn.Module):
    """One decoder layer through LlamaGen's CPU fast paths (``real.nn.layers``): ``qkv`` holds the q, k, v
    weights stacked ((nh + 2 nkv) hd, hidden; q and k rows interleaved, ``_interleave_rows``), one ``linear``;
    ``rope_qkv`` rotates q and k in one complex product; ``gqa_heads`` / ``attend`` attend over the static
    cache, written in place; ``gate_up`` (2 inter, hidden) is the SwiGLU gate and up projections in one
    ``linear``. ``linear`` packs large weights for oneDNN inside ``inference_weights``. ``forward`` is called
    directly by ``FastLlama._run`` (no module-call machinery)."""

    def __init__(self, hidden, inter, nh, nkv, hd, eps, attn_bias, mlp_bias, qk_norm: bool = False):
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.qkv = nn.Linear(hidden, (nh + 2 * nkv) * hd, bias=attn_bias)
        self.o = nn.Linear(nh * hd, hidden, bias=attn_bias)
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=mlp_bias)
        self.down = nn.Linear(inter, hidden, bias=mlp_bias)
        self.ln1, self.ln2 = RMSNorm(hidden, eps), RMSNorm(hidden, eps)
        # Chameleon's QK-norm: a LayerNorm over each head's hd entries (eps 1e-5) with a weight and bias per
        # (head, entry), rows interleaved like q and k (``_interleave_rows``; the statistics do not see the order)
        self.qn = nn.LayerNorm((nh, hd)) if qk_norm else None
        self.kn = nn.LayerNorm((nkv, hd)) if qk_norm else None
        self.kc = self.vc = None

    def forward(self, x, rot, mask, cache: KVCache, i: int):
        """x (R, S, hidden), rot (R, S, hd/2) complex (``FastLlama._rope``), mask (R or 1, 1, S, K) bool or None,
        ``cache`` the model's ``KVCache`` (this is layer i) -> (R, S, hidden); the block's keys and values are written
        into the cache at each row's slots."""
        qkv = linear(rms_norm(x, self.ln1.weight, self.ln1.eps), self.qkv.weight, self.qkv.bias)
        q, k, v = rope_qkv(qkv if self.qn is None else self._qk_norm(qkv), rot, self.nh, self.nkv)
        k, v = cache.update(i, k, v)
        x = x + linear(gqa_heads(q, k, v, mask), self.o.weight, self.o.bias)
        g, u = linear(rms_norm(x, self.ln2.weight, self.ln2.eps), self.gate_up.weight, self.gate_up.bias).chunk(2, -1)
        return x + linear(F.silu(g) * u, self.down.weight, self.down.bias)             # SwiGLU (optional biases)

    def _qk_norm(self, qkv):
        """qkv (R, S, (nh + 2 nkv) hd) with q and k normalised per head (Chameleon's ``q_norm`` / ``k_norm``)."""
        R, S, _ = qkv.shape
        q, k, v = qkv.split_with_sizes([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)

        def norm(x, ln, heads):
            y = F.layer_norm(x.view(R, S, heads, self.hd), (self.hd,), None, None, 1e-5)
            return (y * ln.weight + ln.bias).reshape(R, S, heads * self.hd)
        return torch.cat([norm(q, self.qn, self.nh), norm(k, self.kn, self.nkv), v], -1)


def rope_parameters(config, who: str) -> dict:
    """The RoPE parameters of a Llama-shaped transformers config (``rope_parameters``, or the 4.x ``rope_theta`` /
    ``rope_scaling``), refusing what the ports do not implement (a scaled RoPE type, an MLP other than SiLU) with
    NotImplementedError naming ``who``."""
    c = config
    rp = getattr(c, "rope_parameters", None) or {"rope_theta": getattr(c, "rope_theta", 10000.0),
                                                 "rope_type": (getattr(c, "rope_scaling", None) or {}).get("rope_type", "default")}
    if rp.get("rope_type", "default") != "default":
        raise NotImplementedError(f"{who} supports the default RoPE only, not {rp.get('rope_type')!r}")
    if getattr(c, "hidden_act", "silu") != "silu":
        raise NotImplementedError(f"{who} supports SiLU MLPs only, not {c.hidden_act!r}")
    return rp


def rope_table(inv_freq: torch.Tensor, n: int) -> torch.Tensor:
    """(n, hd/2) complex RoPE rotations of positions 0..n-1 on ``inv_freq``'s device, with transformers' arithmetic
    (angle = position x inv_freq in float32, then cos + i sin): FastLlama's and LlamaStack's one table."""
    ang = torch.arange(n, device=inv_freq.device).float()[:, None] * inv_freq
    return torch.polar(torch.ones_like(ang), ang)


_HF_LAYER = {"qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], "o": ["self_attn.o_proj"],
             "gate_up": ["mlp.gate_proj", "mlp.up_proj"], "down": ["mlp.down_proj"], "ln1": ["input_layernorm"],
             "ln2": ["post_attention_layernorm"], "qn": ["self_attn.q_norm"], "kn": ["self_attn.k_norm"]}


def layer_weights(module: nn.Module, src: dict, prefix: str) -> dict:
    """The ``layers.*`` entries of ``module``'s state dict (a stack of ``_Layer``s) from a transformers Llama-shaped
    checkpoint ``src`` whose decoder layers sit under ``prefix`` (``"model.layers."``): q/k/v and gate/up stacked
    into one weight each, q and k rows (and Chameleon's QK-norm entries) interleaved for the complex RoPE product.
    ValueError naming the missing keys."""
    out, missing = {}, []
    for k in module.state_dict():
        if not k.startswith("layers."):
            continue
        _, i, mod, par = k.split(".")
        lay = module.layers[int(i)]
        keys = [f"{prefix}{i}.{n}.{par}" for n in _HF_LAYER[mod]]
        missing += [x for x in keys if x not in src]
        if missing:
            continue
        ws = [src[x] for x in keys]
        if mod == "qkv":
            ws[0] = _interleave_rows(ws[0], lay.nh, lay.hd)
            ws[1] = _interleave_rows(ws[1], lay.nkv, lay.hd)
        elif mod in ("qn", "kn"):
            h = lay.nh if mod == "qn" else lay.nkv
            ws[0] = _interleave_rows(ws[0].reshape(-1), h, lay.hd).view(h, lay.hd)
        out[k] = torch.cat(ws)
    if missing:
        raise ValueError(f"not a Llama-shaped checkpoint: missing {missing[:8]}")
    return out


class FastLlama(Placed, PromptRows, nn.Module):
    """``real.protocol.BatchedTarget`` over a Llama checkpoint (module docstring). Conditions are ``Prompt``s;
    ``image_token_ids`` as in ``real.adapters.hf.HFCausalLM``. The cache holds ``max_len`` entries per row."""
    _placed_by = "embed.weight"
    needs_features = False

    def __init__(self, config, image_token_ids: torch.Tensor | None = None, max_len: int = 4096):
        """``config``: a transformers ``LlamaConfig``
        (default RoPE and SiLU only: others raise NotImplementedError); ``image_token_ids`` (V,) int64: LM ids
        of image tokens 0..V-1, or None (V = vocab_size); ``max_len``: cache entries per row (the per-layer
        caches (B, kv heads, max_len, head_dim) are allocated by ``prefill``). Weights are default-initialised:
        ``from_hf`` copies a checkpoint's."""
        super().__init__()
        c = config
        rp = rope_parameters(c, "FastLlama")
        self.hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.nkv = c.num_key_value_heads or c.num_attention_heads
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(
            _Layer(c.hidden_size, c.intermediate_size, c.num_attention_heads, self.nkv, self.hd, c.rms_norm_eps,
                   getattr(c, "attention_bias", False), getattr(c, "mlp_bias", False)) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        # float32 and not a buffer, so a bf16 cast leaves it alone (transformers computes RoPE in float32)
        self.inv_freq = 1.0 / (rp["rope_theta"] ** (torch.arange(0, self.hd, 2).float() / self.hd))
        self.max_len = max_len
        self.image_token_ids = None if image_token_ids is None else torch.as_tensor(image_token_ids).long().reshape(-1)
        self.vocab_size = c.vocab_size if image_token_ids is None else int(self.image_token_ids.numel())
        self.n_layers = c.num_hidden_layers
        self.cache: KVCache | None = None
        self._pad = np.zeros(1, np.int64)            # (R,) padded entries at the start of each row (RoPE offsets)
        self._pad_t = None                           # (self._pad, its copy on the device): one copy per prefill
        self._P = 0                                  # prompt entries per row (padding included)
        self._rope_tab: torch.Tensor | None = None   # (max_len, hd/2) complex rotations (``_rope``)

    @classmethod
    def from_hf(cls, model, image_token_ids: torch.Tensor | None = None, max_len: int = 4096) -> "FastLlama":
        """Copy the weights of a transformers ``LlamaForCausalLM`` (same device and dtype); ``image_token_ids``
        (V,) int64 and ``max_len`` as in the constructor."""
        m = cls(model.config, image_token_ids, max_len)
        src = model.state_dict()
        names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
                 "lm_head.weight": "lm_head.weight" if "lm_head.weight" in src else "model.embed_tokens.weight"}
        missing = [v for v in names.values() if v not in src]
        if missing:
            raise ValueError(f"not a Llama checkpoint: missing {missing[:8]}")
        sd = {k: src[v] for k, v in names.items()}
        sd.update(layer_weights(m, src, "model.layers."))
        m.load_state_dict(sd, strict=True)
        p = next(model.parameters())
        m = m.to(device=p.device, dtype=p.dtype).eval()
        rot = getattr(getattr(model.model, "rotary_emb", None), "inv_freq", None)
        if rot is not None:                                   # the model's own frequencies, exactly
            m.inv_freq = rot.detach().float().to(p.device)
        if m.image_token_ids is not None:
            m.image_token_ids = m.image_token_ids.to(p.device)
        return m

    def cache_bytes(self, rows: int) -> int:
        """Memory of the KV cache ``prefill`` allocates for ``rows`` rows."""
        return 2 * self.n_layers * rows * self.nkv * self.max_len * self.hd * self.embed.weight.element_size()

    def head(self, hidden):
        """float32 logits (..., V) from last hidden states (..., D)
        (the ``image_token_ids`` columns of the LM head when given)."""
        logits = linear(hidden, self.lm_head.weight).float()
        return logits if self.image_token_ids is None else logits[..., self.image_token_ids]

    def _map(self, tokens):
        tokens = torch.as_tensor(tokens, device=self.embed.weight.device, dtype=torch.long)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be (B, S), got shape {tuple(tokens.shape)}")
        return tokens if self.image_token_ids is None else self.image_token_ids[tokens]

    def _rope(self, pos):
        """RoPE rotations (B, S, hd/2) complex at positions pos (B, S) int64, looked up in a table of positions
        [0, max_len) built once per device with transformers' arithmetic (angle = position x inv_freq in float32,
        then cos + i sin)."""
        dev = self.embed.weight.device
        if self._rope_tab is None or self._rope_tab.device != dev:
            self.inv_freq = self.inv_freq.to(dev)
            self._rope_tab = rope_table(self.inv_freq, self.max_len)
        return self._rope_tab[pos]

    def _run(self, ids, slots, attn_mask, return_hidden, logits_from):
        """ids (R, S) model ids at cache ``slots`` (R, S) (numpy or torch) under ``attn_mask`` (S, K) / (R, S, K) or
        None (causal) -> ``ModelOutput``; RoPE positions are the slots minus each row's padding."""
        S = ids.shape[1]
        if isinstance(slots, np.ndarray):    # host slots: positions and their check on the host, no sync
            pos = np.maximum(slots - self._pad[:, None], 0)
            hi = int(pos.max()) if pos.size else 0
            if hi >= self.max_len:
                raise ValueError(f"FastLlama cache full: position {hi} >= max_len {self.max_len}; raise max_len")
            pos = to_device(pos, ids.device, torch.long)
        else:                                # device slots (the engine's device path): checked without a read-back
            if self._pad_t is None or self._pad_t[0] is not self._pad:
                self._pad_t = (self._pad, to_device(self._pad, ids.device))
            pos = (slots.long() - self._pad_t[1][:, None]).clamp_(min=0)
            torch._assert_async(pos.max() < self.max_len, f"FastLlama cache full: a position >= max_len {self.max_len}")
        rot = self._rope(pos)
        mask = self.cache.begin(S, attn_mask)
        h = F.embedding(ids, self.embed.weight)
        for i, layer in enumerate(self.layers):   # a loop over decoder layers
            h = layer.forward(h, rot, mask, self.cache, i)
        self.cache.commit()
        h = rms_norm(h, self.norm.weight, self.norm.eps)
        logits = self.head(h[:, logits_from:])
        return ModelOutput(logits, h if return_hidden else None)

    @torch.no_grad()
    def prefill(self, cond, tokens=None, *, cfg=False, return_hidden=False) -> ModelOutput:
        """Reset the cache and run the prompts: ``cond`` a ``Prompt`` or a list of B (one image each) -> prompt rows
        (R, P), R = B, or 2B with ``cfg`` ([conditional rows; unconditional rows], ``Prompt.uncond_ids``), left-padded
        to the longest, then the optional image ``tokens`` (R, S). Returns ``ModelOutput``: logits (R, 1 + S, V)
        float32, and with ``return_hidden`` the post-norm hidden states (R, P + S, D)."""
        conds = [c if isinstance(c, Prompt) else Prompt(c) for c in as_conds(cond)]
        rows = [c.ids for c in conds]
        if cfg:
            if any(c.uncond_ids is None for c in conds):
                raise ValueError("CFG needs Prompt(ids, uncond_ids=...) for the unconditional row")
            rows += [c.uncond_ids for c in conds]
        ids, pad = left_pad_ids(rows, self.device)     # the padding widths from the rows' lengths, on the host
        R, P = ids.shape
        if tokens is not None and tokens.numel():
            t = self._map(tokens)
            if t.shape[0] != R:
                raise ValueError(f"tokens must have batch {R}, got {t.shape[0]}")
            ids = torch.cat([ids, t], 1)
        if self.cache is None or not self.cache.fits(self.n_layers, R, self.max_len, self.dtype, self.device):
            self.cache = KVCache(self.n_layers, R, self.nkv, self.max_len, self.hd, dtype=self.dtype, device=self.device)
        self.cache.reset()
        self._pad, self._P = pad, P
        self.cache.hide_prefix(np.arange(P)[None, :] >= pad[:, None])
        return self._run(ids, np.tile(np.arange(ids.shape[1]), (R, 1)), None, return_hidden, P - 1)

    @torch.no_grad()
    def forward(self, tokens, *, position_ids=None, attn_mask=None, return_hidden=False) -> ModelOutput:
        """Append image tokens (R, S) -> ``ModelOutput`` logits (R, S, V) float32 (+ post-norm hidden states (R, S, D)
        with ``return_hidden``). ``position_ids`` (S,) or (R, S) cache positions (default: each row's length +
        arange(S)); ``attn_mask`` (S, K) or (R, S, K) bool as ``real.nn.kvcache.KVCache.begin``."""
        cache = self._need_cache()
        t = self._map(tokens)
        R, S = t.shape
        if R != cache.rows:
            raise ValueError(f"tokens must be ({cache.rows}, S), got shape {tuple(t.shape)}")
        if position_ids is None:
            slots = cache.lens[:, None] + np.arange(S)
        elif isinstance(position_ids, torch.Tensor) and not host_path(position_ids.device):   # the device path's
            slots = position_ids.to(device=t.device, dtype=torch.long)
            slots = slots.expand(R, S) if slots.ndim == 1 else slots
            if tuple(slots.shape) != (R, S):
                raise ValueError(f"position_ids must be ({S},) or ({R}, {S}), got shape {tuple(position_ids.shape)}")
            torch._assert_async(slots.min() >= 0, "position_ids must be non-negative")
        else:
            slots = position_ids if isinstance(position_ids, np.ndarray) else \
                torch.as_tensor(position_ids, dtype=torch.long).cpu().numpy()
            slots = np.tile(slots, (R, 1)) if slots.ndim == 1 else slots
            if slots.shape != (R, S) or slots.min() < 0 or (slots >= cache.lens[:, None] + S).any():
                raise ValueError(f"position_ids must be ({S},) or ({R}, {S}) positions within each row's cache "
                                 f"length + S, got {slots.tolist()}")
        return self._run(t, slots, attn_mask, return_hidden, 0)


class LlamaStack(Placed, nn.Module):
    """The decoder layers and final norm of a Llama-shaped transformers LM on our ``KVCache`` (per-row lengths,
    rollback and keep): Janus-Pro's language model, Emu3's text model, Chameleon / Lumina-mGPT's (QK-norm), for the
    batched multimodal adapter (``real.adapters.batched_imagelm``), which owns the embeddings, the image head, the
    cache bookkeeping and the masks. The layers are FastLlama's (``_Layer``: fused q/k/v and gate/up, complex RoPE).

    Interface (shared with ``real.models.glm_image.GlmImageStack``): ``n_layers``, ``n_kv``, ``head_dim``,
    ``rope_axes`` (1: one position per entry), ``run(h, pos, mask, cache)``."""
    _placed_by = "norm.weight"
    rope_axes = 1

    def __init__(self, config, qk_norm: bool = False):
        """``config``: the decoder's transformers config (default RoPE, SiLU; others raise NotImplementedError, as do
        Chameleon's ``swin_norm`` layers); ``qk_norm``: Chameleon's per-head LayerNorm of q and k."""
        super().__init__()
        c = config
        rp = rope_parameters(c, "LlamaStack")
        if getattr(c, "swin_norm", False):
            raise NotImplementedError("Chameleon's swin_norm layers (norm after attention) are not ported")
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.n_kv = c.num_key_value_heads or c.num_attention_heads
        self.n_layers = c.num_hidden_layers
        self.layers = nn.ModuleList(
            _Layer(c.hidden_size, c.intermediate_size, c.num_attention_heads, self.n_kv, self.head_dim, c.rms_norm_eps,
                   getattr(c, "attention_bias", False), getattr(c, "mlp_bias", False), qk_norm)
            for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.inv_freq = 1.0 / (rp["rope_theta"] ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self._rope_tab: torch.Tensor | None = None

    @classmethod
    def from_decoder(cls, decoder) -> "LlamaStack":
        """Copy the layers and final norm of a transformers decoder (``LlamaModel``, ``Emu3TextModel``,
        ``ChameleonModel``: ``layers``, ``norm``, ``rotary_emb``), same device and dtype; QK-norm when its attention
        has ``q_norm``. The RoPE frequencies are the decoder's own (``rotary_emb.inv_freq``)."""
        qk = hasattr(decoder.layers[0].self_attn, "q_norm")
        m = cls(decoder.config, qk)
        src = decoder.state_dict()
        if "norm.weight" not in src:
            raise ValueError("not a Llama-shaped decoder: no final norm.weight")
        m.load_state_dict({"norm.weight": src["norm.weight"], **layer_weights(m, src, "layers.")}, strict=True)
        p = decoder.norm.weight
        m = m.to(device=p.device, dtype=p.dtype).eval().requires_grad_(False)
        rot = getattr(decoder, "rotary_emb", None)
        if rot is not None:
            if float(getattr(rot, "attention_scaling", 1.0)) != 1.0:
                raise NotImplementedError("RoPE with attention scaling is not ported")
            m.inv_freq = rot.inv_freq.detach().float().to(p.device)
        return m

    def rope(self, pos) -> torch.Tensor:
        """RoPE rotations (R, S, hd/2) complex at positions pos (R, S) int64 (or (R, S, 1); numpy or torch), from a
        table grown to the largest position asked (``rope_table``). Host positions size the table without a device
        read-back (the batched adapter's positions are host arrays)."""
        pos = pos[..., 0] if pos.ndim == 3 else pos
        dev = self.norm.weight.device
        n_pos = pos.size if isinstance(pos, np.ndarray) else pos.numel()
        need = int(pos.max()) + 1 if n_pos else 1
        if self._rope_tab is None or self._rope_tab.device != dev or self._rope_tab.shape[0] < need:
            self.inv_freq = self.inv_freq.to(dev)
            self._rope_tab = rope_table(self.inv_freq, max(need, 2 * (0 if self._rope_tab is None else
                                                                       self._rope_tab.shape[0]), 1024))
        return self._rope_tab[to_device(pos, dev) if isinstance(pos, np.ndarray) else pos.to(dev)]   # (no sync)

    def run(self, h: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, cache: KVCache) -> torch.Tensor:
        """Input embeddings h (R, S, D) at RoPE positions ``pos`` (R, S) or (R, S, 1) int64 under ``mask`` (R or 1, 1,
        S, K) bool or None (all visible), written into ``cache`` (``cache.reserve`` / ``begin`` done by the caller,
        ``commit`` after) -> post-norm hidden states (R, S, D)."""
        rot = self.rope(pos)
        for i, layer in enumerate(self.layers):   # a loop over decoder layers
            h = layer.forward(h, rot, mask, cache, i)
        return rms_norm(h, self.norm.weight, self.norm.eps)
