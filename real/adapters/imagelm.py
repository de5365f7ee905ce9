"""Multimodal transformers LMs that write images as token grids (Chameleon / Lumina-mGPT, Janus, Emu3),
as ``real.protocol`` models over the image-code vocabulary alone.

Design (one choice for all three families). The engine sees only the H x W image codes, token k = VQ
code k (so LANTERN's codebook neighbours and the VQ decoders apply to engine tokens directly). The
structural tokens of a family's image layout are the adapter's business:

* the header (boi, size tokens, ...) closes the prompt of BOTH CFG rows, so it is part of the prefix;
* the row-end token (Lumina-mGPT's newline ``<reserved08799>``, Emu3's ``<|extra_200|>``) is FORCED
  after every W-th code: the adapter inserts it into the model's input behind the code that ends a
  row, and reads that code's "next-token" logits at the row-end position (the logits that predict the
  first code of the next row). A forced token is a point mass for target and draft alike, so leaving
  it out of verification changes nothing: p and q at every engine position are the family's
  constrained distributions (the code logits only; non-code tokens masked), with CFG and top-k
  applied by ``real.decode.sampling.Processing`` identically to both;
* the trailer (eoi, ...) follows the last code; the engine never feeds it (``image_sequence`` writes
  the complete token sequence of an image, ``ImageLayout.check`` verifies one).

Restricting to code logits before CFG equals the families' order (CFG on all logits, then the
positional mask, then top-k): CFG is affine per token, and Lumina-mGPT's / transformers' CFG on
log-softmax scores differs from CFG on logits by a per-row constant, which the renormalisation over
the codes removes.

``ImageTokenLM`` subclasses ``real.adapters.hf.HFCausalLM`` and reuses its DynamicCache, left-padded CFG pair,
positions, tree masks, rollback and keep; it only maps the visible (code) stream to the model's
stream. Visible quantities: ``cache_len`` counts prefix + codes (row-end entries hidden);
``forward(position_ids=...)`` takes visible positions (code index = position - prefix length decides
where a row end is forced, so tree levels at any depth get theirs) and (S, K) masks over visible
entries (``real.decode.engine.tree_generate`` drafts level by level with them); ``rollback(n)`` drops the
last n visible entries with their row-end tokens; ``keep(indices)`` keeps a root path of the last
block (depths 0..k-1) with its row-end tokens. Image logits come from the hidden states through the rows of the
output head that belong to the codes (or a family's own generation head), never through the model's
full-vocabulary forward (Chameleon's forward sets every image logit to the dtype minimum).

Modules: the index arithmetic of the image token stream is ``real.adapters.image_layout`` (pure, tested without
a model), the EAGLE drafter pieces ``real.adapters.imagelm_eagle``, the loading helpers ``real.adapters.imagelm_loading``;
this module holds the adapter and re-exports the others' public names.
"""
from __future__ import annotations

import inspect

import torch
from torch import nn

from .hf import HFCausalLM
from real.nn.layers import linear
from .image_layout import KIND_CODE, KIND_ROW_END, ImageLayout, kept_entries, visible_cut
from real.protocol import ModelOutput, Prompt, left_pad_ids

__all__ = ["ImageTokenLM"]


