"""Dynamic draft trees (EAGLE-2; the LANTERN release's default mode), docs/theory.md section 10.

A round grows its tree level by level from the drafter's rows: level 1 = the root's top-k children; at each of
the next ``depth`` levels the k frontier nodes (the beam) each propose their top-k children, and the k best of
those k^2 become the next frontier; every proposed node joins the pool (k + depth k^2 nodes). The tree is the
``total - 1`` best nodes of the pool (plus the root). "Best" is by a key per node:

* ``"release"`` keys: the cumulative draft log-probability sum_{path} log q of the top-k children (deterministic
  candidates, verified with the point-mass draft law ``theory.tree.verify_tree(..., draft_law="point")``: the
  release's ``qx = 1``);
* ``"lossless"`` keys: stochastic beam search (Kool et al. 2019): each child's Gumbel-perturbed log-probability
  truncated at its parent's key (``child_keys``). A node's children are then a draw without replacement from its
  draft row (Gumbel-top-k), keys never increase along a path, and the tree is decided by the keys alone (an
  "upper set" rule), which makes the multi-candidate walk lossless under vanilla verification (section 10).

Ties are broken by pool index (``select_nodes``), which puts every node after its parent, so the selected set is
closed under ancestors. ``guided_children``: lossless children drawn by importance sampling (their order from a
proposal, their keys exactly given the order) for the likelihood estimate of section 11d (T15). Array-API code
(numpy or torch); float64 keys.
"""
from __future__ import annotations

import array_api_compat
import numpy as np

from ..core import checks
from ..core.xp import Array, gather, namespace, normalize, sample_categorical, top_m

__all__ = ["KEYS", "GUIDES", "child_keys", "guided_children", "rank_guide", "select_nodes"]

KEYS = ("lossless", "release")


def _log(q: Array, xp) -> Array:
    """log q with log 0 = -inf (no warning)."""
    pos = q > 0
    return xp.where(pos, xp.log(xp.where(pos, q, xp.ones_like(q))), xp.full_like(q, -float("inf")))


def child_keys(parent_key: Array, parent_logp: Array, q: Array, gumbel: Array, k: int):
    """Stochastic beam search children (section 10): for rows q (..., V) of nodes with keys ``parent_key`` (...,)
    and path log-probabilities ``parent_logp`` (...,), Gumbel(0, 1) noise ``gumbel`` (..., V) -> the k children
    (..., k) int64 with the largest perturbed log-probabilities phi_c = parent_logp + log q(c) + g_c (a draw
    without replacement from q, in draw order), their keys (..., k) float64 and path log-probabilities (..., k).

    Key of child c: -log(exp(-G) - exp(-Z) + exp(-phi_c)) with G the parent's key and Z = max_c phi_c, computed
    stably as G - max(v, 0) - log1p(exp(-|v|)), v = G - phi_c + log(1 - exp(phi_c - Z)) (Kool et al. 2019,
    appendix): the first child's key is exactly G, later ones are smaller; tokens with q = 0 get -inf."""
    xp = namespace(q, gumbel)
    lq = _log(q, xp)
    phi = parent_logp[..., None] + lq + gumbel                                 # (..., V); -inf where q = 0
    top = getattr(phi, "topk", None)
    if top is not None:
        val, idx = phi.topk(k, dim=-1, largest=True, sorted=True)
    else:
        idx = top_m(phi, k, xp)
        val = xp.take_along_axis(phi, idx, axis=-1)
    return idx, _truncate(parent_key, val, xp), parent_logp[..., None] + xp.take_along_axis(lq, idx, axis=-1)


def _truncate(parent_key: Array, val: Array, xp) -> Array:
    """Children's keys from their perturbed log-probabilities val (..., k) (draw order, non-increasing; -inf where
    q = 0) under parents with keys (...,): the stochastic beam's truncation at the parent's key (``child_keys``)."""
    k = val.shape[-1]
    Z = val[..., :1]
    G = parent_key[..., None]
    fin = val > -float("inf")
    first = xp.arange(k, device=array_api_compat.device(val)) == 0
    d = xp.where(fin & ~first, val - Z, xp.full_like(val, -1.0))             # < 0; placeholder at -inf / child 1
    # log(1 - exp(d)) for d <= 0: log(-expm1(d)) near 0, log1p(-exp(d)) below log 2 (-inf at d = 0: the first child)
    small = d > -0.6931471805599453
    l1me = xp.where(small, xp.log(-xp.expm1(xp.where(small, d, xp.full_like(d, -1.0)))),
                    xp.log1p(-xp.exp(xp.where(small, xp.full_like(d, -1.0), d))))
    v = G - xp.where(fin, val, xp.zeros_like(val)) + l1me
    key = G - xp.where(v > 0, v, xp.zeros_like(v)) - xp.log1p(xp.exp(-xp.abs(v)))
    key = xp.where(fin, key, xp.full_like(key, -float("inf")))
    return xp.where(first, xp.broadcast_to(G, key.shape), key)                # the first child's key is G exactly


