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
the attention scores unchanged), ``attend`` over a static cache written in place, RoPE rotations looked up
in a table; layers are called without the module-call machinery. Logits agree with transformers' up to
float rounding (tests/test_real_hf.py: within 1e-4).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from real.nn.layers import RMSNorm, gqa_heads, linear, rms_norm, rope_qkv, stale_inference
from real.protocol import ModelOutput, Placed, block_mask, prompt_rows

__all__ = ["FastLlama"]


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

    def __init__(self, hidden, inter, nh, nkv, hd, eps, attn_bias, mlp_bias):
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.qkv = nn.Linear(hidden, (nh + 2 * nkv) * hd, bias=attn_bias)
        self.o = nn.Linear(nh * hd, hidden, bias=attn_bias)
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=mlp_bias)
        self.down = nn.Linear(inter, hidden, bias=mlp_bias)
        self.ln1, self.ln2 = RMSNorm(hidden, eps), RMSNorm(hidden, eps)
        self.kc = self.vc = None

    def forward(self, x, rot, start, mask):
        """x (B, S, hidden), rot (B, S, hd/2) complex (``FastLlama._rope``), ``start`` the cache slot of the
        block, mask (B or 1, 1, S, start + S) bool or None -> (B, S, hidden); writes the block's keys and values
        into the static cache in place."""
        q, k, v = rope_qkv(linear(rms_norm(x, self.ln1.weight, self.ln1.eps), self.qkv.weight, self.qkv.bias),
                           rot, self.nh, self.nkv)
        S = x.shape[1]
        kc, vc = self.kc, self.vc
        kc[:, :, start:start + S] = k
        vc[:, :, start:start + S] = v
        x = x + linear(gqa_heads(q, kc[:, :, :start + S], vc[:, :, :start + S], mask), self.o.weight, self.o.bias)
        g, u = linear(rms_norm(x, self.ln2.weight, self.ln2.eps), self.gate_up.weight, self.gate_up.bias).chunk(2, -1)
        return x + linear(F.silu(g) * u, self.down.weight, self.down.bias)             # SwiGLU (optional biases)


