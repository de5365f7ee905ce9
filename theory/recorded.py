"""Predict any verifier's trade-off from rounds recorded under another one (section 8, T10-T11).

Drafts are drawn from Q whatever the verifier, and the target's verification pass computes
P(.|h_{i-1}) at every drafted position. So the rows recorded along the drafted path of one run give,
for every other rule r, per-round unbiased estimates (given the round's prefix) of

  accepted drafts  sum_{i<=L} prod_{j<=i} f^r_j(x~_j)                    (T10)
  bound term       sum_{i<=L} prod_{j<i}  f^r_j(x~_j) D^r_i(h_{i-1})      (T11)

Array-API code: numpy, torch or JAX rows.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat

from ._xp import Array, gather, namespace


class RoundPrediction(NamedTuple):
    accepted: Array  # (R,) T10 estimate of the accepted drafts per round
    bound: Array     # (R,) T11 estimate of the per-round TV-bound term
    f: Array         # (R, L) acceptance probabilities of the recorded drafts under the rule


def predict_rounds(p: Array, q: Array, drafts: Array, verifier, n_drafted: Array | None = None) -> RoundPrediction:
    """T10 and T11 per recorded round.

    p (R, L+1, V) processed target rows along the drafted path, q (R, L, V) draft rows the drafts were
    sampled from, drafts (R, L) tokens. Rounds that drafted fewer tokens (the end of an image) are
    padded to L and flagged by ``n_drafted`` (R,) ints; positions i > n_drafted contribute nothing.
    The discrepancy D_i uses the rule's effective resampling law (``resample(..., rejected=None)``).
    """
    xp = namespace(p, q)
    R, L = drafts.shape[0], drafts.shape[-1]
    if p.shape[:2] != (R, L + 1) or q.shape[:2] != (R, L) or p.shape[-1] != q.shape[-1]:
        raise ValueError(f"predict_rounds: expected p (R, L+1, V), q (R, L, V), drafts (R, L); got p {tuple(p.shape)}, "
                         f"q {tuple(q.shape)}, drafts {tuple(drafts.shape)}")
    dev = array_api_compat.device(p)
    pos = xp.arange(1, L + 1, device=dev)
    pp = p[:, :L, :]
    f = verifier.accept(pp, q, pos)                                     # (R, L, V)
    G = verifier.resample(pp, q, f)                                     # effective law (R, L, V)
    A = q * f
    beta = xp.sum(A, axis=-1, keepdims=True)
    D = 0.5 * xp.sum(xp.abs(A + (1 - beta) * G - pp), axis=-1)          # (R, L)  T3
    f_tok = gather(f, xp.astype(drafts, xp.int64), xp)                  # (R, L)
    if n_drafted is not None:
        live = xp.astype(pos[None, :] <= xp.asarray(n_drafted, device=dev)[:, None], p.dtype)
    else:
        live = xp.ones_like(f_tok)
    acc = xp.cumulative_prod(f_tok, axis=-1)                            # prod_{j<=i} f_j
    before = xp.concat([xp.ones_like(acc[:, :1]), acc[:, :-1]], axis=-1)  # prod_{j<i} f_j
    return RoundPrediction(xp.sum(live * acc, axis=-1), xp.sum(live * before * D, axis=-1), f_tok)