GUIDES = ("natural", "first", "rejected")   # guided_children's proposals, by their index in ``mode``
GUIDE_DEFENSIVE = 0.25   # the share of q_j in the "rejected" draws (a rule rejects by its own residual, not p)


def rank_guide(qx: Array, px: Array, k: int) -> Array:
    """(..., k) the "first" proposal's law of the rank J at which it drafts the path's token x, from its draft and
    target probabilities qx, px (...,): rank 1 with probability min(1, q(x) / p(x)) (the share of x's target mass
    that vanilla accepts at rank 1: all of it when q(x) >= p(x), where no later rank can accept x), the rest over
    ranks 2..k in proportion to 1 / J."""
    k = checks.integer("rank_guide: k", k, lo=1)
    if not (array_api_compat.is_array_api_obj(qx) and array_api_compat.is_array_api_obj(px)) \
            or tuple(qx.shape) != tuple(px.shape):
        raise ValueError(f"rank_guide: qx and px must be arrays of one shape, got {type(qx).__name__} "
                         f"{tuple(getattr(qx, 'shape', ()))} and {type(px).__name__} {tuple(getattr(px, 'shape', ()))}")
    xp = namespace(qx, px)
    dev = array_api_compat.device(qx)
    r = 1.0 / np.arange(1, k + 1)
    r[0] = 0.0
    tail = xp.asarray(r / max(r.sum(), 1e-300), dtype=xp.float64, device=dev)
    safe = xp.where(px > 0, px, xp.ones_like(px))
    first = xp.where(px > 0, xp.clip(qx / safe, 0.0, 1.0), xp.ones_like(px))
    if k == 1:
        first = xp.ones_like(first)
    e0 = xp.asarray(np.eye(1, k, 0)[0], dtype=xp.float64, device=dev)
    return first[..., None] * e0 + (1 - first)[..., None] * tail


def _check_guided(q, p, x, u, k, mode) -> None:
    """``guided_children``'s inputs, before any work: one-line TypeError / ValueError."""
    who = "guided_children"
    k = checks.integer(f"{who}: k", k, lo=1)
    for nm, a in (("q", q), ("p", p), ("x", x), ("u", u), ("mode", mode)):
        if not array_api_compat.is_array_api_obj(a):
            raise TypeError(f"{who}: {nm} must be an array (numpy or torch), got {type(a).__name__}")
    lead = tuple(q.shape[:-1])
    if q.ndim < 1 or tuple(p.shape) != tuple(q.shape):
        raise ValueError(f"{who}: q and p must be (..., V) of one shape, got {tuple(q.shape)} and {tuple(p.shape)}")
    if k > q.shape[-1]:
        raise ValueError(f"{who}: k = {k} exceeds the vocabulary V = {q.shape[-1]}")
    for nm, a in (("x", x), ("mode", mode)):
        if tuple(a.shape) != lead or "int" not in str(a.dtype):
            raise ValueError(f"{who}: {nm} must be integers of shape {lead}, got {a.dtype} {tuple(a.shape)}")
    if tuple(u.shape) != (*lead, k, 3):
        raise ValueError(f"{who}: u must be uniforms of shape {(*lead, k, 3)}, got {tuple(u.shape)}")


