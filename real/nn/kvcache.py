"""One static KV cache for every model that owns its cache (LlamaGen, the EAGLE-1 drafter, FastLlama): one source of
truth for per-row lengths, addressed by positions.

gpt-fast style: per layer, preallocated key and value tensors (rows, n_kv, max_len, head_dim), written
in place. Each row (an image, or one half of its classifier-free-guidance pair) has its own length,
so rows that accepted different numbers of drafts continue side by side: a block of S new entries is
written at slots ``lens[r] + [0, S)`` of row r, and the attention mask hides, per row, everything past
the row's own entries. Slots beyond a row's length hold stale values that no query can see.

Lengths live on the host (numpy int64): rollback and keep take host arrays, which the engine has after
its one verdict sync per round, so no cache operation syncs with the device.

Padded prefixes (LlamaGen's t2i captions, FastLlama's left-padded prompt pairs): ``hide_prefix(visible)`` with
``visible`` (R, P) bool marks the prefix entries no query may see (False), except the padded entries themselves during
the block that writes them (their own outputs are discarded, but a query must see something).

Operations (all per row, ``rows`` = R):
  ``hide_prefix(visible)``  (R, P) bool prefix visibility, or None (every entry visible); kept until ``reset``
  ``begin(S, attn_mask)``   (R or 1, 1, S, K) bool visibility of a block of S new entries (or None when
                             every row sees everything: equal lengths and S = 1), K = max(lens) + S;
                             ``attn_mask`` (S, Kb) shared or (R, S, Kb) per row (dynamic trees)
  ``update(i, k, v)``       write layer i's (R, n_kv, S, hd) block, return its (R, n_kv, K, hd) keys/values
  ``commit()``              the block becomes part of the cache (lens += S)
  ``rollback(n)``           drop the last n[r] entries of row r (int or (R,))
  ``keep(indices, counts)`` of the last block keep entries ``indices`` ((k,) or (R, k)), the first
                             ``counts[r]`` of them in row r, compacted in order (tree verification)
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from real.nn.layers import stale_inference
from .devpath import to_device
from .masks import check_attn_mask

__all__ = ["CacheIndex", "KVCache", "CachedRows", "PromptRows", "row_counts", "common_len", "static_keys"]

_STATIC: list[bool] = []        # ``static_keys`` scopes, innermost last


@contextlib.contextmanager
def static_keys(on: bool = True):
    """Within the scope, a ``KVCache`` block attends over all ``max_len`` slots of every row (its mask hiding what a
    row does not hold) instead of the first max(lens) + S: the keys, values and mask of a forward keep one shape for
    the whole generation, whatever the cache holds, as a captured CUDA graph needs (``real.nn.blocks.compiled`` with
    static shapes). Same visibility, so the same attention up to the rounding of a longer masked reduction; more
    work per forward (every slot is read)."""
    _STATIC.append(bool(on))
    try:
        yield
    finally:
        _STATIC.pop()


def row_counts(n, rows: int, name: str = "n") -> np.ndarray:
    """An int or a length-``rows`` sequence of non-negative ints -> int64 array (rows,)."""
    if type(n) is int and n >= 0:           # the common call (the engine's tree rollbacks): no array checks
        return np.full(rows, n, np.int64)
    a = np.asarray(n)
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must be an int or an integer array of {rows} rows, got {n!r}")
    a = np.broadcast_to(a.astype(np.int64), (rows,)) if a.ndim == 0 else a.astype(np.int64)
    if a.shape != (rows,):
        raise ValueError(f"{name} must be an int or have shape ({rows},), got shape {a.shape}")
    if (a < 0).any():
        raise ValueError(f"{name} must be >= 0, got {a.tolist()}")
    return a


def common_len(lens: np.ndarray) -> int:
    """lens (R,) int64 -> the one length when all R rows hold the same number of entries
    (the protocol's ``cache_len``); ValueError otherwise."""
    if lens.min() != lens.max():
        raise ValueError(f"rows hold different numbers of entries {lens.tolist()}: use cache_lens")
    return int(lens[0])


class CachedRows:
    """The cache half of the batched protocol (``real.protocol.BatchedTarget``) for a model that keeps its per-row
    entries in a ``KVCache`` at ``self.cache`` (None before the first ``prefill`` / ``start``): ``cache_len``,
    ``cache_lens``, per-row ``rollback`` and ``keep``. ``cache_floor`` is the number of leading entries a
    rollback may never remove (LlamaGen: its condition prefix); ``_cache_owner`` names the model in errors."""
    batched = True
    cache_floor = 0
    row_masks = True          # KVCache.begin takes (rows, S, K) masks, one per row
    extra_slots = None        # spare entries past the image (None: unbounded); models with a fixed size set theirs

    @property
    def cache_len(self) -> int:
        """Entries per row when every row holds the same number (else use ``cache_lens``)."""
        return common_len(self.cache_lens)

    @property
    def cache_lens(self) -> np.ndarray:
        """(rows,) int64 entries in each row's cache, prefix included (a copy)."""
        return np.zeros(1, np.int64) if self.cache is None else self.cache.lens.copy()

    def rollback(self, n) -> None:
        """Drop the last n[r] entries of row r (n: int, or (rows,) one count per row), never below ``cache_floor``."""
        self._need_cache().rollback(n, floor=self.cache_floor)

    def keep(self, indices, counts=None) -> None:
        """Keep the last block's entries ``indices`` ((k,) shared or (rows, k) per row; block-relative, in order), the
        first ``counts[r]`` ((rows,), default k) in row r (``KVCache.keep``)."""
        self._need_cache().keep(indices, counts)

    def _need_cache(self) -> "KVCache":
        if self.cache is None:
            raise ValueError(f"{type(self).__name__} has no cache yet: call prefill(cond) (a drafter: "
                             "start(prefix_len, batch)) first")
        return self.cache


class PromptRows(CachedRows):
    """``CachedRows`` of a model whose rows start with its left-padded prompt, ``_P`` entries per row (FastLlama, the
    batched image families): the prompt is what a rollback never removes."""
    _P = 0

    @property
    def cache_floor(self) -> int:
        """Cache entries a rollback never removes: the prompt, padding included."""
        return self._P

    @property
    def prefix_len(self) -> int:
        """Prompt entries per row (padding included; 1 before any prefill)."""
        return max(self._P, 1)


class CacheIndex:
    """The per-row bookkeeping of a KV cache, whatever stores the entries (module docstring): lengths, the last block's
    start, hidden prefix entries, the block masks. ``KVCache`` adds our static storage; the transformers adapter keeps
    ``DynamicCache`` storage and this index (``real.adapters.hf``). ``max_len`` None: unbounded."""

    def __init__(self, rows: int, device, max_len: int | None = None):
        """``rows`` empty rows on ``device`` (where the masks are built)."""
        self.lens = np.zeros(rows, dtype=np.int64)
        self.block_start = np.zeros(rows, dtype=np.int64)
        self.device = torch.device(device)
        self._max_len = max_len
        self._S = 0
        self._slots: torch.Tensor | None = None
        self._start: int | None = None      # common block start when every row has the same length
        self._K = 0
        self.visible: torch.Tensor | None = None   # (R, P) bool prefix visibility (``hide_prefix``), None: all

    storage_static = False      # whether ``static_keys`` applies: storages that return every slot (``KVCache``)

    @property
    def rows(self) -> int:
        """Rows (R) of the cache."""
        return int(self.lens.shape[0])

    @property
    def max_len(self) -> int | None:
        """Entry slots per row (None: unbounded)."""
        return self._max_len

    @property
    def pad(self) -> np.ndarray:
        """(R,) hidden entries at the start of each row (left padding), 0 without ``hide_prefix``."""
        if self.visible is None:
            return np.zeros(self.rows, np.int64)
        return (~self.visible).sum(1).cpu().numpy().astype(np.int64)

    def writable(self) -> None:
        """Storage hook before a write (``KVCache``: inference-mode buffers copied once)."""

    def reset(self) -> None:
        """Empty every row (the buffers are kept for reuse); every entry visible again."""
        self.lens[:] = 0
        self.block_start[:] = 0
        self._S = 0
        self.visible = None

    def hide_prefix(self, visible: torch.Tensor | None) -> None:
        """Mark the first P entries of each row visible (True) or hidden (False, padding): ``visible`` (R, P) bool (a
        tensor, or numpy: then no read-back), or None when every entry is visible (the common case: no extra mask)."""
        if visible is not None and (visible.ndim != 2 or visible.shape[0] != self.rows):
            raise ValueError(f"hide_prefix: visible must be ({self.rows}, P) bool, got {tuple(visible.shape)}")
        if isinstance(visible, np.ndarray):          # host data: decided on the host, sent without a sync
            self.visible = None if visible.all() else to_device(visible, self.device, torch.bool)
            return
        self.visible = None if visible is None or bool(visible.all()) else visible.to(self.device, torch.bool)

    def begin(self, S: int, attn_mask: torch.Tensor | None = None) -> torch.Tensor | None:
        """Prepare a block of S entries per row (``_begin``), with hidden prefix entries masked (``hide_prefix``)."""
        m = self._begin(S, attn_mask)
        return m if self.visible is None else self._hidden_prefix(m, S)

    def _hidden_prefix(self, m: torch.Tensor | None, S: int) -> torch.Tensor:
        """The (R, 1, S, K) block mask with the hidden prefix columns masked, except a hidden entry from itself."""
        dev = self.device
        K = self._K
        m = torch.ones(self.rows, 1, S, K, dtype=torch.bool, device=dev) if m is None else \
            m.expand(self.rows, -1, -1, -1).clone()
        P = self.visible.shape[1]
        m[:, 0, :, :P] &= self.visible[:, None, :]
        if int(self.lens.min()) < P:                    # the block writes prefix entries: they see themselves
            q = self._on_device(self.lens)[:, None] + torch.arange(S, device=dev)
            r, s = torch.nonzero(q < P, as_tuple=True)
            m[r, 0, s, q[r, s]] = True
        return m

    def _begin(self, S: int, attn_mask: torch.Tensor | None = None) -> torch.Tensor | None:
        """Prepare a block of S entries per row; returns the (R, 1, S, K) bool attention mask ((1, 1, S, K) when
        every row holds the same number of entries; None: all visible). ``attn_mask`` (S, Kb) bool, or (R, S, Kb)
        one per row, S <= Kb <= min(lens) + S, replaces the causal mask over the block and the last Kb - S cached
        entries of every row (tree levels); older entries stay visible."""
        lo, dev = int(self.lens.min()), self.device
        if attn_mask is not None:
            attn_mask = check_attn_mask(attn_mask, S, lo, dev, rows=self.rows)
        self.reserve(S)
        K = self._K
        if self._start is not None:                   # every row at the same length: one (1, 1, S, K) mask for all rows
            if attn_mask is None:
                return None if S == 1 else torch.ones(S, K, dtype=torch.bool, device=dev).tril_(K - S)[None, None]
            # older entries visible: the mask padded on the left with True (one kernel; (R, S, Kb): one per row)
            full = F.pad(attn_mask, (K - attn_mask.shape[-1], 0), value=True)
            return full[:, None] if attn_mask.ndim == 3 else full[None, None]
        rel = torch.arange(K, device=dev)[None, :] - self._slots[:, :1]       # (R, K) column - block start
        if attn_mask is None:                                                 # causal over the block
            vis = rel[:, None, :] <= torch.arange(S, device=dev)[None, :, None]
        else:
            Kb = attn_mask.shape[-1]
            inb = (rel >= S - Kb) & (rel < S)
            col = (rel + Kb - S).clamp(0, Kb - 1)                                 # (R, K) block column
            if attn_mask.ndim == 3:
                g = attn_mask.gather(2, col[:, None, :].expand(-1, S, -1))        # (R, S, K)
            else:
                g = attn_mask[:, col].permute(1, 0, 2)                            # (R, S, K)
            vis = torch.where(inb[:, None, :], g, (rel < S - Kb)[:, None, :])
        return vis[:, None]

    def reserve(self, S: int) -> None:
        """The bookkeeping half of ``begin`` for a storage whose caller builds the block's mask itself
        (``real.adapters.batched_imagelm``): the slots ``update`` writes (each row's lens[r] + [0, S)) and the key
        count K = max(lens) + S (``max_len`` within ``static_keys``); ValueError when a row would overflow
        ``max_len``."""
        self.writable()
        lo, hi = int(self.lens.min()), int(self.lens.max())
        if self.max_len is not None and hi + S > self.max_len:
            raise ValueError(f"KV cache full: a row holds {hi} entries, {S} more exceed the {self.max_len} slots")
        static = bool(_STATIC and _STATIC[-1]) and self.max_len is not None and self.storage_static
        # every row at one length: one block start and one mask for all rows; not with static keys, where each row's
        # mask must hide the slots it does not hold (the per-row form)
        shared = lo == hi and not static
        self._S, self._K = S, self.max_len if static else hi + S
        self._start = lo if shared else None
        self._slots = None if shared else \
            self._on_device(self.lens)[:, None] + torch.arange(S, device=self.device)          # (R, S)

    def _on_device(self, a: np.ndarray) -> torch.Tensor:
        """Host bookkeeping (lengths, slots) on the cache's device: a non-blocking copy on the device path
        (``real.nn.devpath.to_device``)."""
        return to_device(a, self.device)

    def advance(self, S: int) -> None:
        """A block of S entries per row appended by a storage that builds its own masks (transformers' caches):
        ``begin`` without the mask, then ``commit``."""
        self._S = int(S)
        self.commit()

    def commit(self) -> None:
        """End the block ``begin`` prepared: each row's length grows by its S entries; the block starts are kept
        for ``keep`` and ``rollback``."""
        self.block_start = self.lens.copy()
        self.lens = self.lens + self._S

    def rollback(self, n, floor: int = 0) -> None:
        """Drop the last n[r] entries of row r (n: int or (R,)); never below ``floor`` entries (the prefix)."""
        n = row_counts(n, self.rows)
        if (n > self.lens - floor).any():
            raise ValueError(f"rollback({n.tolist()}): rows hold {(self.lens - floor).tolist()} removable entries")
        self.lens = self.lens - n
        self.block_start = np.minimum(self.block_start, self.lens)

    def keep(self, indices, counts=None) -> None:
        """Keep entries ``indices`` ((k,) shared or (R, k) per row; block-relative, in order) of the last
        block, the first ``counts[r]`` (default k) in row r; the rest of the block is dropped. The storage moves
        the kept entries (``move``: the slots (R, k) to copy to each row's block start, or nothing when they are in
        place)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim == 1:
            idx = np.broadcast_to(idx, (self.rows, idx.shape[0]))
        if idx.ndim != 2 or idx.shape[0] != self.rows:
            raise ValueError(f"keep: indices must be (k,) or ({self.rows}, k), got shape {idx.shape}")
        k = idx.shape[1]
        counts = row_counts(k if counts is None else counts, self.rows, "counts")
        span = self.lens - self.block_start
        used = np.arange(k)[None, :] < counts[:, None]
        if (counts > k).any() or (used & ((idx < 0) | (idx >= span[:, None]))).any():
            raise ValueError(f"keep: indices must lie in [0, block length {span.tolist()}) and counts <= {k}")
        if k and not (np.where(used, idx, np.arange(k)) == np.arange(k)).all():   # else: already in place
            self.move(self.block_start[:, None] + np.where(used, idx, 0))          # (R, k) slots to keep
        self.lens = self.block_start + counts

    def move(self, src: np.ndarray) -> None:
        """Storage: copy the entries at slots ``src`` (R, k) to slots block_start[r] + [0, k) of each row (every
        layer). The index alone stores nothing (a model with its own storage overrides this)."""


class KVCache(CacheIndex):
    """Static per-row KV cache of ``n_layers`` attention layers (module docstring): a ``CacheIndex`` over one
    preallocated tensor."""
    storage_static = True

    def __init__(self, n_layers: int, rows: int, n_kv: int, max_len: int, head_dim: int, *, dtype, device):
        """``n_layers`` layers of keys and values, each (rows, n_kv, max_len, head_dim) zeros of ``dtype`` on
        ``device``; every row starts empty."""
        super().__init__(rows, device, max_len)
        # one tensor (2 n_layers, rows, n_kv, max_len, head_dim): ``keep`` moves every layer's entries at once
        self.kv = torch.zeros((2 * n_layers, rows, n_kv, max_len, head_dim), dtype=dtype, device=device)
        self.k = [self.kv[2 * i] for i in range(n_layers)]         # views
        self.v = [self.kv[2 * i + 1] for i in range(n_layers)]

    def fits(self, n_layers: int, rows: int, max_len: int, dtype, device) -> bool:
        """Whether this cache can be reused (reset) for a new generation of that shape."""
        k = self.k[0]
        return (len(self.k) == n_layers and k.shape[0] == rows and k.shape[2] >= max_len and k.dtype == dtype
                and k.device == torch.device(device) and not stale_inference(self.kv))

    def writable(self) -> None:
        """Buffers made inside ``torch.inference_mode`` (``engine.generate``) and written outside it (a caller
        continuing a generation's cache) are copied once into ordinary tensors: inference tensors take no in-place
        writes outside that mode."""
        if stale_inference(self.kv):
            self.kv = self.kv.clone()
            self.k = [self.kv[2 * i] for i in range(len(self.k))]
            self.v = [self.kv[2 * i + 1] for i in range(len(self.v))]

    def update(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write layer i's block k, v (R, n_kv, S, hd); return the layer's keys and values (R, n_kv, K, hd)."""
        kc, vc = self.k[i], self.v[i]
        if self._start is not None:
            s = self._start
            kc[:, :, s:s + self._S] = k
            vc[:, :, s:s + self._S] = v
        else:
            idx = self._slots[:, None, :, None].expand(-1, kc.shape[1], -1, kc.shape[3])
            kc.scatter_(2, idx, k.to(kc.dtype))
            vc.scatter_(2, idx, v.to(vc.dtype))
        return kc[:, :, :self._K], vc[:, :, :self._K]

    def move(self, src: np.ndarray) -> None:
        """Copy the entries at slots ``src`` (R, k) to slots block_start[r] + [0, k) of each row, in every layer."""
        self.writable()
        dev = self.kv.device
        k = src.shape[1]
        s0 = int(self.block_start[0])
        if (src == src[0]).all() and (self.block_start == s0).all():   # every row keeps the same slots (CFG)
            self.kv[:, :, :, s0:s0 + k] = self.kv.index_select(3, self._on_device(src[0]))
        else:          # per row: (R, slots, 2 layers, heads, hd) view; the gather is a copy, so overlaps are safe
            v = self.kv.permute(1, 3, 0, 2, 4)
            r = torch.arange(self.rows, device=dev)[:, None]
            both = self._on_device(np.concatenate([self.block_start[:, None] + np.arange(k), src], 1))   # one copy
            v[r, both[:, :k]] = v[r, both[:, k:]]
