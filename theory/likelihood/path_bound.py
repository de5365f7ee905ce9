"""The whole-image TV bound from an image's own path: teacher-forced rows and the realised round offsets
(docs/theory.md section 11, "The bound over a whole image").

By the hybrid argument, TV(P^, P) <= E_{x ~ P^}[ sum_t D(t) ], where D(t) is the TV between the law of token
t given the sampler's whole history (x_<t and the hidden round offset i) and the target row p_t: at a draft
position (i < L' of its round) that law is q f_{i+1} + (1 - beta) G_{i+1} with the rows (p_t, q_{t,i+1}), so
D(t) = D_{i+1} of T3 (``theory.rules.discrepancy``); the target's own token after L' accepted drafts adds 0.
A generated image records its rounds (L', tau), hence every token's offset, and its teacher-forced rows
(``real.decode.score``) give p_t and q_{t,i+1} on its path: ``image_path_bounds`` is, per image, an unbiased
estimate of that expectation (T11 summed over the image's rounds), without recording any rows during generation.

numpy, float64.
"""
from __future__ import annotations

import numpy as np

from ..rules.discrepancy import discrepancy

__all__ = ["round_offsets", "image_path_bounds"]

CHUNK_ELEMENTS = 1 << 21   # token rows x V per chunk (float64: 16 MiB per temporary)


def round_offsets(round_image, drafted, accepted, n_images: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-token offsets of chain rounds: round r of image round_image[r] (rounds in generation order) drafted
    L' = drafted[r] and accepted tau = accepted[r], emitting tokens n .. n + tau at offsets 0 .. tau.
    Returns offset (n_images, T) int64 (drafts accepted before the token in its round) and drafting
    (n_images, T) bool (offset < L': the token was emitted at a draft position). Every image's rounds must
    cover exactly its T tokens (ValueError otherwise)."""
    img = np.asarray(round_image, np.int64)
    Lp = np.asarray(drafted, np.int64)
    tau = np.asarray(accepted, np.int64)
    if not (img.shape == Lp.shape == tau.shape) or img.ndim != 1:
        raise ValueError("round_offsets: round_image, drafted and accepted must be (R,) arrays of one shape")
    if np.any(tau < 0) or np.any(tau > Lp) or np.any(img < 0) or np.any(img >= n_images):
        raise ValueError("round_offsets: need 0 <= accepted <= drafted and 0 <= round_image < n_images")
    size = tau + 1
    if not np.array_equal(np.bincount(img, weights=size, minlength=n_images), np.full(n_images, T, float)):
        raise ValueError(f"round_offsets: every image's rounds must emit exactly T = {T} tokens")
    order = np.argsort(img, kind="stable")                    # rounds grouped by image, generation order kept
    size_o, Lp_o = size[order], Lp[order]
    off = np.arange(int(size_o.sum())) - np.repeat(np.cumsum(size_o) - size_o, size_o)   # 0 .. tau per round
    offset = off.reshape(n_images, T)
    drafting = (off < np.repeat(Lp_o, size_o)).reshape(n_images, T)
    return offset, drafting


def image_path_bounds(p, q, offset, drafting, verifier, L: int) -> np.ndarray:
    """(B,) float64: sum over each image's draft-position tokens of D_{i+1}(p_t, q_{t,i+1}) (module docstring).
    p (B, T, V) target rows; q (B, T, V) (offset-independent draft) or (B, T, L, V) ([:, t, i] the (i+1)-th
    draft's row); offset, drafting (B, T) from ``round_offsets``; ``verifier`` a chain rule."""
    p = np.asarray(p, np.float64)
    q = np.asarray(q, np.float64)
    offset = np.asarray(offset, np.int64)
    drafting = np.asarray(drafting, bool)
    B, T, V = p.shape
    if offset.shape != (B, T) or drafting.shape != (B, T) or q.shape not in ((B, T, V), (B, T, L, V)):
        raise ValueError(f"image_path_bounds: expected p (B, T, V), q (B, T, V) or (B, T, L={L}, V), offset and "
                         f"drafting (B, T); got {p.shape}, {q.shape}, {offset.shape}, {drafting.shape}")
    if np.any(drafting & (offset >= L)):
        raise ValueError(f"image_path_bounds: a draft-position token has offset >= L = {L}")
    out = np.zeros(B, np.float64)
    step = max(1, CHUNK_ELEMENTS // V)
    for i in range(L):   # a loop over the L draft offsets, each vectorised over the tokens at that offset
        b, t = np.nonzero(drafting & (offset == i))
        for s in range(0, b.size, step):     # chunks of token rows bound the (rows, V) temporaries
            bb, tt = b[s:s + step], t[s:s + step]
            pr = p[bb, tt]
            qr = q[bb, tt, i] if q.ndim == 4 else q[bb, tt]
            f = verifier.accept(pr, qr, i + 1)
            G = verifier.resample(pr, qr, f)
            np.add.at(out, bb, discrepancy(pr, qr, f, G))
    return out