def guided_children(parent_key: Array, parent_logp: Array, q: Array, p: Array, x: Array, u: Array, k: int,
                    mode: Array):
    """Stochastic beam search children drawn by IMPORTANCE SAMPLING (docs/theory/likelihood.md section 11d, T15):
    the k children's tokens (the ordered top-k of the Gumbel-perturbed row, i.e. a draw without replacement from q)
    are drawn rank by rank from the proposal ``GUIDES[mode]`` (q_j: q without the earlier draws, renormalised):
    0 "natural": q_j (the construction itself);
    1 "first": a rank J ~ ``rank_guide(q(x), p(x), k)``, ranks before J from rej'_j = (1 - e) Norm([q_j - p]_+
      without x) + e Norm(q_j without x) (tokens the target would reject, with a defensive share e =
      ``GUIDE_DEFENSIVE``: a rule rejects by its residual after the earlier rejections, not by p; q_j where those
      are empty), the path's token x at rank J, q_j after (natural throughout where q(x) = 0);
    2 "rejected": (1 - e) Norm([q_j - p]_+) + e q_j (q_j where the first is empty).
    Their perturbed log-probabilities are then drawn exactly from their law GIVEN the order (the max over the
    remaining mass m_j = 1 - sum_{i<j} q(c_i) is Gumbel(log m_j), truncated below the previous one), so the keys (as
    ``child_keys``) and everything grown from them follow the true conditional law.
    q, p (..., V) the node's draft and target rows; x (...,) ints (the sequence's token there); u (..., k, 3)
    uniforms (the draw, the Gumbel, and at rank 0 the rank J); mode (...,) ints in {0, 1, 2}.
    -> tokens, keys, path log-probabilities (..., k) as ``child_keys``, and log ratios (..., 2) float64: log of
    pi_first(order) / q(order) and of pi_rejected(order) / q(order) for the order drawn, whichever proposal drew it
    (-inf where that proposal cannot draw it): the caller's multiple-importance weight. For "first" with x at rank
    J* of the order, only J = J* draws it (x is kept out of the earlier ranks), except where x is the last token of
    q's support, which every J >= J* then places at J*: pi_first / q = rho_eff(J*) prod_{i<J*} rej'_i(c_i) / q_i(c_i)
    / q_J*(x), rho_eff(J*) = rho(J*) (+ sum_{J > J*} rho(J) in that case)."""
    _check_guided(q, p, x, u, k, mode)
    xp = namespace(q, p, u)
    dev = array_api_compat.device(q)
    V = q.shape[-1]
    ar = xp.arange(V, device=dev)
    q = xp.astype(q, xp.float64)
    p = xp.astype(p, xp.float64)
    left = q
    hi = xp.full(q.shape[:-1], float("inf"), dtype=xp.float64, device=dev)
    lr = xp.zeros(q.shape[:-1], dtype=xp.float64, device=dev)   # log pi_rejected / q of the ranks so far
    lx = xp.zeros_like(lr)                                        # log pi_first / q of the ranks before x
    lf = xp.full_like(lr, -float("inf"))                          # log pi_first / q once x is drawn
    zero = xp.zeros_like(q)
    one = xp.ones_like(lr)
    isx = ar == x[..., None]                                      # (..., V)
    q_x = gather(q, x, xp)
    has_x = q_x > 0
    rho = rank_guide(q_x, gather(p, x, xp), k)                              # (..., k)
    cum = xp.cumulative_sum(rho, axis=-1)
    J = xp.sum(xp.astype(u[..., 0, 2][..., None] >= cum[..., :-1], xp.int64), axis=-1)   # 0-based rank of x
    tail = cum[..., -1:] - cum                                                # (..., k): sum over ranks after
    n_q = xp.sum(xp.astype(q > 0, xp.int64), axis=-1)
    e = GUIDE_DEFENSIVE
    toks, vals = [], []
    for j in range(k):   # a loop over the k ranks (each vectorised over nodes and tokens)
        tot = xp.sum(left, axis=-1)
        live = tot > 0
        Q = normalize(left, left, xp)                                        # all zero once exhausted
        r = xp.where(Q > p, Q - p, zero)                                     # [q_j - p]_+, the rejected mass
        sr = xp.sum(r, axis=-1)
        qx = gather(Q, x, xp)
        # each proposal's row is a r + b q_j (x removed where zx): per-node scalars a, b
        a_r = xp.where(sr > 0, (1 - e) / xp.where(sr > 0, sr, one), xp.zeros_like(lr))        # "rejected"
        b_r = xp.where(sr > 0, e * one, one)
        sx = xp.sum(xp.where(isx, zero, r), axis=-1)                          # the same without x (summed: no
        mx = xp.sum(xp.where(isx, zero, Q), axis=-1)                          # cancellation where x holds most)
        zx = mx > 0                                                          # x left out of rej'_j
        inv_mx = 1 / xp.where(zx, mx, one)
        a_x = xp.where(sx > 0, (1 - e) / xp.where(sx > 0, sx, one), xp.zeros_like(lr))       # rej'_j
        b_x = xp.where(sx > 0, e * inv_mx, xp.where(zx, inv_mx, one))
        before = (mode == 1) & has_x & (j < J)
        at = (mode == 1) & has_x & (j == J) & (qx > 0)
        a = xp.where(mode == 2, a_r, xp.where(before, a_x, xp.zeros_like(lr)))
        b = xp.where(mode == 2, b_r, xp.where(before, b_x, one))
        pi = a[..., None] * r + b[..., None] * Q
        pi = xp.where(isx & (before & zx)[..., None], zero, pi)
        pi = xp.where(at[..., None], xp.astype(isx, xp.float64), pi)
        c = sample_categorical(pi, u[..., j, 0], xp)
        qc, rc = gather(Q, c, xp), gather(r, c, xp)
        safe = xp.where(qc > 0, qc, one)
        at_x = live & (c == x) & xp.isinf(lf)                                # x drawn at rank j
        with np.errstate(divide="ignore"):
            lrho = xp.log(rho[..., j] + xp.where(n_q == j + 1, tail[..., j], xp.zeros_like(lr)))   # rho_eff
            lf = xp.where(at_x, lx - xp.log(safe) + lrho, lf)
            px = xp.where(zx & (c == x), xp.zeros_like(lr), a_x * rc + b_x * qc)
            lx = lx + xp.where(live, xp.log(px / safe), xp.zeros_like(lr))
            lr = lr + xp.where(live, xp.log((a_r * rc + b_r * qc) / safe), xp.zeros_like(lr))
        # the max of the remaining mass: Gumbel(log m), below the previous one (inverse CDF, in logs)
        mu = xp.log(xp.where(live, tot, one))
        g = mu - xp.log(xp.exp(mu - hi) - xp.log(u[..., j, 1]))
        g = xp.where(live & (qc > 0), g, xp.full_like(g, -float("inf")))
        toks.append(c)
        vals.append(g)
        hi = g
        left = xp.where(ar == c[..., None], zero, left)
    lf = xp.where(has_x, lf, xp.zeros_like(lf))                            # q(x) = 0: "first" is natural
    idx = xp.stack(toks, axis=-1)
    val = parent_logp[..., None] + xp.stack(vals, axis=-1)      # the drawn tokens' log q + Gumbel, in draw order
    qi = xp.take_along_axis(q, idx, axis=-1)
    logp = parent_logp[..., None] + xp.log(xp.where(qi > 0, qi, xp.ones_like(val)))
    return idx, _truncate(parent_key, val, xp), logp, xp.stack([lf, lr], axis=-1)


