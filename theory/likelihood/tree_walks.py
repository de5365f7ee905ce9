"""Node walks of the tree likelihoods (docs/theory/likelihood.md sections 11b and 11d; T13, T15): a node's
emissions with FIXED candidates, and the emissions along a sequence's own path through per-round-start trees.

* ``walk_point(p, cand, x, pos, verifier, xp)``: candidates verified with the point draft law (q_j = one-hot(c_j);
  the release's ``qx = 1``).
* ``walk_drawn(p, q, cand, x, pos, verifier, xp)``: candidates that were drawn without replacement from q, verified
  with that law (q_j = q without c_1..c_{j-1}, renormalised), the candidates given (a sampled tree's own draws).
* ``path_emissions(p, x, pt, verifier, ch, nt, D, Dp, xp, q=None, per_depth=False)``: per round start n and tree m,
  the emissions of the nodes on the path that spells the sequence (the states of ``tree._forward``).

Both walks return acc, res (r, K): acc[:, j] = P(the first j candidates rejected, the (j+1)-th accepted and equal to
x), res[:, j] = P(the first j+1 candidates rejected, then the residual emits x). A candidate the draft row cannot
draw (q_j(c_j) = 0: exhausted rows, tokens of draft probability 0 that a stochastic-beam tree selected to fill its
budget) is skipped, as ``theory.tree.verify_tree`` skips it (its ``valid``). Array API (numpy, torch), float64.

Helpers shared with ``tree`` (row selection and chunking): ``rows_at``, ``place``, ``chunked``.
"""
from __future__ import annotations

import array_api_compat

from ..core.xp import gather, normalize

__all__ = ["CHUNK_ELEMENTS", "rows_at", "place", "chunked", "walk_point", "walk_drawn", "path_emissions"]

CHUNK_ELEMENTS = 1 << 18   # rows x V per chunk of the point walks (topk, dynamic): 2 MiB float64 temporaries that
# stay in cache (128 MiB ones made the walks 2-3x slower at V = 1024); the walks' memory is O(V) per row for every
# rule (LANTERN's neighbour masses are summed block by block), so the rule's width does not shrink it


def rows_at(a, lo: int, hi: int, xp):
    """a (B, T, ...) -> rows lo..hi-1 of axis 1, flattened to (B (hi - lo), ...)."""
    s = a[:, lo:hi]
    return xp.reshape(s, (s.shape[0] * s.shape[1], *s.shape[2:]))


