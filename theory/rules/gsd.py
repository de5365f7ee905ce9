"""GSD, Grouped Speculative Decoding (So et al., ICCV 2025, arXiv 2508.07747; docs/theory.md section 6b):
the group acceptance and its embedding-closeness table.

Array-API code (numpy, JAX, torch). Shapes: rows p, q (..., V); embeddings (V, d); the closeness table
``close`` (V, V) bool; f (..., V).

Facts from the release (junhyukso/GSD at commit 4216c7c2bd5d04be12410adb07143af4cd7f7b88, the grouped
acceptance inside ``SpeculativeSampler.__call__`` of ``scheduler/jacobi_iteration_lumina_mgpt.py``; the
Jacobi loop that calls it in the same file; ``test_GSD.py`` for the settings), re-implemented here:

* what is verified: each drafted token x of the Jacobi window, against the target row p of its position
  (the target's processed probabilities: guidance and the image top-k, 2000 in ``test_GSD.py``, applied)
  and q = the probability row the draft was sampled from, which the loop carries from the previous Jacobi
  iteration (the target's rows there; a one-hot row for a freshly initialised random token). The rule is
  the same at every position of the window (no per-position parameter);
* the candidate window: the vocabulary sorted by the target's (processed) logits in *ascending* order; if
  x sits at sorted position r, the candidates are the sorted positions [r - 7, r + 7) -- six tokens ranked
  just above x, x itself and seven just below (fewer at the top of the ranking). The slice follows
  Python's rules: for r < 7 the start is negative and wraps to V + r - 7, which for V >= 14 leaves the
  slice empty; an empty window raises inside the release's try block and the release falls back to the
  vanilla ratio min(1, p(x)/q(x)). The release sorts with ``advanced_logits.sort(dim=-1)`` (torch.sort,
  stable=False), which leaves the order of equal logits unspecified, and it has many: every top-k-removed
  token sits at -inf. Here ties are broken by token index (a stable sort of p, which orders as the logits
  do, softmax being increasing). This is our reading of "as released": the release's order among ties is an
  accident of the sort kernel (its GPU runs and a CPU replay order them differently, and neither is
  documented), so no order is more faithful than another, and index order is deterministic and the same on
  numpy, JAX and torch. It matters only for a drafted token tied with others, in practice one of zero target
  mass. The smallest case (tests/test_gsd_release.py): V = 20, p = 0.05 / 0.15 / 0.80 on tokens 17-19, q =
  0.1 / 0.9 on tokens 16 and 18, token 16 drafted. Index order puts 16 at r = 16, its group is tokens 9..17,
  and f = 0.05 / 0.1 = 0.5. torch's CPU sort puts 16 at position 1 of the ascending order, its slice is empty,
  and the release falls back to vanilla: f = 0. An independent replay found 97 of 363 drafted tokens on top-k
  rows with another f, by up to 1.0;
* the group G(x): the candidates y with |p(y) - p(x)| < 0.15 (strict) and squared Euclidean distance
  ||e_y - e_x||^2 < 0.5 (strict) between embedding vectors. The release's vectors are the rows of the
  target LM's *input embedding table* (the first 10000 token ids, which hold Lumina-mGPT's image tokens
  4..8195), computed once per image as |a|^2 + |b|^2 - 2 a.b in the model's dtype (bf16), not l2-normalised.
  ``real.decode.methods.gsd_vectors`` passes that table by default (``--gsd-table embedding``: the target's
  input embedding rows of the image tokens, cast to bf16) and the raw VQ codebook in float64 under
  ``--gsd-table codebook`` (our earlier table; on the MNIST target the embedding table gives 12.4 close
  tokens per token, the codebook 36.0); the distance test is
  skipped for a window that holds a token id above 10000 (non-image ids, at -inf after the image top-k).
  Here every token is an image code and has a vector (the caller's ``embeddings``: the target's input
  embeddings as released, or the VQ codebook), so the test applies to the whole window;
* acceptance: accept x with probability min(1, sum_{G(x)} p / sum_{G(x)} q) (both rows summed over the
  same group; x is in its own group whenever its window is not empty);
* after a rejection: one token from Norm([p - q]_+), the vanilla residual of the drafted position's rows
  (the top-k warper applied to its log is a no-op there: [p - q]_+ lives on p's support). It does not
  depend on the rejected token, and no group enters it.

``gsd_close`` builds the closeness table; ``Grouped`` is the acceptance rule. ``theory.rules.gsd`` pairs it
with the release's residual or with G* (T5).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import array_api_compat

from ..core.xp import Array, gather, namespace, ratio_min1

__all__ = ["Grouped", "gsd_close", "GSD_WINDOW", "GSD_P_THRESHOLD", "GSD_D_THRESHOLD"]

# the release's constants (scheduler/jacobi_iteration_lumina_mgpt.py): sorted positions [r - 7, r + 7),
# |p(y) - p(x)| < 0.15, squared embedding distance < 0.5
GSD_WINDOW = 7
GSD_P_THRESHOLD = 0.15
GSD_D_THRESHOLD = 0.5

_CHUNK = 1024   # rows of the (V, V) distance computation held at once


def gsd_close(embeddings, d_threshold: float = GSD_D_THRESHOLD) -> Array:
    """(V, V) bool: squared Euclidean distance ||e_x - e_y||^2 < d_threshold between embedding rows (V, d).

    As released: raw vectors (no normalisation), |a|^2 + |b|^2 - 2 a.b, computed in the vectors' dtype
    (numpy input is upcast to float64); the diagonal is set True (distance exactly 0: x is close to itself,
    whatever the expansion's round-off). numpy, torch or JAX in, the same out (on the same device).
    """
    if isinstance(embeddings, (list, tuple)):
        import numpy as np

        embeddings = np.asarray(embeddings, dtype=np.float64)
    if not hasattr(embeddings, "shape") or len(embeddings.shape) != 2 or 0 in tuple(embeddings.shape):
        raise ValueError(f"embeddings must be a non-empty (V, d) array, got "
                         f"{getattr(embeddings, 'shape', type(embeddings).__name__)}")
    if not (isinstance(d_threshold, (int, float)) and not isinstance(d_threshold, bool)
            and math.isfinite(d_threshold) and d_threshold > 0):
        raise ValueError(f"d_threshold must be a finite number > 0, got {d_threshold!r}")
    xp = namespace(embeddings)
    E = embeddings
    if not xp.isdtype(E.dtype, "real floating"):
        E = xp.astype(E, xp.float64)
    elif array_api_compat.is_numpy_array(E):
        E = xp.astype(E, xp.float64)
    if not bool(xp.all(xp.isfinite(E))):
        raise ValueError("embeddings contain NaN or infinite entries")
    V = E.shape[0]
    dev = array_api_compat.device(E)
    sq = xp.sum(E * E, axis=1)
    ET = xp.matrix_transpose(E)
    ar = xp.arange(V, device=dev)
    rows = []
    for a in range(0, V, _CHUNK):   # a loop over row blocks of the (V, V) table (memory), not over tokens
        b = min(a + _CHUNK, V)
        d2 = sq[a:b, None] + sq[None, :] - 2 * (E[a:b] @ ET)
        rows.append((d2 < d_threshold) | (ar[a:b, None] == ar[None, :]))
    return xp.concat(rows, axis=0)


def _check_close(close) -> None:
    if not hasattr(close, "shape") or len(close.shape) != 2 or close.shape[0] != close.shape[1] or close.shape[0] == 0:
        raise ValueError(f"close must be a (V, V) bool table (gsd_close), got "
                         f"{getattr(close, 'shape', type(close).__name__)}")
    if namespace(close).bool != close.dtype:
        raise ValueError(f"close must be a bool table (gsd_close), got dtype {close.dtype}")


@dataclass(frozen=True, eq=False)
class Grouped:
    """GSD's group acceptance (section 6b; the release's rule, see the module docstring).

    f(x) = min(1, P(G(x)) / Q(G(x))), G(x) = the tokens y at ascending-sorted positions [r(x) - window,
    r(x) + window) of p (Python slice rules; ties by index) with |p(y) - p(x)| < p_threshold and, when
    ``close`` (V, V) bool (``gsd_close``) is given, close[x, y]. An empty window gives the vanilla
    min(1, p(x)/q(x)), as the release's fallback; a group of zero q-mass (possible only when a wrapped
    window misses x) gives 1 if its p-mass is positive, else 0 (the release's inf / NaN ratio).
    ``close=None``: no distance test. Where q(x) = 0, f(x) = 1 (the module convention of ``theory.rules``).
    """
    close: Any = None
    window: int = GSD_WINDOW
    p_threshold: float = GSD_P_THRESHOLD

    def __post_init__(self):
        if not (isinstance(self.window, int) and not isinstance(self.window, bool) and self.window >= 0):
            raise ValueError(f"Grouped: window must be an int >= 0, got {self.window!r}")
        if not (isinstance(self.p_threshold, (int, float)) and not isinstance(self.p_threshold, bool)
                and math.isfinite(self.p_threshold) and self.p_threshold > 0):
            raise ValueError(f"Grouped: p_threshold must be a finite number > 0, got {self.p_threshold!r}")
        if self.close is not None:
            _check_close(self.close)

    def effective_window(self, V: int) -> int:
        """The window on a vocabulary of V tokens: ``window`` capped at 2V, from where every slice is [0, V)."""
        return min(self.window, 2 * int(V))

    def _window(self, r: Array, V: int, xp, dev):
        """For sorted positions r (..., m): the window's sorted positions (..., m, 2w) clipped into [0, V), whether
        each is in the slice [a(r), b(r)) (..., m, 2w), and whether the slice is empty (..., m). A window of 2V or
        more is the whole vocabulary for every r (a = 0, b = V), so w is capped there: the same groups, bounded
        memory."""
        w = self.effective_window(V)
        a = r - w
        a = xp.where(a < 0, a + V, a)            # Python's negative slice start ...
        a = xp.where(a < 0, xp.zeros_like(a), a)  # ... clamped at 0
        b = xp.where(r + w > V, xp.full_like(r, V), r + w)
        pos = a[..., None] + xp.arange(2 * w, device=dev)
        valid = pos < b[..., None]
        return xp.where(valid, pos, xp.zeros_like(pos)), valid, b <= a

    def _group(self, p: Array, s: Array, r: Array, x: Array):
        """The groups of tokens x (..., m) at sorted positions r (..., m) of rows p (..., V) sorted by s (..., V):
        (members (..., m, 2w) token ids, mask (..., m, 2w) bool G(x), empty (..., m) the empty windows)."""
        xp = namespace(p)
        V = p.shape[-1]
        dev = array_api_compat.device(p)
        if self.close is not None and self.close.shape[0] != V:
            raise ValueError(f"GSD: the closeness table has {self.close.shape[0]} codes, rows p have V={V}")
        pos, valid, empty = self._window(r, V, xp, dev)
        if isinstance(s, tuple):       # the tokens at the window's positions, selected without the sort (``_near``)
            members = s[0]
            shape = members.shape
        else:
            shape = (*s.shape[:-1], *pos.shape[-2:])
            pos = xp.broadcast_to(pos, shape)
            members = xp.reshape(xp.take_along_axis(s, xp.reshape(pos, (*shape[:-2], shape[-2] * shape[-1])), axis=-1),
                                 shape)
        px = xp.take_along_axis(p, x, axis=-1)
        mask = valid & (xp.abs(_take_tokens(p, members, xp) - px[..., None]) < self.p_threshold)
        if self.close is not None:
            C = xp.reshape(xp.asarray(self.close, device=dev), (-1,))
            idx = x[..., None] * V + members
            mask = mask & xp.reshape(xp.take(C, xp.reshape(idx, (-1,)), axis=0), shape)
        return members, mask, empty

    def group_mask(self, p: Array) -> tuple[Array, Array, Array, Array]:
        """The groups in sorted order: (s, members, mask, empty) with s (..., V) the ascending order of p,
        members (..., V, 2w) the window's tokens of the token at each sorted position, mask (..., V, 2w)
        bool the group G, empty (..., V) the empty windows."""
        xp = namespace(p)
        s = xp.argsort(p, axis=-1, stable=True)
        return (s, *self._group(p, s, xp.arange(p.shape[-1], device=array_api_compat.device(p)), s))

    def _f(self, p, q, s, r, x):
        """f at tokens x (..., m) sitting at sorted positions r (..., m): the one formula of the dense rows and the
        drafted tokens."""
        xp = namespace(p, q)
        members, mask, empty = self._group(p, s, r, x)
        zero = xp.zeros(mask.shape, dtype=p.dtype, device=array_api_compat.device(p))
        pm = _take_tokens(p, members, xp)         # the group members' target and draft masses
        qm = _take_tokens(q, members, xp)
        num = xp.sum(xp.where(mask, pm, zero), axis=-1)
        den = xp.sum(xp.where(mask, qm, zero), axis=-1)
        ones = xp.ones_like(num)
        ratio = ratio_min1(num, den, xp)          # min(1, num / den) where den > 0 (no overflow on a tiny den)
        fs = xp.where(den > 0, ratio, xp.where(num > 0, ones, xp.zeros_like(num)))
        px, qx = xp.take_along_axis(p, x, axis=-1), xp.take_along_axis(q, x, axis=-1)
        fs = xp.where(empty, ratio_min1(px, qx, xp), fs)
        return xp.where(qx > 0, fs, ones)

    def __call__(self, p, q, i):
        xp = namespace(p, q)
        if self.window == 0:      # every window is empty: the release's fallback, vanilla
            return ratio_min1(p, q, xp)
        s = xp.argsort(p, axis=-1, stable=True)
        r = xp.arange(p.shape[-1], device=array_api_compat.device(p))
        fs = self._f(p, q, s, r, s)
        rank = xp.argsort(s, axis=-1)             # inverse permutation: token x -> its sorted position
        return xp.take_along_axis(fs, rank, axis=-1)

    def at(self, p, q, i, x):
        """f(x) (...,) at tokens x (...,): the sort of p, x's rank in it (a count: O(V)) and x's window only."""
        xp = namespace(p, q)
        x = xp.astype(x, xp.int64)
        if self.window == 0:
            return ratio_min1(gather(p, x, xp), gather(q, x, xp), xp)
        p, q = xp.broadcast_arrays(p, q)
        near = _near(p, x, self.effective_window(p.shape[-1]))
        if near is not None:
            r, members = near
            return self._f(p, q, (members[..., None, :],), r[..., None], x[..., None])[..., 0]
        s = xp.argsort(p, axis=-1, stable=True)
        px = gather(p, x, xp)[..., None]
        ar = xp.arange(p.shape[-1], device=array_api_compat.device(p))
        below = (p < px) | ((p == px) & (ar < x[..., None]))    # the tokens a stable ascending sort puts before x
        r = xp.sum(xp.astype(below, xp.int64), axis=-1)
        return self._f(p, q, s, r[..., None], x[..., None])[..., 0]


def _near(p, x, w: int):
    """x's sorted position r (...,) in the stable ascending order of rows p (..., V) and the tokens at positions
    r - w .. r + w - 1 (..., 2w) (0 past the last position), selected without sorting the row: the w largest below x
    and the w - 1 smallest above it by the key (p, token) (the stable sort's order: a float32 mass's bits then the
    token id, one uint64), each set by a partition and a sort of its 2w entries. numpy float32 rows of non-negative
    masses with V > 2w only (None otherwise: the caller sorts): there r < w leaves the window empty (the release's
    wrapped slice) and positions past V are invalid, so ``_group`` reads the members only where they are r's window.
    O(V) per row instead of the sort's O(V log V); the same tokens in the same slots, hence the same sums."""
    import numpy as np

    V = p.shape[-1]
    if not (isinstance(p, np.ndarray) and p.dtype == np.float32 and V > 2 * w and w >= 1) or not bool((p >= 0).all()):
        return None
    key = ((p + np.float32(0)).view(np.uint32).astype(np.uint64) << np.uint64(32)) | np.arange(V, dtype=np.uint64)
    kx = np.take_along_axis(key, x[..., None], axis=-1)                          # (..., 1); +0 folds -0 into 0
    below = key < kx
    r = np.sum(below, axis=-1, dtype=np.int64)
    lo = np.sort(np.partition(np.where(below, key, np.uint64(0)), V - w, axis=-1)[..., V - w:], axis=-1)
    top = np.iinfo(np.uint64).max
    hi = np.sort(np.partition(np.where(key > kx, key, np.uint64(top)), w - 1, axis=-1)[..., :w], axis=-1)[..., :w - 1]
    keys = np.concatenate([lo, kx, hi], axis=-1)
    members = np.where(keys == top, np.uint64(0), keys & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return r, members


def _take_tokens(row: Array, members: Array, xp) -> Array:
    """row[..., members[..., r, k]] (..., V, 2w) for rows (..., V) and token ids (..., V, 2w); the leading dims
    broadcast (the likelihood shares one p row (n, 1, V) across the L offsets' q rows (n, L, V))."""
    shape = members.shape
    flat = xp.reshape(members, (*shape[:-2], shape[-2] * shape[-1]))
    out = xp.take_along_axis(row, flat, axis=-1)
    return xp.reshape(out, (*out.shape[:-1], shape[-2], shape[-1]))
