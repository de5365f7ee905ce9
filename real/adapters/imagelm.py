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

``ImageTokenLM`` is the family adapter (prompt and CFG row, embeddings, image head, code ids, layout) and, as a
``real.protocol`` model of one image, a thin view of ``real.adapters.batched_imagelm.BatchedImageLM`` with that one
image: its ``prefill`` / ``forward`` / ``rollback`` / ``keep`` are the batched adapter's, which keeps the one
visible-vs-stream bookkeeping (made on first use, with its own port of the decoder layers). Visible quantities:
``cache_len`` counts prefix + codes (row-end entries hidden); ``forward(position_ids=...)`` takes visible positions
and (S, K) masks over visible entries; ``rollback(n)`` drops the last n visible entries with their row ends;
``keep(indices)`` keeps a root path of the last block with its row ends. Image logits come from the hidden states through the rows of the
output head that belong to the codes (or a family's own generation head), never through the model's
full-vocabulary forward (Chameleon's forward sets every image logit to the dtype minimum).

Modules: the index arithmetic of the image token stream is ``real.adapters.image_layout`` (pure, tested without
a model), the EAGLE drafter pieces ``real.adapters.imagelm_eagle``, the loading helpers ``real.adapters.imagelm_loading``;
this module holds the adapter and re-exports the others' public names.
"""
from __future__ import annotations

import torch
from torch import nn

from real.nn.layers import linear
from .batched_imagelm import BatchedImageLM
from .image_layout import ImageLayout
from real.protocol import ModelOutput, Prompt

__all__ = ["ImageTokenLM"]


class ImageTokenLM:
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
        self.model = model.eval()
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

    needs_features = False
    batched = False          # one image: the engine wraps it in real.protocol.OneRow (the batched form is BatchedImageLM)
    device = property(lambda self: self.model.device, doc="The wrapped model's device.")
    dtype = property(lambda self: self.model.dtype, doc="The wrapped model's dtype.")

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
        after the prefix, in cache order, for checking the layout: each entry the code it holds (the visible code its
        slot belongs to) or the row end, read from ``BatchedImageLM``'s per-slot bookkeeping."""
        b = self.__dict__.get("_rows")
        if b is None or b.cache is None:
            raise ValueError("stream() before prefill")
        return b.stream(row, self._seen[row].cpu())

    # ------------------------------------------------------------------ protocol: a one-image view of BatchedImageLM
    def _batched(self) -> BatchedImageLM:
        """The ``BatchedImageLM`` over this family that holds the cache and its visible-vs-stream bookkeeping (made on
        first use: its decoder port is a copy of the transformers layers, which stay for the family's other users)."""
        b = self.__dict__.get("_rows")
        if b is None:
            b = self._rows = BatchedImageLM(self)
        return b

    @property
    def cache_len(self) -> int:
        """Visible entries per row: prefix + codes (forced row ends not counted); 0 before prefill."""
        b = self.__dict__.get("_rows")
        return 0 if b is None or b.cache is None else int(b.cache_lens[0])

    @property
    def prefix_len(self) -> int:
        """Prompt entries per row (padding included) of the last prefill."""
        return self._batched().prefix_len

    @property
    def stream_len(self) -> int:
        """Entries of the model's own stream in the cache (prefix, codes and forced row ends)."""
        b = self.__dict__.get("_rows")
        return 0 if b is None or b.cache is None else int(b.cache.lens[0])

    @torch.no_grad()
    def prefill(self, cond, tokens: torch.Tensor | None = None, *, cfg: bool = False,
                return_hidden: bool = False) -> ModelOutput:
        """cond: one ``Prompt`` of prompt ids (the layout header is appended unless already there; with cfg the
        unconditional row is built as described in the class docstring); tokens (B, S) codes (B = 2 with cfg) ->
        logits (B, 1 + S, V) (+ hidden (B, P + S, D)): ``BatchedImageLM.prefill`` of one image."""
        b = self._batched()
        t = None if tokens is None else torch.as_tensor(tokens)
        out = b.prefill([cond if isinstance(cond, Prompt) else Prompt(cond)], t, cfg=cfg, return_hidden=return_hidden)
        R = b.cache.rows
        self._seen = t.to(self.device, torch.long) if t is not None and t.numel() else \
            torch.zeros(R, 0, dtype=torch.long, device=self.device)
        self._blk_at = None
        return out

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, *, position_ids: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, return_hidden: bool = False) -> ModelOutput:
        """Codes (B, S) at visible positions ``position_ids`` (S,) (default cache_len + arange(S)) under ``attn_mask``
        (S, K) over visible entries as in ``real.protocol``: ``BatchedImageLM.forward`` of one image."""
        b = self.__dict__.get("_rows")
        if b is None or b.cache is None:
            raise ValueError(f"{type(self).__name__}.forward before prefill")
        out = b.forward(tokens, position_ids=position_ids, attn_mask=attn_mask, return_hidden=return_hidden)
        self._blk_at = self._seen.shape[1]
        self._seen = torch.cat([self._seen, torch.as_tensor(tokens, device=self.device, dtype=torch.long)], 1)
        return out

    def rollback(self, n: int) -> None:
        """Drop the last n visible entries (codes) and the row-end tokens that follow them."""
        b = self.__dict__.get("_rows")
        if b is None or b.cache is None:
            raise ValueError(f"{type(self).__name__}.rollback before prefill")
        n = int(n)
        b.rollback(n)
        self._seen = self._seen[:, :self._seen.shape[1] - n]
        self._blk_at = None

    def keep(self, indices: torch.Tensor) -> None:
        """Keep the nodes ``indices`` (k,) of the last block, a root path (depths 0..k-1), with their
        row-end tokens; drop the rest of the block."""
        b = self.__dict__.get("_rows")
        if b is None or self._blk_at is None:
            raise ValueError("keep() without a preceding block")
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        b.keep(idx)
        s = self._blk_at
        self._seen = torch.cat([self._seen[:, :s], self._seen[:, s + idx.to(self.device)]], 1)
        self._blk_at = None
