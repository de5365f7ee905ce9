"""Any transformers causal LM as a ``real.protocol.ARModel`` (target or draft).

The adapter keeps transformers' ``DynamicCache`` for the entries and the one cache bookkeeping of this project
(``real.nn.kvcache.CacheIndex``: lengths, the last block's start, the hidden padded prefix) for everything else: a CFG
pair (prompt, uncond prompt) is left-padded to one length, padded columns masked and position ids counted from each
row's first real token, so both rows continue in lock step; ``keep`` moves the kept entries of every layer. Image tokens 0..V-1 of the engine are mapped to the model's
ids by ``image_token_ids`` (V,) (a multimodal LM's image-token range) and logits are sliced to them;
by default the whole LM vocabulary is the image vocabulary.

transformers 5.x: the forward keyword is ``cache=`` and ``DynamicCache.crop(-n)`` drops the last n
entries (checked on 5.24); 4.x (``past_key_values=``, ``crop(max_length)``) is handled too.
Tree verification: ``attn_mask`` (S, S) becomes a 4-D additive mask over [cache; block] and
``position_ids`` become per-row positions; ``keep(indices)`` compacts the cache layers in place.
"""
from __future__ import annotations

import inspect

import torch

import numpy as np

from real.nn.kvcache import CacheIndex, common_len
from real.nn.masks import block_mask
from real.protocol import ModelOutput, prompt_rows

__all__ = ["HFCausalLM"]