def place(a, B: int, T: int, lo: int, xp):
    """(B m, ...) rows of round starts lo..lo+m-1 -> (B, T, ...) with zeros at the other round starts."""
    a = xp.reshape(a, (B, a.shape[0] // B, *a.shape[1:]))
    m = a.shape[1]
    z = lambda k: xp.zeros((B, k, *a.shape[2:]), dtype=a.dtype, device=array_api_compat.device(a))  # noqa: E731
    return xp.concat([z(lo), a, z(T - lo - m)], axis=1)


def chunked(fn, arrays, step: int, xp):
    """fn over row chunks of ``arrays`` (each (rows, ...)), outputs concatenated: a loop over chunks (memory)."""
    n = arrays[0].shape[0]
    parts = [fn(*(a[s:s + step] for a in arrays)) for s in range(0, n, step)]
    return tuple(xp.concat([o[i] for o in parts], axis=0) for i in range(len(parts[0])))


def walk_point(p, cand, x, pos, verifier, xp):
    """The walk at one node per row with fixed candidates and the point draft law (q_j = one-hot(c_j)): p (r, V) the
    node's target row, cand (r, K) its candidates in rank order, x (r,) the sequence's token, pos (r,) the 1-based
    draft position. -> acc, res (r, K) (module docstring). LANTERN's rejected-dependent resamplers get the actual
    c_j."""
    r, V = p.shape
    ar = xp.arange(V, device=array_api_compat.device(p))
    S = xp.ones((r,), dtype=p.dtype, device=array_api_compat.device(p))      # P(every earlier candidate rejected)
    pj, acc, res = p, [], []
    for j in range(cand.shape[1]):   # a loop over candidate ranks
        c = cand[:, j]
        qj = xp.astype(ar == c[:, None], p.dtype)
        f = verifier.accept(pj, qj, pos)
        fc = gather(f, c, xp)
        acc.append(xp.where(c == x, S * fc, xp.zeros_like(fc)))
        pj = verifier.resample(pj, qj, f, c)
        S = S * (1 - fc)
        res.append(S * gather(pj, x, xp) / xp.sum(pj, axis=-1))
    return xp.stack(acc, axis=1), xp.stack(res, axis=1)


def walk_drawn(p, q, cand, x, pos, verifier, xp):
    """The walk at one node per row with the candidates cand (r, K) that were drawn without replacement from the
    draft row q (r, V) (a stochastic-beam tree's own draws, in draw order), verified with that law: q_j = q without
    c_1..c_{j-1}, renormalised; f_j = accept(p_j, q_j, pos), p_{j+1} = resample(p_j, q_j, f_j, rejected=c_j).
    p (r, V), x (r,), pos (r,) as ``walk_point``. -> acc, res (r, K) (module docstring; skipped candidates: q_j(c_j)
    = 0). Once a round is certain to have stopped (P(all rejected) = 0) its residual is not formed again (0/0)."""
    r, V = p.shape
    dev = array_api_compat.device(p)
    ar = xp.arange(V, device=dev)
    S = xp.ones((r,), dtype=p.dtype, device=dev)
    zero = xp.zeros((r,), dtype=p.dtype, device=dev)
    pj, left, acc, res = p, q, [], []
    for j in range(cand.shape[1]):   # a loop over candidate ranks
        c = cand[:, j]
        Q = normalize(left, left, xp)                                         # all zero once exhausted
        ok = gather(Q, c, xp) > 0                                             # verify_tree's ``valid``
        f = verifier.accept(pj, Q, pos)
        fc = xp.where(ok, gather(f, c, xp), zero)
        acc.append(xp.where(c == x, S * fc, zero))
        S = S * (1 - fc)
        turn = ok & (S > 0)                                                   # rejected, and the round goes on
        pj = xp.where(turn[:, None], verifier.resample(pj, Q, f, c), pj)
        res.append(xp.where(S > 0, S * gather(pj, x, xp) / xp.sum(pj, axis=-1), zero))
        left = xp.where(ok[:, None] & (ar == c[:, None]), xp.zeros_like(left), left)
    return xp.stack(acc, axis=1), xp.stack(res, axis=1)


def path_emissions(p, x, pt, verifier, ch, nt, D: int, Dp, xp, q=None, per_depth: bool = False):
    """Emissions along the sequence's path in per-round-start trees (T13's dynamic trees, T15): ch (B, T, M, N+1, K)
    children (-1: none), nt (B, T, M, N+1) node tokens, M trees per round start (1: the release's deterministic tree;
    M: sampled lossless trees); p (B, T, V) float64 target rows, x (B, T) tokens, pt (B, T) the target's token
    probability, D the walk's depth bound, Dp (T,) numpy D'(n). States: depths 0..D along the path of each tree, v_d(n,
    m) = the node of tree m of round n at depth d whose path spells x_n..x_{n+d-1} (unique: siblings carry distinct
    tokens; -1 if none).
    ``q`` None: the point law (``walk_point``); else the rows the candidates were drawn from (``walk_drawn``): (B, T,
    D, V) by round start (``per_depth``: q[n, d] at the path's depth-d node) or (B, T, V) by position (q[n + d]).
    -> Eacc, R (B, T, M, D+1) float64: Eacc[..., d] entering the path's depth-d node (token n + d - 1), R[..., d]
    leaving it for the root with token n + d (residual, or the bonus p[n + d] at a leaf or at depth D'(n)).
    Walks run on the (image, round start, tree) rows the path reaches only (a loop over levels and chunks)."""
    B, T, M, N1, K = ch.shape
    V = p.shape[-1]
    dev = array_api_compat.device(p)
    i64 = xp.int64
    Dpx = xp.asarray(Dp, device=dev)[None, :, None]
    pflat, xflat = xp.reshape(p, (B * T, V)), xp.reshape(x, (B * T,))
    v = xp.zeros((B, T, M), dtype=i64, device=dev)
    zero = xp.zeros((B, T, M), dtype=xp.float64, device=dev)

    def shift(a, d, fill):   # a (B, T) -> a[:, n + d] (fill past the end), (B, T, 1)
        s = xp.concat([a[:, d:], xp.full((B, min(d, T)), fill, dtype=a.dtype, device=dev)], axis=1)[:, :T]
        return s[:, :, None]

    E, R = [zero], []
    for d in range(D):   # a loop over tree levels
        vs = xp.where(v >= 0, v, xp.zeros_like(v))
        kids = xp.take_along_axis(ch, xp.broadcast_to(vs[..., None, None], (B, T, M, 1, K)), axis=3)[..., 0, :]
        live = (kids >= 0) & ((v >= 0) & (d < Dpx))[..., None]                  # (B, T, M, K) candidates tried
        tok = xp.take_along_axis(nt, xp.where(kids >= 0, kids, xp.zeros_like(kids)), axis=3)
        m = xp.sum(xp.astype(live, i64), axis=-1)
        match = live & (tok == shift(x, d, -1)[..., None])
        walked = xp.reshape(m > 0, (-1,))
        (idx,) = xp.nonzero(walked)                                               # the rows the path reaches
        a_sel, r_sel = zero, zero
        if idx.shape[0]:
            n = (idx // M) % T
            rows = (idx // (T * M)) * T + n + d                                   # p's row: position n + d
            cand = xp.take(xp.reshape(xp.where(live, tok, xp.zeros_like(tok)), (-1, K)), idx, axis=0)
            lv = xp.take(xp.reshape(live, (-1, K)), idx, axis=0)
            args = (xp.take(pflat, rows, axis=0), cand, xp.take(xflat, rows, axis=0),
                    xp.full((idx.shape[0],), d + 1, dtype=i64, device=dev))
            if q is None:
                fn = lambda *a: walk_point(*a, verifier, xp)                        # noqa: E731
            else:
                qr = (rows - d) * D + d if per_depth else rows
                qflat = xp.reshape(q, (B * T * D, V) if per_depth else (B * T, V))
                args = (args[0], xp.take(qflat, qr, axis=0), *args[1:])
                fn = lambda *a: walk_drawn(*a, verifier, xp)                        # noqa: E731
            a, r = chunked(fn, args, max(1, CHUNK_ELEMENTS // V), xp)
            mw = xp.take(xp.reshape(m, (-1,)), idx, axis=0)
            a_c = xp.sum(xp.where(lv, a, xp.zeros_like(a)), axis=-1)             # the matching child (1{c_j = x})
            r_c = gather(r, mw - 1, xp)
            slot = xp.cumulative_sum(xp.astype(walked, i64)) - 1                  # compacted row -> its (b, n, m)
            slot = xp.reshape(xp.where(walked, slot, xp.full_like(slot, idx.shape[0])), (B, T, M))
            pad = xp.zeros((1,), dtype=xp.float64, device=dev)
            a_sel = xp.take(xp.concat([a_c, pad]), xp.reshape(slot, (-1,)), axis=0)
            r_sel = xp.take(xp.concat([r_c, pad]), xp.reshape(slot, (-1,)), axis=0)
            a_sel, r_sel = xp.reshape(a_sel, (B, T, M)), xp.reshape(r_sel, (B, T, M))
        reach = (v >= 0) & (d <= Dpx)
        R.append(xp.where(m > 0, r_sel, xp.where(reach, shift(pt, d, 0.0), zero)))
        E.append(a_sel)
        first = xp.argmax(xp.astype(match, i64), axis=-1)
        v = xp.where(xp.any(match, axis=-1), gather(kids, first, xp), xp.full_like(v, -1))
    R.append(xp.where((v >= 0) & (D <= Dpx), shift(pt, D, 0.0), zero))
    return xp.stack(E, axis=-1), xp.stack(R, axis=-1)