def select_nodes(keys: Array, pool_parent: Array, n: int):
    """The tree of a round from its pool: keys (..., M) float, pool_parent (..., M) int (the pool index of each
    node's parent, -1 for the root's children; parents come first) -> the n best nodes, ordered by pool index:
    ``sel`` (..., n) pool indices and ``parent`` (..., n+1) node parents (entry 0: -1 for the root; 0 = the
    root). Best = largest key, ties to the lower pool index, so a node's parent (key >= the node's, lower
    index) always ranks before it and the selection is closed under ancestors."""
    xp = namespace(keys)
    dev = array_api_compat.device(keys)
    M = keys.shape[-1]
    if not 1 <= n <= M:
        raise ValueError(f"select_nodes: n must be in [1, pool size {M}], got {n}")
    order = xp.argsort(-keys, axis=-1, stable=True)                            # best first, ties by index
    rank = xp.argsort(order, axis=-1, stable=True)                             # the inverse permutation
    chosen = rank < n                                                          # (..., M)
    node_of = xp.where(chosen, xp.cumulative_sum(xp.astype(chosen, xp.int64), axis=-1), xp.zeros_like(rank))
    ar = xp.arange(M, device=dev)
    sel = xp.astype(xp.argsort(xp.where(chosen, ar, ar + M), axis=-1, stable=True)[..., :n], xp.int64)
    par_pool = xp.take_along_axis(xp.astype(pool_parent, xp.int64), sel, axis=-1)
    safe = xp.where(par_pool >= 0, par_pool, xp.zeros_like(par_pool))
    par = xp.where(par_pool >= 0, xp.take_along_axis(node_of, safe, axis=-1), xp.zeros_like(par_pool))
    root = xp.full((*par.shape[:-1], 1), -1, dtype=xp.int64, device=dev)
    return sel, xp.concat([root, xp.astype(par, xp.int64)], axis=-1)
