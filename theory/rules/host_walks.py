"""The host walk of every rule without a walk of its own (docs/theory.md section 9, multi-candidate verification):
``theory.tree.verify_tree``'s walk on numpy rows, both draft laws, one candidate per unfinished round per step, the
acceptance evaluated at the candidate only and the resampling law built only on rejection (``host_walk``), and its
batch-1 form (``_one_round``): the same operations on the same rows step for step, the bookkeeping (node, rank, depth,
token) as Python ints. Vanilla's walk for candidates drawn without replacement (``theory.rules.walks.VANILLA_WALKS``)
is ``host_walk`` with vanilla's rules.

Shapes: target rows p and draft rows q (B, N+1, V), tokens and uniforms u_accept (B, N+1), u_sample (B,), children
(N+1, K) shared by the rounds or (B, N+1, K) per round (-1 padded by rank), D the tree's depth, max_depth (B,) or
None. Verdict: (accepted (B,), path (B, D) accepted nodes by depth, -1 past them, next token (B,), last node (B,)).
"""
from __future__ import annotations

import numpy as np

from ..core.xp import normalize, ratio_min1, sample_categorical
from .acceptance import Vanilla, accept_at, reads_f

__all__ = ["host_walk"]


def _host(*arrays) -> bool:
    return all(a is None or isinstance(a, np.ndarray) for a in arrays)


def host_walk(accept, resample, p, q, tokens, u_accept, u_sample, children, D, max_depth=None,
              draft_law: str = "without_replacement", *, one_round: bool = True):
    """``theory.tree.verify_tree``'s walk for any rule (acceptance ``accept``, resampling ``resample``) on numpy rows,
    both draft laws, at the cost of the rule's point formula: one candidate per unfinished round per step, the same
    operations on the same rows as ``verify_tree`` (hence the same bits), with the acceptance evaluated at the
    candidate only (``theory.rules.acceptance.accept_at``: O(k) for LANTERN's rules, not O(V k); LANTERN's decided
    from its bounds where they suffice, ``Lantern.decide_at``, when f itself is not needed) and the resampling
    law built only for the rounds that reject (the full acceptance row there only for a resampler that reads it,
    ``reads_f``). Arguments and verdict as in the module note; None when the arrays are not numpy. The engine's host
    path for every rule without a walk of its own, and vanilla's walk for candidates drawn without replacement. One
    round (B = 1) with the shared children table takes ``_one_round`` (the same bits; ``one_round=False``: the
    batched steps, as tests compare them)."""
    if not _host(p, q, tokens, u_accept, u_sample):
        return None
    point = draft_law == "point"
    B, N1, V = p.shape
    D = int(D)
    children = np.asarray(children)
    # each node's children by rank with a -1 column past the last (children are -1 padded by rank): the candidate of
    # rank r is kids[..., node, r], none where it is -1 (rank reaches K at most: it grows only while a child exists)
    kids = np.full((*children.shape[:-1], children.shape[-1] + 1), -1, np.int64)
    kids[..., :-1] = children
    shared = kids.ndim == 2                                                      # (N+1, K+1) shared by the rounds
    tokens = np.asarray(tokens, np.int64)
    cap = np.full(B, D, np.int64) if max_depth is None else np.asarray(max_depth, np.int64)
    if B == 1 and shared and one_round:
        return _one_round(accept, resample, p, q, tokens, u_accept, u_sample, kids.tolist(), D,
                          int(cap.reshape(-1)[0]), N1 + D, point)
    rows = np.arange(B)
    node = np.zeros(B, np.int64)
    rank = np.zeros(B, np.int64)
    depth = np.zeros(B, np.int64)
    path = np.full((B, D), -1, np.int64)
    below = cap > 0                                           # short of its depth cap (depth < cap)
    active = below                                            # unfinished and short of its depth cap
    p_res = p[:, 0].copy()
    q_left = None if point else q[:, 0].copy()          # the node's q without its rejected siblings (zeroed)
    needs_f, at_point, decide, vanilla = _hooks(accept, resample, point)
    count = np.count_nonzero                        # (a C call: ndarray.any's Python wrapper costs 4x more)
    for _ in range(N1 + D):  # a loop over walk steps (each tries one candidate of every unfinished round)
        kid = kids[node, rank] if shared else kids[rows, node, rank]            # (B,) -1: no candidate left
        has = active & (kid >= 0)
        if not count(has):
            break
        c = tokens[rows, kid]                       # (where has is False, kid = -1 reads a token that is not used)
        if point:        # deterministic candidates: the draft's conditional law is the point mass at c
            q_j = (np.arange(V) == c[:, None]).astype(p.dtype)
        else:            # Norm(q_left), 0 if exhausted
            q_j = normalize(q_left, q_left)
        pos = None if vanilla and not needs_f else np.minimum(depth + 1, D)      # (vanilla's f does not read it)
        qc = q_j[rows, c]
        valid = has if point else has & (qc > 0)                                  # impossible candidates are skipped
        if decide is not None:   # the rule decides from bounds where it can (f itself is not read below)
            acc, f = decide(p_res, q_j, pos, c, u_accept[rows, kid], want=valid)   # (f: NaN where unread)
        else:
            f = ratio_min1(p_res[rows, c], qc, np) if vanilla else accept_at(accept, p_res, q_j, pos, c)
            acc = valid & (u_accept[rows, kid] < f)
        rej = valid & ~acc
        n_rej = count(rej)
        if n_rej:
            every = n_rej == B                    # (every round rejects: its rows whole, no masked copies)
            pr, qr, cr = (p_res, q_j, c) if every else (p_res[rej], q_j[rej], c[rej])
            g = None if at_point is None else at_point(pr, cr, f if every else f[rej])   # (None: no law for it)
            if g is None:
                g = resample(pr, qr, accept(pr, qr, pos if every else pos[rej]) if needs_f else None, cr)
            if every:                             # (copied in: the walk's row is its own, whatever g aliases)
                p_res[...] = g
            else:
                p_res[rej] = g
            if not point:
                q_left[rows if every else rows[rej], cr] = 0.0
        if count(acc):
            p_res[acc] = p[rows[acc], kid[acc]]
            if not point:
                q_left[acc] = q[rows[acc], kid[acc]]
            path[rows[acc], depth[acc]] = kid[acc]
            node = np.where(acc, kid, node)
            depth = depth + acc
            rank = np.where(acc, 0, rank + has)                                  # (an accepted round: 0 anyway)
            below = depth < cap
        else:                                   # no round accepted: every rank moves on, the depths are unchanged
            rank = rank + has
        active = has & below
    return depth, path, _sample(p_res, u_sample).astype(np.int64, copy=False), node


