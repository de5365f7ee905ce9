"""The multimodal transformers LMs (Chameleon / Lumina-mGPT, Janus-Pro, Emu3, GLM-Image) at batch size B > 1:
``BatchedImageLM``, a ``real.protocol.BatchedTarget`` with per-row cache lengths, per-row rollback and keep, ragged
blocks, CFG pairs per image and each family's forced tokens per row.

transformers' ``DynamicCache`` keeps one length for all rows, so the family's decoder runs on our ``KVCache`` through
a port (``real.models.llama.LlamaStack`` for the Llama-shaped families, ``real.models.glm_image`` for GLM-Image). The
family adapter (``real.adapters.imagelm.ImageTokenLM`` subclass) keeps what is the family's: the prompt and its CFG
row (``prompt``), the input embeddings of ids (``embed``: Janus' generation embeddings), the image head (``head``),
the codes' LM ids and the ``ImageLayout``.

The visible stream and the model's stream. The engine sees prefix + codes (``cache_lens``); the model's cache also
holds the forced row-end token behind every code that ends a row (``ImageLayout.row_end``). Row ends fall at
different block positions in different rows once the rows accepted different numbers of drafts, so a block of S
codes is written per row as `[S code entries][e_r row-end entries][E - e_r padding]` (E = max e_r), with explicit
RoPE positions and an explicit (R, 1, S + E, K) mask; the padding sees only itself and is dropped right after. The
order of the entries in the cache does not matter to attention (positions and masks are explicit), so bookkeeping
is per slot, on the host: ``_owner[r, slot]`` = the visible index of the code an entry belongs to (the entry
itself, or the code its row end follows; -1 at hidden prompt padding), ``_forced[r, slot]``. An entry x sees a
slot y iff the engine's visible mask lets x's code see y's owner, except that a code does not see its own row end.
After every block the row's entries are reordered by (owner, forced) (``KVCache.keep`` of the block: no copy
when already in order), so every row stays sorted and ``rollback(n)`` is always a suffix of the stream; ``keep`` of
a root path keeps each node's code and row-end entries.

Positions: code i of a row sits at stream position L_r + i + (rows completed before it) (L_r the row's real
prompt length: the prompt is left-padded, positions count from its first real token, as transformers does with an
attention mask), its row end one after; a family with 3-D RoPE (GLM-Image) gives ``rope_positions``.
"""
from __future__ import annotations

import numpy as np
import torch

from real.nn.devpath import to_device
from real.nn.kvcache import KVCache, PromptRows, row_counts
from real.nn.masks import check_attn_mask
from real.protocol import ModelOutput, as_conds, left_pad

__all__ = ["BatchedImageLM"]