class FastLlama(Placed, nn.Module):
    """``real.protocol.ARModel`` over a Llama checkpoint. Conditions are ``Prompt``s (a CFG pair is
    left-padded: padded prefix columns are masked, positions count from each row's first real token);
    ``image_token_ids`` as in ``real.adapters.hf.HFCausalLM``. The cache holds ``max_len`` entries."""
    _placed_by = "embed.weight"
    needs_features = False
    batched = False          # one cache length for all rows (real.protocol.OneRow)

    def __init__(self, config, image_token_ids: torch.Tensor | None = None, max_len: int = 4096):
        """``config``: a transformers ``LlamaConfig``
        (default RoPE and SiLU only: others raise NotImplementedError); ``image_token_ids`` (V,) int64: LM ids
        of image tokens 0..V-1, or None (V = vocab_size); ``max_len``: cache entries per row (the per-layer
        caches (B, kv heads, max_len, head_dim) are allocated by ``prefill``). Weights are default-initialised:
        ``from_hf`` copies a checkpoint's."""
        super().__init__()
        c = config
        rp = getattr(c, "rope_parameters", None) or {"rope_theta": getattr(c, "rope_theta", 10000.0),
                                                     "rope_type": (getattr(c, "rope_scaling", None) or {}).get("rope_type", "default")}
        if rp.get("rope_type", "default") != "default":
            raise NotImplementedError(f"FastLlama supports the default RoPE only, not {rp.get('rope_type')!r}")
        if getattr(c, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"FastLlama supports SiLU MLPs only, not {c.hidden_act!r}")
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
        self._len = 0
        self._block_start = 0
        self._next_pos: torch.Tensor | None = None
        self._block_pos: torch.Tensor | None = None
        self._pad: torch.Tensor | None = None      # (B, P) bool, True at padded prefix entries
        self._rope_tab: torch.Tensor | None = None   # (max_len, hd/2) complex rotations (``_rope``)

    @classmethod
    def from_hf(cls, model, image_token_ids: torch.Tensor | None = None, max_len: int = 4096) -> "FastLlama":
        """Copy the weights of a transformers ``LlamaForCausalLM`` (same device and dtype); ``image_token_ids``
        (V,) int64 and ``max_len`` as in the constructor."""
        m = cls(model.config, image_token_ids, max_len)
        src = model.state_dict()
        names = {"embed.weight": ["model.embed_tokens.weight"], "norm.weight": ["model.norm.weight"],
                 "lm_head.weight": ["lm_head.weight"]}
        if "lm_head.weight" not in src:                       # tied embeddings
            names["lm_head.weight"] = ["model.embed_tokens.weight"]
        hf = {"qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], "o": ["self_attn.o_proj"],
              "gate_up": ["mlp.gate_proj", "mlp.up_proj"], "down": ["mlp.down_proj"],
              "ln1": ["input_layernorm"], "ln2": ["post_attention_layernorm"]}
        for k in m.state_dict():
            if k.startswith("layers."):
                _, i, mod, p = k.split(".")
                names[k] = [f"model.layers.{i}.{n}.{p}" for n in hf[mod]]
        missing = [v for vs in names.values() for v in vs if v not in src]
        if missing:
            raise ValueError(f"not a Llama checkpoint: missing {missing[:8]}")
        c, hd = model.config, m.hd

        def fused(k, vs):      # q/k/v and gate/up: the checkpoint's weights stacked along the output dimension
            ws = [src[v] for v in vs]
            if k.endswith((".qkv.weight", ".qkv.bias")):      # q and k rows to interleaved RoPE pairs
                ws[0] = _interleave_rows(ws[0], c.num_attention_heads, hd)
                ws[1] = _interleave_rows(ws[1], m.nkv, hd)
            return torch.cat(ws)
        m.load_state_dict({k: fused(k, vs) for k, vs in names.items()}, strict=True)
        p = next(model.parameters())
        m = m.to(device=p.device, dtype=p.dtype).eval()
        rot = getattr(getattr(model.model, "rotary_emb", None), "inv_freq", None)
        if rot is not None:                                   # the model's own frequencies, exactly
            m.inv_freq = rot.detach().float().to(p.device)
        if m.image_token_ids is not None:
            m.image_token_ids = m.image_token_ids.to(p.device)
        return m

    @property
    def cache_len(self) -> int:
        """Entries in the cache (every row), prefix included."""
        return self._len

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
            ang = torch.arange(self.max_len, device=dev).float()[:, None] * self.inv_freq   # (max_len, hd/2)
            self._rope_tab = torch.polar(torch.ones_like(ang), ang)
        return self._rope_tab[pos]

    def _run(self, ids, pos, mask, return_hidden, logits_from):
        self._writable()
        S = ids.shape[1]
        start = self._len
        if start + S > self.max_len:
            raise ValueError(f"FastLlama cache full ({start} + {S} > {self.max_len}); raise max_len")
        rot = self._rope(pos)
        h = F.embedding(ids, self.embed.weight)
        for layer in self.layers:   # a loop over decoder layers
            h = layer.forward(h, rot, start, mask)
        h = rms_norm(h, self.norm.weight, self.norm.eps)
        self._block_start, self._len = start, start + S
        logits = self.head(h[:, logits_from:])
        return ModelOutput(logits, h if return_hidden else None)

    def _mask(self, S, attn_mask, B):
        dev = self.embed.weight.device
        m = block_mask(S, self._len, attn_mask, dev)
        if self._pad is None:
            return None if m is None else m[None, None]
        if m is None:
            m = torch.ones(S, self._len + S, dtype=torch.bool, device=dev)
        P = self._pad.shape[1]
        m = m[None].repeat(B, 1, 1)
        m[:, :, :P] &= ~self._pad[:, None, :]
        q = self._len + torch.arange(S, device=dev)
        own = q < P                                                   # padded prefix queries see themselves
        if bool(own.any()):
            m[:, own, q[own]] = True
        return m[:, None]

    @torch.no_grad()
    def prefill(self, cond, tokens=None, *, cfg=False, return_hidden=False) -> ModelOutput:
        """Reset the cache and run the prompt: cond a ``Prompt`` -> prefix ids (B, P), B = 2 with ``cfg``
        (left-padded pair) else 1, then the optional image ``tokens`` (B, S). Returns ``ModelOutput``: logits
        (B, 1 + S, V) float32, and with ``return_hidden`` the post-norm hidden states (B, P + S, D)."""
        ids, real, pos = prompt_rows(cond, cfg, self.device)
        B, P = ids.shape
        S = 0
        if tokens is not None and tokens.numel():
            t = self._map(tokens)
            if t.shape[0] != B:
                raise ValueError(f"tokens must have batch {B}, got {t.shape[0]}")
            S = t.shape[1]
            ids = torch.cat([ids, t], 1)
            pos = torch.cat([pos, pos[:, -1:] + 1 + torch.arange(S, device=self.device)], 1)
        for layer in self.layers:
            if (layer.kc is None or layer.kc.shape[0] != B or layer.kc.device != self.device
                    or layer.kc.dtype != self.dtype or stale_inference(layer.kc)):
                shape = (B, self.nkv, self.max_len, self.hd)
                layer.kc = torch.zeros(shape, dtype=self.dtype, device=self.device)
                layer.vc = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._len = 0
        self._pad = None if bool(real.all()) else ~real
        out = self._run(ids, pos, self._mask(P + S, None, B), return_hidden, P - 1)
        self._next_pos = pos[:, -1] + 1
        self._block_pos = self._next_pos.clone()
        return out

    @torch.no_grad()
    def forward(self, tokens, *, position_ids=None, attn_mask=None, return_hidden=False) -> ModelOutput:
        """Append image tokens (B, S) -> ``ModelOutput`` logits (B, S, V) float32 (+ post-norm hidden states
        (B, S, D) with ``return_hidden``). ``position_ids`` (S,) absolute positions (default cache_len +
        arange(S); each row's left padding is subtracted); ``attn_mask`` (S, K) bool as in ``real.protocol``."""
        if self._next_pos is None:
            raise ValueError("FastLlama.forward before prefill")
        t = self._map(tokens)
        B, S = t.shape
        dev = t.device
        if position_ids is None:
            off = torch.arange(S, device=dev)
        else:
            position_ids = torch.as_tensor(position_ids, device=dev, dtype=torch.long).reshape(-1)
            if position_ids.shape[0] != S or not bool(((position_ids >= 0) & (position_ids < self._len + S)).all()):
                raise ValueError(f"position_ids must be {S} positions in [0, cache_len + S = {self._len + S}), "
                                 f"got {position_ids.tolist()}")
            off = position_ids - self._len
        pos = self._next_pos[:, None] + off[None]
        self._block_pos = self._next_pos
        out = self._run(t, pos, self._mask(S, attn_mask, B), return_hidden, 0)
        self._next_pos = self._next_pos + S
        return out

    def rollback(self, n: int) -> None:
        """Drop the last n (int) cache entries of every row."""
        n = int(n)
        if n < 0 or n > self._len:
            raise ValueError(f"rollback({n}) with {self._len} cached entries")
        self._len -= n
        self._next_pos = self._next_pos - n
        self._block_start = min(self._block_start, self._len)

    def _writable(self) -> None:
        """Caches made inside ``torch.inference_mode`` (``engine.generate``) and written outside it are copied once
        into ordinary tensors (``real.nn.kvcache.KVCache.writable``)."""
        for layer in self.layers:
            if stale_inference(layer.kc):
                layer.kc, layer.vc = layer.kc.clone(), layer.vc.clone()

    def keep(self, indices) -> None:
        """Keep the entries ``indices`` (k,) int64 (block-relative, in order) of the last block, dropping the rest
        of it."""
        self._writable()
        s = self._block_start
        idx = torch.as_tensor(indices, dtype=torch.long, device=self.device).reshape(-1)
        for layer in self.layers:
            for c in (layer.kc, layer.vc):
                c[:, :, s:s + idx.numel()] = c[:, :, s + idx].clone()
        self._len = s + idx.numel()
        self._next_pos = self._block_pos + idx.numel()