def _hooks(accept, resample, point: bool):
    """What the host walks read of a rule: (needs_f: the resampler reads the acceptance row (``reads_f``), at_point:
    the resampler's law at q = one-hot(c) under the point law (``resample.point``, the same bits), else None, decide:
    the acceptance's decision from bounds (``decide_at``: LANTERN's) where f itself is not read, else None, vanilla:
    f read from the entries the walk gathers (``Vanilla.at``'s formula))."""
    needs_f = reads_f(resample)
    at_point = getattr(resample, "point", None) if point else None
    decide = None if needs_f else getattr(accept, "decide_at", None)
    return needs_f, at_point, decide, type(accept) is Vanilla


def _one_round(accept, resample, p, q, tokens, u_accept, u_sample, table: list, D: int, cap: int, steps: int,
               point: bool):
    """``host_walk`` of one round (B = 1; p, q (1, N+1, V), tokens int64 and u_accept (1, N+1), u_sample (1,)), any
    rule, both draft laws (``point``): the same operations on the same rows step for step, hence the same bits (the
    rule called on the same (1, V) rows and (1,) entries; the comparison u < f on numpy scalars, promoted as the
    arrays are), the bookkeeping (node, rank, depth, token) as Python ints. ``table``: host_walk's children table
    (N+1, K+1) as lists; ``cap`` the depth cap; ``steps`` the bound on steps. Returns host_walk's verdict (B = 1)."""
    needs_f, at_point, decide, vanilla = _hooks(accept, resample, point)
    tok, ua = tokens[0].tolist(), u_accept[0]
    node, rank, depth, path = 0, 0, 0, np.full((1, D), -1, np.int64)
    # the node's rows, never written in place: p_res rebound (to a node's row of p, a view, or a residual), q_left
    # (the node's q without its rejected siblings, zeroed) a view of q until its first rejection copies it
    p_res, q_left, lent = p[:, 0], (None if point else q[:, 0]), True
    codes = np.arange(p.shape[-1]) if point else None
    pos = None if vanilla and not needs_f else np.array([min(1, D)], np.int64)    # (vanilla's f does not read it)
    for _ in range(steps):  # a loop over walk steps (each tries one candidate)
        kid = table[node][rank]
        if kid < 0 or depth >= cap:
            break
        x, c = tok[kid], tokens[:, kid]                                         # the candidate: an int, (1,)
        q_j = (codes == c[:, None]).astype(p.dtype) if point else normalize(q_left, q_left)
        qc = q_j[:, x]                                                          # (1,)
        if not (point or qc[0] > 0):                                            # impossible candidates are skipped
            rank += 1
            continue
        if decide is not None:   # the rule decides from bounds where it can (f itself is not read below)
            ok, f = decide(p_res, q_j, pos, c, u_accept[:, kid])                # (f: NaN where unread)
            ok = ok[0]
        else:
            f = ratio_min1(p_res[:, x], qc, np) if vanilla else accept_at(accept, p_res, q_j, pos, c)
            ok = ua[kid] < f[0]
        if ok:
            p_res, path[0, depth] = p[:, kid], kid
            if not point:
                q_left, lent = q[:, kid], True
            node, depth, rank = kid, depth + 1, 0
            if pos is not None:
                pos = np.array([min(depth + 1, D)], np.int64)
            continue
        g = None if at_point is None else at_point(p_res, c, f)                 # (None: no law for it)
        if g is None:
            g = resample(p_res, q_j, accept(p_res, q_j, pos) if needs_f else None, c)
        p_res = _row(g, p_res)
        if not point:
            if lent:
                q_left, lent = q_left.copy(), False
            q_left[0, x] = 0.0
        rank += 1
    return (np.array([depth], np.int64), path, _sample(p_res, u_sample).astype(np.int64, copy=False),
            np.array([node], np.int64))


def _row(g, like: np.ndarray) -> np.ndarray:
    """The residual g as the walk's next row (1, V): g itself where it is a numpy array of ``like``'s shape and dtype
    (the batch-1 walk writes no row in place, so an alias of the rule's is harmless), else cast into a new one (as the
    batched walk's assignment into its row casts and broadcasts)."""
    if type(g) is np.ndarray and g.shape == like.shape and g.dtype == like.dtype:
        return g
    out = np.empty_like(like)
    out[...] = g
    return out


def _sample(w: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws from the rows w (B, V) (unnormalised, as ``theory.core.xp.sample_categorical``)."""
    return np.asarray(sample_categorical(w, np.asarray(u, w.dtype)))