class ImageTokenLM(HFCausalLM):
    """A multimodal transformers LM as a ``real.protocol.ARModel`` over its V image codes.

    ``model``: the transformers model (kept for ``device``/``dtype`` and decoding); ``backbone``: the
    decoder stack that takes ``inputs_embeds`` and returns the post-norm ``last_hidden_state``;
    ``layout``: ``ImageLayout``; ``code_ids`` (V,): the input ids that feed code k; ``head_weight``
    (V, D): the output-head rows of the codes (families with their own head override ``head``).
    ``uncond``: how the CFG row is built when ``Prompt.uncond_ids`` is None (``"header"``: the header
    alone, Lumina-mGPT's unconditional branch that starts at boi; ``"pad"``: the prompt with every id
    but ``keep_ids`` replaced by ``pad_id``, Janus). Parameters are frozen (inference adapter)."""

    def __init__(self, model, backbone: nn.Module, layout: ImageLayout, code_ids: torch.Tensor,
                 head_weight: torch.Tensor | None = None, *, uncond: str = "header", pad_id: int | None = None,
                 keep_ids: tuple[int, ...] = ()):
        """Arguments as in the class docstring: ``code_ids`` (V,) int64, ``head_weight`` (V, D) or None. ValueError
        for V < 2, a head without V rows, an unknown ``uncond``, or ``uncond='pad'`` without ``pad_id``."""
        super().__init__(model)
        model.requires_grad_(False)
        self.backbone = backbone
        self.layout = layout
        self.code_ids = torch.as_tensor(code_ids, dtype=torch.long).reshape(-1).to(self.device)
        V = int(self.code_ids.numel())
        if V < 2:
            raise ValueError(f"need at least 2 image codes, got {V}")
        self.vocab_size = V
        self._head_w = None if head_weight is None else head_weight.detach()
        if head_weight is not None and tuple(head_weight.shape[:1]) != (V,):
            raise ValueError(f"head_weight must have {V} rows (one per code), got {tuple(head_weight.shape)}")
        if uncond not in ("header", "pad"):
            raise ValueError(f"uncond must be 'header' or 'pad', got {uncond!r}")
        if uncond == "pad" and pad_id is None:
            raise ValueError("uncond='pad' needs pad_id")
        self.uncond, self.pad_id, self.keep_ids = uncond, pad_id, tuple(keep_ids)
        params = inspect.signature(backbone.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._reset_stream()

    # ------------------------------------------------------------------ family hooks
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings (B, S, D) of model-stream ids (B, S)."""
        return self.backbone.get_input_embeddings()(ids)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits (..., V) over the image codes from last hidden states (..., D)."""
        w = self._head_w
        return linear(hidden.to(w.dtype), w).float()

    def code_embeddings(self) -> torch.Tensor:
        """(V, D) input embedding of every code (for EAGLE drafters)."""
        return self.embed(self.code_ids.view(1, -1))[0].detach()

    def rebuild_kwargs(self) -> dict:
        """Keyword arguments that rebuild this adapter type around another model of the family (a
        layer-skip copy): ``type(a)(other_model, **a.rebuild_kwargs())``."""
        raise NotImplementedError(f"{type(self).__name__} does not define rebuild_kwargs()")

    @property
    def hidden_size(self) -> int:
        """D, the decoder's hidden size."""
        return int(self.backbone.config.hidden_size)

    # ------------------------------------------------------------------ prompts and sequences
    def prompt(self, cond, cfg: bool) -> Prompt:
        """The model rows of one condition: ``Prompt`` (ids with the layout header; with ``cfg`` its unconditional row
        as the class docstring says)."""
        return self._prompt(cond, cfg)

    def _prompt(self, cond, cfg: bool) -> Prompt:
        p = cond if isinstance(cond, Prompt) else Prompt(cond)
        hdr = torch.tensor(self.layout.header, dtype=torch.long)
        ids = p.ids if self._has_header(p.ids) else torch.cat([p.ids, hdr])
        if not cfg:
            return Prompt(ids)
        if p.uncond_ids is not None:
            un = p.uncond_ids if self._has_header(p.uncond_ids) else torch.cat([p.uncond_ids, hdr])
        elif self.uncond == "header":
            if not len(hdr):
                raise ValueError("CFG without Prompt.uncond_ids needs a layout header for the unconditional row")
            un = hdr
        else:
            un = ids.clone()
            keep = torch.isin(un, torch.tensor(self.keep_ids, dtype=torch.long)) if self.keep_ids else torch.zeros_like(un, dtype=torch.bool)
            un[~keep] = self.pad_id
        return Prompt(ids, un)

    def _has_header(self, ids: torch.Tensor) -> bool:
        h = len(self.layout.header)
        return h > 0 and ids.numel() >= h and ids[-h:].tolist() == list(self.layout.header)

    def image_sequence(self, codes: torch.Tensor) -> torch.Tensor:
        """Complete LM-id sequence of one image from its codes (T,): header, rows with row ends, trailer."""
        c = torch.as_tensor(codes, dtype=torch.long).reshape(-1)
        if c.numel() and (int(c.min()) < 0 or int(c.max()) >= self.vocab_size):
            raise ValueError(f"codes must lie in [0, {self.vocab_size})")
        return self.layout.sequence(self.code_ids.cpu()[c.cpu()])

    def stream(self, row: int = 0) -> torch.Tensor:
        """The ids (N,) (CPU; N = codes + forced row ends) the model has in its cache for CFG row ``row``
        after the prefix, for checking the layout."""
        if self._ids is None:
            raise ValueError("stream() before prefill")
        return self._ids[row, self._prefix_len:].cpu()

    # ------------------------------------------------------------------ model call
    def _call(self, ids, mask, pos, return_hidden, keep=0):
        out = self.backbone(inputs_embeds=self.embed(ids), attention_mask=mask, position_ids=pos, use_cache=True,
                            **{self._cache_kw: self.cache})
        return ModelOutput(None, out.last_hidden_state)

    def _reset_stream(self):
        self._kind = torch.zeros(0, dtype=torch.int8)    # per cache entry: prefix / code / row end (CPU)
        self._ids: torch.Tensor | None = None            # (B, inner len) ids in the cache (device)
        self._n_code = 0
        self._n_row_end = 0
        self._prefix_len = 0
        self._blk = None                                  # last block: (a (S,), ends (S,), code index (S,)) CPU

    @property
    def cache_len(self) -> int:
        """Visible entries per row: prefix + codes (forced row ends not counted)."""
        return self.stream_len - self._n_row_end

    def _codes(self, tokens: torch.Tensor, ci: torch.Tensor) -> torch.Tensor:
        """Codes (B, S) with code indices ``ci`` (S,) (CPU; position in the image, raster order) -> their model ids
        (B, S), checked (ValueError for a shape or a code index outside the image); the layout inserts the row ends
        (``ImageLayout.feed``)."""
        t = torch.as_tensor(tokens, device=self.device, dtype=torch.long)
        if t.ndim != 2:
            raise ValueError(f"tokens must be (B, S), got shape {tuple(t.shape)}")
        S = t.shape[1]
        T = self.layout.num_tokens
        if S and int(ci.min()) < 0:
            raise ValueError(f"position_ids inside the prefix (code index {int(ci.min())})")
        if S and int(ci.max()) >= T:
            raise ValueError(f"the image has {T} codes ({self.layout.height} x {self.layout.width}); "
                             f"a code at index {int(ci.max())} cannot be fed")
        return self.code_ids[t]                          # out-of-range codes fail loudly here

    # ------------------------------------------------------------------ protocol
    @torch.no_grad()
    def prefill(self, cond, tokens: torch.Tensor | None = None, *, cfg: bool = False,
                return_hidden: bool = False) -> ModelOutput:
        """cond: a ``Prompt`` of prompt ids (the layout header is appended unless already there; with
        cfg the unconditional row is built as described in the class docstring); tokens (B, S) codes."""
        if tokens is not None and (int(torch.as_tensor(tokens).numel()) == 0):
            tokens = None
        prompt = self._prompt(cond, cfg)
        self._reset_stream()
        if tokens is not None:
            ci = torch.arange(tokens.shape[-1])
            ids, a, ends, kind = self.layout.feed(ci, self._codes(tokens, ci))[:4]
        out = super().prefill(prompt, ids if tokens is not None else None, cfg=cfg, return_hidden=True)
        h = out.hidden
        n_blk = ids.shape[1] if tokens is not None else 0
        P = h.shape[1] - n_blk
        self._prefix_len = P
        self._kind = torch.zeros(P, dtype=torch.int8)
        rows = h[:, P - 1:P]
        hid = h[:, :P]
        if tokens is not None:
            li = (P + a + ends.long()).to(self.device)
            rows = torch.cat([rows, h[:, li]], 1)
            hid = torch.cat([hid, h[:, li]], 1)
            self._kind = torch.cat([self._kind, kind])
            self._n_code, self._n_row_end = int(tokens.shape[-1]), int(ends.sum())
            self._blk = (a, ends, torch.arange(tokens.shape[-1]))
        self._ids = left_pad_ids([prompt.ids] + ([prompt.uncond_ids] if cfg else []), self.device)[0]   # (B, P)
        if tokens is not None:
            self._ids = torch.cat([self._ids, ids], 1)
        return ModelOutput(self.head(rows), hid if return_hidden else None)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, *, position_ids: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, return_hidden: bool = False) -> ModelOutput:
        """Codes (B, S) at visible positions ``position_ids`` (S,) (default cache_len + arange(S)); code
        index = position - prefix length decides where row ends are forced. ``attn_mask`` (S, K) as in
        ``real.protocol`` over visible entries (K > S: the last K - S visible cached entries, with the
        row-end tokens that follow them). Tree blocks copy position_ids to the host (one small copy)."""
        if self.cache is None:
            raise ValueError(f"{type(self).__name__}.forward before prefill")
        B, S = tokens.shape
        vis, P = self.cache_len, self._prefix_len
        if position_ids is None:
            vpos = vis + torch.arange(S)
        else:
            vpos = torch.as_tensor(position_ids, dtype=torch.long).reshape(-1).cpu()
            if vpos.numel() != S:
                raise ValueError(f"position_ids must have {S} entries, got {vpos.numel()}")
        ci = vpos - P
        codes = self._codes(tokens, ci)
        m = None                                                   # the default chain: positions and mask implied
        if attn_mask is not None:
            m = torch.as_tensor(attn_mask, dtype=torch.bool).cpu()
            if m.ndim != 2 or m.shape[0] != S or not S <= m.shape[1] <= vis + S:
                raise ValueError(f"attn_mask must be (S, K) with S = {S} and {S} <= K <= cache_len + S = "
                                 f"{vis + S}, got {tuple(m.shape)}")
        elif position_ids is not None:
            m = torch.ones(S, S, dtype=torch.bool).tril_()
        # the block in the model's stream: its ids, entries and (given positions or a mask) positions and mask
        fed = self.layout.feed(ci, codes, None if m is None else P, m, self._kind)
        ids, a, ends, kind = fed[:4]
        out = super().forward(ids, position_ids=None if m is None else fed.positions.to(self.device),
                              attn_mask=None if m is None else fed.mask.to(self.device), return_hidden=True)
        li = (a + ends.long()).to(self.device)
        h = out.hidden[:, li]
        self._kind = torch.cat([self._kind, kind])
        self._ids = torch.cat([self._ids, ids], 1)
        self._n_code += S
        self._n_row_end += int(ends.sum())
        self._blk = (a, ends, ci)
        return ModelOutput(self.head(h), h if return_hidden else None)

    def rollback(self, n: int) -> None:
        """Drop the last n visible entries (codes) and the row-end tokens that follow them."""
        n = int(n)
        if n < 0 or n > self.cache_len - self._prefix_len:
            raise ValueError(f"rollback({n}) with {self.cache_len - self._prefix_len} cached image tokens")
        if n == 0:
            return
        cut = visible_cut(self._kind, n)
        dropped = self._kind[cut:]
        super().rollback(self.stream_len - cut)
        self._n_code -= int((dropped == KIND_CODE).sum())
        self._n_row_end -= int((dropped == KIND_ROW_END).sum())
        self._kind = self._kind[:cut]
        self._ids = self._ids[:, :cut]

    def keep(self, indices: torch.Tensor) -> None:
        """Keep the nodes ``indices`` (k,) of the last block, a root path (depths 0..k-1), with their
        row-end tokens; drop the rest of the block."""
        if self._blk is None:
            raise ValueError("keep() without a preceding block")
        a, ends, ci = self._blk
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1).cpu()
        S = a.numel()
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= S):
            raise ValueError(f"keep indices must lie in [0, {S})")
        if idx.numel() and not torch.equal(ci[idx], int(ci.min()) + torch.arange(idx.numel())):
            raise ValueError("keep() needs a root path of the last block (nodes at depths 0, 1, ..., k-1 in order)")
        sel = kept_entries(a, ends, idx)
        n_blk = S + int(ends.sum())
        s = self.stream_len - n_blk
        super().keep(sel.to(self.device))
        self._kind = torch.cat([self._kind[:s], self._kind[s + sel]])
        self._ids = torch.cat([self._ids[:, :s], self._ids[:, s + sel.to(self.device)]], 1)
        self._n_code += idx.numel() - S
        self._n_row_end += int(ends[idx].sum()) - int(ends.sum())
        self._blk = None
