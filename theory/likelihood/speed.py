"""Predicted tokens per target call from recorded vanilla rounds (docs/theory.md sections 8 and 8c), as
``coolsd demo`` and ``coolsd sweep`` predict it (``coolsd.studies.demo.predict.chain_prediction`` calls the two
functions below), in array-API code so that the exact-law tuner differentiates it (JAX).

* ``survival_by_row(acc, live, start, ...)``: Pr(tau >= i) per image row of the round's start, from per-round T10
  products acc (R, L) = prod_{j <= i} f_j(x~_j) over the recorded drafts (rows with fewer than ``min_count`` live
  rounds at i use the pooled estimate; clipped to [0, 1] and made non-increasing in i);
* ``expected_rounds(S, depth, first_single, T, per_row)``: the renewal recursion over the token positions n = 0..T-1
  (a round started at n drafts L'(n) = min(depth, T - n - 1), none for the first round when ``first_single``: EAGLE
  drafters start with the prefill alone) -> expected rounds (= target calls), draft steps, single target steps and
  tokens per call T / rounds. Leading batch dimensions of S (bootstrap replicates) are carried through.
* ``SpeedModel``: the record's drafted tokens' p and q entries and row features, computed once, so that a family's
  f at the recorded drafts is O(R L) per evaluation; ``tokens_per_call(f)``, ``bootstrap(f)`` (image-bootstrap 95%
  interval).
"""
from __future__ import annotations

import array_api_compat
import numpy as np

from ..core.xp import gather, namespace, ratio_min1
from ..rules import ROW_FEATURES, row_feature

__all__ = ["survival_by_row", "expected_rounds", "SpeedModel", "MIN_COUNT"]

MIN_COUNT = 30      # live rounds an image row needs at position i for its own estimate (else pooled)