class BatchedImageLM(PromptRows):
    """``real.protocol.BatchedTarget`` over a family adapter (module docstring). Conditions are lists of ``Prompt``s,
    one per image; R = B rows, or 2B with CFG ([conditional rows; unconditional rows])."""
    needs_features = False
    row_masks = True

    # the family adapter's members callers use through this one (EAGLE drafters, decoders, layer-skip copies)
    _FAMILY = ("model", "code_ids", "head", "embed", "code_embeddings", "backbone", "rebuild_kwargs", "prompt")

    def __init__(self, family, stack=None, *, extra_slots: int = 64, release_source: bool = False):
        """``family``: an ``ImageTokenLM`` (its ``prompt``, ``embed``, ``head``, ``code_ids``, ``layout``); ``stack``: the
        decoder port (default ``LlamaStack.from_decoder(family.backbone)``); ``extra_slots``: cache entries per row
        past the image for tree blocks (twice that is allocated: a block's row ends take slots too);
        ``release_source``: drop the transformers decoder layers once ported (a 7B model is not held twice; the
        family adapter alone can then no longer run)."""
        stack = getattr(family, "stack", None) if stack is None else stack     # a family with its own port (GLM-Image)
        if stack is None:
            from real.models.llama import LlamaStack

            stack = LlamaStack.from_decoder(family.backbone)
        if release_source:
            family.backbone.layers = torch.nn.ModuleList()
        self.family, self.stack = family, stack
        self.layout = family.layout
        self.vocab_size = family.vocab_size
        self.extra_slots = int(extra_slots)
        self.cache: KVCache | None = None
        self._P = 0
        self._vlen = np.zeros(1, np.int64)      # (R,) visible entries: prefix + codes
        self._base = np.zeros(1, np.int64)      # (R,) real prompt length (the first code's stream position)
        self._owner = self._forced = None       # (R, max_len) per-slot bookkeeping (module docstring)
        self._blk = None                        # the last block: node slots, row-end slots, code indices, start

    def __getattr__(self, name):
        if name in BatchedImageLM._FAMILY:
            return getattr(self.__dict__["family"], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    # ------------------------------------------------------------------ protocol attributes
    device = property(lambda self: self.family.device, doc="The family model's device.")
    dtype = property(lambda self: self.family.dtype, doc="The family model's dtype.")
    hidden_size = property(lambda self: self.family.hidden_size, doc="D, the decoder's hidden size.")

    @property
    def cache_lens(self) -> np.ndarray:
        """(R,) int64 visible entries per row: prompt + codes (forced row ends not counted)."""
        return self._vlen.copy()

    def cache_bytes(self, rows: int, prompt_len: int = 256) -> int:
        """Memory of the KV cache ``prefill`` allocates for ``rows`` rows with prompts of ``prompt_len`` entries."""
        n = prompt_len + self.layout.stream_len(self.layout.num_tokens) + 2 * self.extra_slots
        return 2 * self.stack.n_layers * rows * self.stack.n_kv * n * self.stack.head_dim * \
            torch.finfo(self.dtype).bits // 8

    def image_sequence(self, codes):
        """The family's complete token sequence of one image (``ImageTokenLM.image_sequence``)."""
        return self.family.image_sequence(codes)

    def rope_positions(self, base: np.ndarray, ci: np.ndarray, forced: np.ndarray) -> np.ndarray:
        """Stream RoPE positions (R, S) of block entries: code index ``ci`` (R, S), ``forced`` (R, S) bool (the row end
        behind that code), ``base`` (R,) the rows' real prompt lengths (module docstring); the family's own
        ``rope_positions`` when it has one ((R, S, 3) for GLM-Image)."""
        own = getattr(self.family, "rope_positions", None)         # a family with its own positions (GLM's 3 axes)
        if own is not None:
            return own(base, ci, forced)
        return self.layout.position(base[:, None], ci, forced)

    def stream(self, row: int, codes: torch.Tensor) -> torch.Tensor:
        """The model ids (N,) (CPU) row ``row`` holds after its prompt, in cache order, given the codes (n,) fed to it
        after the prompt in visible order: each slot's code (its owner, ``_owner``) or the row end where ``_forced``;
        for checking the layout (``ImageTokenLM.stream``)."""
        cache = self._need_cache()
        s = slice(self._P, int(cache.lens[row]))
        ids = self.family.code_ids.cpu()[torch.as_tensor(codes).cpu()][torch.as_tensor(self._owner[row, s] - self._P)]
        forced = torch.as_tensor(self._forced[row, s])
        return ids if self.layout.row_end is None else ids.masked_fill(forced, self.layout.row_end)

    # ------------------------------------------------------------------ model calls
    def _run(self, ids: torch.Tensor, pos: np.ndarray, mask: torch.Tensor) -> torch.Tensor:
        """Model ids (R, S') at positions (R, S'[, A]) under mask (R, S', K) -> post-norm hidden (R, S', D); commits."""
        cache = self.cache
        cache.reserve(ids.shape[1])
        h = self.stack.run(self.family.embed(ids), pos, mask[:, None], cache)    # host positions: no read-back
        cache.commit()
        return h

    @torch.no_grad()
    def prefill(self, cond, tokens=None, *, cfg: bool = False, return_hidden: bool = False) -> ModelOutput:
        """Reset the cache and run the prompts (``cond``: a ``Prompt`` or a list of B, one image each; the family
        appends its header and builds the CFG row), left-padded to the longest, then the optional codes ``tokens``
        (R, S) as one chain block. Returns logits (R, 1 + S, V) float32 (+ hidden (R, P + S, D))."""
        prompts = [self.family.prompt(c, cfg) for c in as_conds(cond)]
        rows = [p.ids for p in prompts] + ([p.uncond_ids for p in prompts] if cfg else [])
        ids, real_t, _ = left_pad(rows, torch.device("cpu"))
        R, P = ids.shape
        real = real_t.numpy()                                                     # (R, P) False at padding
        lens = real.sum(1).astype(np.int64)
        max_len = P + self.layout.stream_len(self.layout.num_tokens) + 2 * self.extra_slots
        st = self.stack
        if self.cache is None or not self.cache.fits(st.n_layers, R, max_len, self.dtype, self.device):
            self.cache = KVCache(st.n_layers, R, st.n_kv, max_len, st.head_dim, dtype=self.dtype, device=self.device)
        self.cache.reset()
        self._P, self._base, self._vlen = P, lens, np.full(R, P, np.int64)
        L = self.cache.max_len
        self._owner = np.full((R, L), -1, np.int64)
        self._owner[:, :P] = np.where(real, np.arange(P), -1)
        self._forced = np.zeros((R, L), bool)
        self._blk = None
        pos = np.maximum(np.cumsum(real, 1) - 1, 0)
        if st.rope_axes > 1:
            pos = np.repeat(pos[..., None], st.rope_axes, -1)
        causal = np.tril(np.ones((P, P), bool))[None] & (real[:, None, :] | np.eye(P, dtype=bool)[None])
        h = self._run(ids.to(self.device), pos, to_device(causal, self.device))
        out = ModelOutput(self.family.head(h[:, -1:]), h if return_hidden else None)
        if tokens is None or not torch.as_tensor(tokens).numel():
            return out
        o = self.forward(torch.as_tensor(tokens), return_hidden=return_hidden)
        return ModelOutput(torch.cat([out.logits, o.logits], 1),
                           torch.cat([h, o.hidden], 1) if return_hidden else None)

    @torch.no_grad()
    def forward(self, tokens, *, position_ids=None, attn_mask=None, return_hidden: bool = False) -> ModelOutput:
        """Append codes (R, S) at visible ``position_ids`` ((S,) or (R, S); default each row's length + arange(S)) under
        ``attn_mask`` ((S, K) or (R, S, K) bool over the last K - S visible entries and the block; None: causal) ->
        logits (R, S, V) float32, the rows that predict each code's successor (its row end's, where it ends a row),
        + those hidden states (R, S, D) with ``return_hidden``."""
        cache = self._need_cache()
        t = torch.as_tensor(tokens, device=self.device, dtype=torch.long)
        R = cache.rows
        if t.ndim != 2 or t.shape[0] != R:
            raise ValueError(f"tokens must be ({R}, S), got shape {tuple(t.shape)}")
        S, vl, P, T = t.shape[1], self._vlen, self._P, self.layout.num_tokens
        if position_ids is None:
            vpos = vl[:, None] + np.arange(S)
        else:
            vpos = np.asarray(torch.as_tensor(position_ids).cpu(), np.int64)     # the family's bookkeeping is on the host
            vpos = np.broadcast_to(vpos, (R, S)) if vpos.ndim == 1 else vpos
            if vpos.shape != (R, S):
                raise ValueError(f"position_ids must be ({S},) or ({R}, {S}), got shape {vpos.shape}")
        ci = vpos - P
        if S and (ci.min() < 0 or ci.max() >= T):
            raise ValueError(f"position_ids must address the image's {T} codes (positions {P}..{P + T - 1}), "
                             f"got {vpos.min()}..{vpos.max()}")
        if attn_mask is not None:
            attn_mask = check_attn_mask(torch.as_tensor(attn_mask), S, int(vl.min()), self.device, rows=R)
        nl = self.layout.row_end
        ends = self.layout.row_ends(ci)
        e = ends.sum(1)
        E = int(e.max()) if S else 0
        rank = np.cumsum(ends, 1) - 1
        owner = np.full((R, E), -1, np.int64)                      # the node each row-end entry follows (-1: padding)
        rr, jj = np.nonzero(ends)
        owner[rr, rank[rr, jj]] = jj
        node = np.concatenate([np.broadcast_to(np.arange(S), (R, S)), owner], 1)        # (R, S') block entry -> node
        forced = np.concatenate([np.zeros((R, S), bool), owner >= 0], 1)
        pad = node < 0
        nodec = np.maximum(node, 0)
        own = np.where(pad, -2, vl[:, None] + nodec)                                 # visible index of the owner
        cin = np.take_along_axis(ci, nodec, 1)
        pos = self.rope_positions(self._base, cin, forced)
        if self.stack.rope_axes > 1 and pos.ndim == 2:
            pos = np.repeat(pos[..., None], self.stack.rope_axes, -1)
        ids = torch.cat([self.family.code_ids[t], torch.full((R, E), 0 if nl is None else nl, dtype=torch.long,
                                                            device=self.device)], 1)
        mask = self._block_mask(attn_mask, S, node, own, forced, pad)
        lens0 = cache.lens.copy()
        slots = lens0[:, None] + np.arange(S + E)
        np.put_along_axis(self._owner, slots, own, 1)
        np.put_along_axis(self._forced, slots, forced, 1)
        h = self._run(ids, pos, mask)
        fslot = np.where(ends, S + rank, -1)                      # block entry of each node's row end
        li = to_device(np.where(ends, fslot, np.arange(S)), self.device)
        hid = h.gather(1, li[..., None].expand(-1, -1, h.shape[-1]))
        # every row sorted by (owner, forced), padding dropped: one keep of the block (no copy when in order)
        key = np.where(pad, np.iinfo(np.int64).max, 2 * nodec + forced)
        order = np.argsort(key, 1, kind="stable")
        self._keep_block(order, S + e)
        inv = np.argsort(order, 1)                                # block entry -> its slot after the reorder
        self._vlen = vl + S
        self._blk = (np.take_along_axis(inv, np.broadcast_to(np.arange(S), (R, S)), 1),
                     np.where(ends, np.take_along_axis(inv, np.maximum(fslot, 0), 1), -1), ci, vl.copy())
        return ModelOutput(self.family.head(hid), hid if return_hidden else None)

    def _block_mask(self, attn_mask, S, node, own, forced, pad) -> torch.Tensor:
        """(R, S', K) bool: block entry x sees slot y (cached or in the block) iff the visible mask lets x's node see
        y's owner (older visible entries: always; hidden padding: never), except a code its own row end; padding
        sees only itself."""
        cache, dev = self.cache, self.device
        R, S2 = node.shape
        vl = self._vlen
        K = int(cache.lens.max()) + S2
        VK = int(vl.max()) + S
        v = np.arange(VK)
        if attn_mask is None:                                     # causal over the block: node j sees up to vl + j
            vis = to_device(v[None, None, :] <= (vl[:, None] + np.arange(S))[:, :, None], dev)
        else:
            Kb = attn_mask.shape[-1]
            w = vl + S - Kb                                       # (R,) the window's first visible index
            col = v[None, :] - w[:, None]                         # (R, VK)
            inw = to_device((col >= 0) & (col < Kb), dev)
            colt = to_device(np.clip(col, 0, Kb - 1), dev)
            m3 = attn_mask if attn_mask.ndim == 3 else attn_mask[None].expand(R, -1, -1)
            g = m3.gather(2, colt[:, None, :].expand(-1, S, -1))                       # (R, S, VK)
            vis = torch.where(inw[:, None, :], g, to_device(col < 0, dev)[:, None, :])
        lens = cache.lens
        oy = self._owner[:, :K].copy()
        fy = self._forced[:, :K].copy()
        cols = np.arange(K)[None, :]
        blk = (cols >= lens[:, None]) & (cols < lens[:, None] + S2)
        by = np.clip(cols - lens[:, None], 0, S2 - 1)
        oy = np.where(blk, np.take_along_axis(own, by, 1), np.where(cols < lens[:, None], oy, -2))
        fy = np.where(blk, np.take_along_axis(forced, by, 1), fy & (cols < lens[:, None]))
        rows = vis.gather(1, to_device(np.maximum(node, 0), dev)[..., None].expand(-1, -1, VK))
        m = rows.gather(2, to_device(np.clip(oy, 0, VK - 1), dev)[:, None, :].expand(-1, S2, -1))
        ok = (oy >= 0)[:, None, :] & ~(fy[:, None, :] & (oy[:, None, :] == own[:, :, None]) & ~forced[:, :, None])
        self_col = cols[:, None, :] == (lens[:, None] + np.arange(S2))[:, :, None]       # (R, S', K)
        ok = np.where(pad[:, :, None], self_col, ok)
        return m & to_device(ok, dev) | to_device(pad[:, :, None] & self_col, dev)

    # ------------------------------------------------------------------ cache edits
    def _keep_block(self, idx: np.ndarray, counts: np.ndarray) -> None:
        """``KVCache.keep`` of the last block (entries ``idx`` (R, k) block-relative, the first counts[r] in row r) with
        the per-slot bookkeeping moved alike."""
        cache = self.cache
        s = cache.block_start.copy()
        src = s[:, None] + idx
        used = np.arange(idx.shape[1])[None, :] < counts[:, None]
        ow = np.take_along_axis(self._owner, src, 1)
        fo = np.take_along_axis(self._forced, src, 1)
        cache.keep(idx, counts)
        dst = s[:, None] + np.arange(idx.shape[1])
        r, c = np.nonzero(used)
        self._owner[r, dst[r, c]] = ow[r, c]
        self._forced[r, dst[r, c]] = fo[r, c]

    def rollback(self, counts) -> None:
        """Drop the last counts[r] visible entries of row r (int: every row) with their row ends: a suffix of each
        row's sorted stream."""
        cache = self._need_cache()
        n = row_counts(counts, cache.rows)
        new = self._vlen - n
        if (new < self._P).any():
            raise ValueError(f"rollback({n.tolist()}): rows hold {(self._vlen - self._P).tolist()} image codes")
        live = np.arange(self._owner.shape[1])[None, :] < cache.lens[:, None]
        drop = (live & (self._owner >= new[:, None])).sum(1)
        cache.rollback(drop, floor=self._P)
        self._vlen = new
        self._blk = None

    def keep(self, indices, counts=None) -> None:
        """Of the last block, keep the nodes ``indices`` ((k,) or (R, k), in order; the first counts[r] in row r), a root
        path (consecutive code indices from the block's first) with their row ends; drop the rest."""
        if self._blk is None:
            raise ValueError("keep() needs the block of the last forward (no rollback in between)")
        nslot, fslot, ci, vl0 = self._blk
        R, S = ci.shape
        idx = np.asarray(torch.as_tensor(indices).cpu() if isinstance(indices, torch.Tensor) else indices, np.int64)
        idx = np.broadcast_to(idx, (R, idx.shape[-1])) if idx.ndim == 1 else idx
        k = idx.shape[1]
        c = row_counts(k if counts is None else counts, R, "counts")
        used = np.arange(k)[None, :] < c[:, None]
        if (c > k).any() or (used & ((idx < 0) | (idx >= S))).any():
            raise ValueError(f"keep: indices must lie in [0, {S}) and counts <= {k}")
        ii = np.where(used, idx, 0)
        cik = np.take_along_axis(ci, ii, 1)
        want = (vl0 - self._P)[:, None] + np.arange(k)
        if (used & (cik != want)).any():
            raise ValueError("keep() needs a root path of the last block: nodes at code indices n, n + 1, ... in order")
        ns, fs = np.take_along_axis(nslot, ii, 1), np.take_along_axis(fslot, ii, 1)
        has_f = used & (fs >= 0)
        both = np.stack([ns, np.where(has_f, fs, ns)], 2).reshape(R, 2 * k)
        take = np.stack([used, has_f], 2).reshape(R, 2 * k)
        order = np.argsort(~take, 1, kind="stable")               # the kept entries first, in stream order
        sel = np.take_along_axis(both, order, 1)
        cnt = take.sum(1)
        self._keep_block(sel, cnt)
        new = vl0 + c
        dst = self.cache.block_start[:, None] + np.arange(2 * k)
        live = np.arange(2 * k)[None, :] < cnt[:, None]
        r, j = np.nonzero(live)
        nodes = np.take_along_axis(np.repeat(np.arange(k), 2)[None].repeat(R, 0), order, 1)   # kept entry -> path depth
        self._owner[r, dst[r, j]] = vl0[r] + nodes[r, j]          # renumbered: path node t is visible entry vl0 + t
        self._vlen = new
        self._blk = None