class HFCausalLM:
    """``real.protocol.ARModel`` over a transformers causal LM
    (its own ``DynamicCache``, one cache length for all rows: the engine wraps it in ``real.protocol.OneRow``).
    Conditions are ``Prompt``s
    (a CFG pair is left-padded: padded prefix columns are masked, positions count from each row's first real token).
    Logits are float32 (B, S, V) over the image tokens: V = len(``image_token_ids``) when given, else the LM's
    whole vocabulary."""
    needs_features = False
    batched = False          # one cache length for all rows: the engine wraps it in real.protocol.OneRow

    def __init__(self, model, image_token_ids: torch.Tensor | None = None):
        """``model``: a transformers ``*ForCausalLM`` (put in eval mode); ``image_token_ids`` (V,) int64: the LM
        ids of image tokens 0..V-1, each in [0, LM vocabulary), to which tokens are mapped and by which the
        logits are sliced; None: tokens are LM ids. ValueError for empty or out-of-range ids."""
        from transformers import DynamicCache

        self.model = model.eval()
        self._Cache = DynamicCache
        n_out = model.get_output_embeddings().weight.shape[0]
        if image_token_ids is not None:
            ids = torch.as_tensor(image_token_ids, dtype=torch.long).reshape(-1)
            if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= n_out:
                raise ValueError(f"image_token_ids must be non-empty ids in [0, {n_out})")
            self.image_token_ids = ids.to(self.device)
        else:
            self.image_token_ids = None
        self.vocab_size = n_out if image_token_ids is None else int(self.image_token_ids.numel())
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._crop_negative = "tokens_to_remove" in inspect.signature(DynamicCache.crop).parameters
        self.cache = None                        # transformers' DynamicCache: the entries
        self.index: CacheIndex | None = None     # lengths, block start, hidden padding (real.nn.kvcache)

    @property
    def device(self):
        """The wrapped model's device."""
        return self.model.device

    @property
    def dtype(self):
        """The wrapped model's dtype."""
        return self.model.dtype

    @property
    def cache_len(self) -> int:
        """Entries in the cache (every row), prefix included."""
        return self.stream_len

    @property
    def stream_len(self) -> int:
        """Entries of the model's own stream in the cache (an adapter that hides tokens from the engine, such as
        ``real.adapters.imagelm``, holds more than its ``cache_len`` shows)."""
        return 0 if self.index is None else common_len(self.index.lens)

    def _full_mask(self, B: int) -> torch.Tensor:
        """(B, cache entries) long: 1 at real entries, 0 at the padded prefix (``CacheIndex.visible``)."""
        n = self.stream_len
        pad = torch.as_tensor(self.index.pad, device=self.device)
        return (torch.arange(n, device=self.device)[None, :] >= pad[:, None]).long()

    def next_positions(self) -> torch.Tensor:
        """(B,) the position of the next entry of each row: its entries minus its padding."""
        return torch.as_tensor(self.stream_len - self.index.pad, device=self.device)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits (..., V) from last hidden states (..., D) through the LM's output embeddings
        (the ``image_token_ids`` columns when given)."""
        logits = self.model.get_output_embeddings()(hidden).float()
        return logits if self.image_token_ids is None else logits[..., self.image_token_ids]

    def _map(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, device=self.device, dtype=torch.long)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be (B, S), got shape {tuple(tokens.shape)}")
        return tokens if self.image_token_ids is None else self.image_token_ids[tokens]

    def _call(self, ids, mask, pos, return_hidden, keep=0):
        kw = {self._cache_kw: self.cache}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         output_hidden_states=return_hidden, logits_to_keep=keep, **kw)
        logits = out.logits.float()
        if self.image_token_ids is not None:
            logits = logits[..., self.image_token_ids]
        return ModelOutput(logits, out.hidden_states[-1] if return_hidden else None)

    @torch.no_grad()
    def prefill(self, cond, tokens: torch.Tensor | None = None, *, cfg: bool = False,
                return_hidden: bool = False) -> ModelOutput:
        """Reset the cache and run the prompt: cond a ``Prompt`` (or ids) -> prefix ids (B, P), B = 2 with ``cfg``
        (the pair (ids, uncond_ids), left-padded) else 1, followed by the optional image ``tokens`` (B, S).
        Returns ``ModelOutput``: logits (B, 1 + S, V) float32 (row 0 after the prefix), and with
        ``return_hidden`` the last hidden states (B, P + S, D)."""
        ids, real, pos = prompt_rows(cond, cfg, self.device)
        mask = real.long()
        S = 0
        if tokens is not None and tokens.numel():
            t = self._map(tokens)
            if t.shape[0] != ids.shape[0]:
                raise ValueError(f"tokens must have batch {ids.shape[0]}, got {t.shape[0]}")
            S = t.shape[1]
            ids = torch.cat([ids, t], 1)
            mask = torch.cat([mask, torch.ones_like(t)], 1)
            pos = torch.cat([pos, pos[:, -1:] + 1 + torch.arange(S, device=self.device)], 1)
        self.cache = self._Cache(config=self.model.config)
        self.index = _DynamicIndex(self, ids.shape[0])
        self.index.hide_prefix(real)
        padded = self.index.visible is not None
        out = self._call(ids, mask if padded else None, pos if padded else None, return_hidden, keep=S + 1)
        self.index.advance(ids.shape[1])
        return out

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, *, position_ids: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, return_hidden: bool = False) -> ModelOutput:
        """Append a block of image tokens (B, S) to the cache -> ``ModelOutput`` logits (B, S, V) float32 (+ last
        hidden states (B, S, D) with ``return_hidden``). ``position_ids`` (S,) absolute positions of the block
        (default cache_len + arange(S); each row's left padding is subtracted); ``attn_mask`` (S, K) bool, S <=
        K <= cache_len + S, as in ``real.protocol``."""
        if self.cache is None:
            raise ValueError("HFCausalLM.forward before prefill")
        t = self._map(tokens)
        B, S = t.shape
        start = self.stream_len
        if self.index.visible is None and position_ids is None and attn_mask is None:
            out = self._call(t, None, None, return_hidden)      # plain chain: the model derives positions and mask
            self.index.advance(S)
            return out
        if position_ids is None:
            off = torch.arange(S, device=self.device)
        else:
            off = torch.as_tensor(position_ids, device=self.device, dtype=torch.long).reshape(-1) - start
            if off.numel() != S:
                raise ValueError(f"position_ids must have {S} entries, got {off.numel()}")
        pos = self.next_positions()[:, None] + off[None]
        new_mask = torch.cat([self._full_mask(B), torch.ones(B, S, dtype=torch.long, device=self.device)], 1)
        if attn_mask is None:
            m = new_mask
        else:
            vis = block_mask(S, start, attn_mask, self.device)[None] & new_mask[:, None, :].bool()   # (B, S, len+S)
            m = torch.zeros(vis.shape, dtype=self.dtype, device=self.device)
            m = m.masked_fill(~vis, torch.finfo(self.dtype).min)[:, None]
        out = self._call(t, m, pos, return_hidden)
        self.index.advance(S)
        return out

    def rollback(self, n: int) -> None:
        """Drop the last n (int) cache entries of every row."""
        n = int(n)
        if n < 0 or n > self.stream_len:
            raise ValueError(f"rollback({n}) with {self.stream_len} cached entries")
        if n == 0:
            return
        if self._crop_negative:
            self.cache.crop(-n)
        else:  # transformers 4.x: crop(max_length)
            self.cache.crop(self.stream_len - n)
        self.index.rollback(n)

    def keep(self, indices: torch.Tensor) -> None:
        """Keep the entries ``indices`` (k,) int64 (block-relative, in order) of the last block and drop the rest
        of it; the kept entries' positions become consecutive (a chain)."""
        if getattr(self.cache, "layers", None) is None:
            raise NotImplementedError("keep() needs a transformers cache with per-layer key/value tensors (5.x)")
        self.index.keep(np.asarray(torch.as_tensor(indices).cpu(), np.int64).reshape(-1))


class _DynamicIndex(CacheIndex):
    """The adapter's ``CacheIndex``: ``keep`` moves the kept entries inside transformers' ``DynamicCache`` layers (every
    row keeps the same ones: the adapter's rows share one length)."""

    def __init__(self, owner: HFCausalLM, rows: int):
        super().__init__(rows, owner.device)
        self.owner = owner

    def move(self, src: np.ndarray) -> None:
        s, idx = int(self.block_start[0]), torch.as_tensor(src[0], device=self.device)
        for layer in self.owner.cache.layers:
            layer.keys = torch.cat([layer.keys[..., :s, :], layer.keys[..., idx, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :s, :], layer.values[..., idx, :]], dim=-2)

    def keep(self, indices, counts=None) -> None:
        """``CacheIndex.keep``, then the layers cut to the kept length (kept entries already in place move nothing,
        but a dynamic cache's length is its tensors')."""
        super().keep(indices, counts)
        n = int(self.lens[0])
        for layer in self.owner.cache.layers:
            layer.keys, layer.values = layer.keys[..., :n, :], layer.values[..., :n, :]


def hf_llama_pair(seed: int = 0, hidden: int = 128, layers: int = 4, vocab: int = 256, draft_layers: int = 1):
    """Random LlamaForCausalLM target and its layer-skip draft (first ``draft_layers`` layers, shared
    embeddings/norm/head copied), embedding-dominated like ``tiny_llamagen_pair``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    tgt = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in tgt.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif "embed_tokens" in name:
                p.normal_(0, 1.0, generator=g)
            elif "lm_head" in name:
                p.normal_(0, 0.2, generator=g)
            else:
                p.normal_(0, 0.05, generator=g)
    dcfg = LlamaConfig(**{**cfg.to_dict(), "num_hidden_layers": draft_layers})
    drf = LlamaForCausalLM(dcfg).eval()
    sd = {k: v for k, v in tgt.state_dict().items()
          if not k.startswith("model.layers.") or int(k.split(".")[2]) < draft_layers}
    drf.load_state_dict(sd, strict=True)
    for m in (tgt, drf):
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    return tgt, drf