def _bucket_sums(acc, live, start, T: int, per_row: int, xp):
    """Per image row b of the round's start: sums (rows, L) of acc * live and counts (rows, L) of live rounds."""
    rows = -(-T // per_row)
    row = xp.minimum(start // per_row, xp.full_like(start, rows - 1))
    al = acc * live
    sums, cnts = [], []
    for b in range(rows):   # image rows (7 for MNIST): masked sums over the rounds
        m = xp.astype(row == b, acc.dtype)[:, None]
        sums.append(xp.sum(al * m, axis=0))
        cnts.append(xp.sum(live * m, axis=0))
    return xp.stack(sums), xp.stack(cnts)


def _survival(sums, cnts, min_count: int, xp):
    """S (..., rows, L) from bucket sums and counts (..., rows, L): own estimate where the count reaches
    ``min_count``, else the pooled one; clipped to [0, 1]; non-increasing in i (a running minimum)."""
    pooled = xp.sum(sums, axis=-2, keepdims=True) / xp.maximum(xp.sum(cnts, axis=-2, keepdims=True), 1.0)
    own = sums / xp.maximum(cnts, 1.0)
    S = xp.where(cnts >= min_count, own, pooled * xp.ones_like(own))
    S = xp.clip(S, 0.0, 1.0)
    cols = [S[..., 0]]
    for i in range(1, S.shape[-1]):     # running minimum over the L positions
        cols.append(xp.minimum(cols[-1], S[..., i]))
    return xp.stack(cols, axis=-1)


def survival_by_row(acc, live, start, min_count: int = MIN_COUNT, T: int = 49, per_row: int = 7, xp=None):
    """Pr(tau >= i) per image row of the round's start (module docstring): acc (R, L) per-round T10 products, live
    (R, L) 1 where position i was drafted, start (R,) ints; images of T tokens in rows of ``per_row``. (rows, L)."""
    xp = xp or namespace(acc)
    live = xp.astype(live, acc.dtype)
    sums, cnts = _bucket_sums(acc, live, start, T, per_row, xp)
    return _survival(sums, cnts, min_count, xp)


def _transitions(S, depth: int, first_single: bool, T: int, per_row: int, xp):
    """The renewal's transition masses G (..., T, depth + 1) on survival curves S (..., rows, L >= depth): a round
    started at position n moves its mass to n + j (j = 1..depth + 1) with G[n, j - 1] = Pr(tau = j - 1) =
    S(j - 1) - S(j) (S(0) = 1, S(i) = S[b(n), i - 1], b(n) the image row of n) for j <= L'(n), and the survival
    S(L'(n)) at j = L'(n) + 1 (every draft accepted), 0 beyond; L'(n) = min(depth, T - n - 1), 0 for n = 0 when
    ``first_single``. Also returns L'(n) (T,) (numpy ints)."""
    n = np.arange(T)
    ell = np.minimum(depth, T - n - 1)
    if first_single and T:
        ell[0] = 0
    b = np.minimum(n // per_row, S.shape[-2] - 1)
    one = xp.ones_like(S[..., :1])
    ext = xp.concat([one, S[..., :depth], 0.0 * one], axis=-1)               # (..., rows, depth + 2)
    eb = xp.take(ext, xp.asarray(b), axis=-2)                                # (..., T, depth + 2)
    j = np.arange(1, depth + 2)
    keep = xp.asarray((j[None, :] <= ell[:, None] + 1).astype(np.float64), dtype=S.dtype)
    drafted = xp.asarray((j[None, :] <= ell[:, None]).astype(np.float64), dtype=S.dtype)
    return keep * (eb[..., :-1] - drafted * eb[..., 1:]), ell


def _masses(G, xp):
    """pi[n] (T, ...): the probability that a round starts at position n (pi[0] = 1), forward over the positions on
    a window of the depth + 2 positions n..n + depth + 1 (a round moves mass at most depth + 1 ahead): each step
    takes m = pi[n] and adds m G[n] to the next ones. Under JAX one ``lax.scan`` (a graph of one step whatever T:
    the unrolled loop compiled T copies, 7 GB at T = 256); elsewhere the same step in a loop."""
    lead = G.shape[:-2]

    def step(w, g):
        m = w[..., :1]
        return xp.concat([w[..., 1:] + m * g, xp.zeros_like(m)], axis=-1), m[..., 0]
    w = xp.concat([xp.ones_like(G[..., 0, :1]), xp.zeros_like(G[..., 0, :])], axis=-1)     # pi[0..depth + 1]
    if array_api_compat.is_jax_namespace(xp):
        from jax import lax

        return lax.scan(step, w, xp.moveaxis(G, -2, 0))[1]
    out = []
    for t in range(G.shape[-2]):      # the positions, in order: mass only moves forward
        w, m = step(w, G[..., t, :])
        out.append(m)
    return xp.stack(out) if out else xp.zeros((0, *lead), dtype=G.dtype)


def expected_rounds(S, depth: int, first_single: bool, T: int = 49, per_row: int = 7, xp=None) -> dict:
    """The renewal recursion over positions (module docstring) on survival curves S (..., rows, L), L >= depth:
    {"rounds", "draft_steps", "single_steps", "tokens_per_call"} (arrays of S's leading shape, or floats).
    rounds = sum_n pi[n], draft steps = sum_n pi[n] L'(n), single steps = sum over L'(n) = 0 (``_transitions``,
    ``_masses``)."""
    xp = xp or namespace(S)
    G, ell = _transitions(S, depth, first_single, T, per_row, xp)
    m = _masses(G, xp)                                                      # (T, ...)
    shape = (T,) + (1,) * (m.ndim - 1)
    lv = xp.asarray(np.reshape(ell.astype(np.float64), shape), dtype=m.dtype)
    sv = xp.asarray(np.reshape((ell == 0).astype(np.float64), shape), dtype=m.dtype)
    rounds = xp.sum(m, axis=0)
    return {"rounds": rounds, "draft_steps": xp.sum(m * lv, axis=0), "single_steps": xp.sum(m * sv, axis=0),
            "tokens_per_call": T / rounds}


class SpeedModel:
    """Tokens per call of any chain rule predicted from a ``StampedRecord`` of vanilla rounds (module docstring).
    ``f`` arrays are the rule's acceptance probabilities of the recorded drafts (R, L) (``f_scaled``, ``f_level``)."""

    def __init__(self, record, min_count: int = MIN_COUNT):
        if not (hasattr(record, "rows") and hasattr(record, "start") and hasattr(record, "per_row")):
            raise TypeError(f"SpeedModel: record must be a StampedRecord (theory.likelihood.arrows.load_record), got "
                            f"{type(record).__name__}")
        r = record.rows
        L = r.L
        d = r.drafts
        pp = r.p[:, :L]
        self.ptok = gather(pp, d, np)                       # p_i(x~_i) (R, L), float64 as recorded
        self.qtok = gather(r.q, d, np)
        self.phi = {k: row_feature(pp, k, np)[..., 0] for k in ROW_FEATURES}     # (R, L) features of the p rows
        self.live = (np.arange(1, L + 1)[None, :] <= r.n_drafted[:, None]).astype(np.float64)
        self.start, self.image = record.start, r.image
        self.T, self.per_row, self.first_single, self.L = record.T, record.per_row, record.first_single, L
        self.min_count = int(min_count)
        self.R = r.R

    def f_scaled(self, w, xp=np):
        """f = min(1, w p/q) at the drafts for weights w (L,) or (R, L) (``rules.Scaled`` / ``RowScaled``)."""
        return ratio_min1(w * xp.asarray(self.ptok), xp.asarray(self.qtok), xp)

    def f_level(self, a, xp=np):
        """f = v + a (1 - v), v = min(1, p/q), at the drafts for levels a (L,) (``rules.Level``)."""
        v = ratio_min1(xp.asarray(self.ptok), xp.asarray(self.qtok), xp)
        return v + a * (1 - v)

    def f_max(self):
        """Every draft with p > 0 accepted (the scaled families' supremum, w -> infinity)."""
        return np.where(self.qtok > 0, (self.ptok > 0).astype(np.float64), 1.0)

    def tokens_per_call(self, f, xp=None):
        """T / expected rounds (``chain_prediction``'s tokens per call) for acceptance probabilities f (R, L)."""
        xp = xp or namespace(f)
        acc = xp.cumulative_prod(f, axis=1)
        S = survival_by_row(acc, xp.asarray(self.live), xp.asarray(self.start), self.min_count, self.T, self.per_row, xp)
        return expected_rounds(S, self.L, self.first_single, self.T, self.per_row, xp)["tokens_per_call"]

    def bootstrap(self, f, n_boot: int = 200, seed: int = 0) -> dict:
        """The prediction and its image-bootstrap 95% percentile interval (recorded images resampled with replacement)
        for acceptance probabilities f (R, L) (numpy)."""
        acc = np.cumprod(np.asarray(f, np.float64), axis=1)
        uniq, inv = np.unique(self.image, return_inverse=True)
        rows = -(-self.T // self.per_row)
        row = np.minimum(self.start // self.per_row, rows - 1)
        sums = np.zeros((uniq.size, rows, self.L))
        cnts = np.zeros_like(sums)
        np.add.at(sums, (inv, row), acc * self.live)
        np.add.at(cnts, (inv, row), self.live)
        k = np.random.default_rng(seed).multinomial(uniq.size, np.full(uniq.size, 1.0 / uniq.size), n_boot).astype(float)
        S = _survival(np.einsum("bj,jrl->brl", k, sums), np.einsum("bj,jrl->brl", k, cnts), self.min_count, np)
        t = expected_rounds(S, self.L, self.first_single, self.T, self.per_row, np)["tokens_per_call"]
        return {"tokens_per_call": float(self.tokens_per_call(np.asarray(f, np.float64))),
                "ci95": np.percentile(t, [2.5, 97.5]).tolist(), "se": float(np.std(t, ddof=1)),
                "n_boot": int(n_boot), "images": int(uniq.size)}

