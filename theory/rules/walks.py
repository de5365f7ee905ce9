"""Lean tree walks that a verifier supplies for itself (``Verifier.walk``, the hook ``theory.tree.verify_round``
calls): vanilla and greedy multi-candidate verification (docs/theory.md section 9, T5 applied recursively), batched
over rounds, with ``theory.tree.verify_tree``'s verdict at a fraction of its cost (its generic array-API walk spends
~90 full-row operations per candidate tried, the price of serving every verifier). On numpy rows (the host path) the
walks below; on other arrays (the engine's device path) the device walks (``_vanilla_device``, ``_greedy_device``):
every node's candidates tried at once, then the chosen children followed from the root (``follow_chosen``), a fixed
count of operations and no read-back. Greedy's chain verdict (``greedy_chain``, ``Verifier.chain``) is here too.
Trees are given as plain arrays (children (B, N+1, K), the walk's depth bound), so this room needs nothing of
``theory.tree``.

* vanilla (``theory.rules.vanilla``: f = min(1, p/q), G = Norm([p - q]_+)) with the point draft law
  (``draft_law="point"``: the candidates are the draft's deterministic top-k, q_j = one-hot(c_j); the LANTERN
  release's ``qx = 1``): after rejecting c_1 .. c_{j-1} the residual is p with those tokens zeroed, renormalised,
  so candidate j is accepted iff u_j < p(c_j) / (m - S_j), with m = sum(p) and S_j = sum_{i<j} p(c_i) (a token
  repeated among the siblings has p_res = 0: rejected, residual unchanged), and the next token after the last
  rejection is drawn from p with every rejected sibling zeroed.
* LANTERN++ as released (``theory.rules.lantern_pp``: its residual under the point law is vanilla's, since the
  neighbours it zeroes in q' = one-hot(c) hold no draft mass) with the point law: vanilla's walk with the
  acceptance's admitted neighbour mass added to each candidate's (``boosted_walks``, ``Lantern.sibling_mass``:
  the neighbours' masses with the earlier siblings zeroed, O(k) per candidate, every sibling of a level at once).
* LANTERN as released (``theory.rules.lantern``: its rejection zeroes c and, when a neighbour was admitted, c's k+1
  nearest) with the point law: the removed masses of a level's siblings by one scatter and one gather, the admissions
  as a fixed point (``theory.rules.lantern_walk.delta_level``, the ``level`` hook of the level walk).
* scaled rules with G* (``theory.rules.cool_sd``, ``uniform_rsd``, ``linear_rsd``, ``scaled``: f = min(1, w_i p/q),
  G* = Norm([p - q f]_+)) with the point law: a rejection takes min(1, w_i) of the candidate's remaining mass (all
  of it when w_i >= 1, as vanilla), so a level is settled at once too (``scaled_walks``).
* greedy (``theory.rules.greedy``: f = 1[x = argmax p], G = one-hot(argmax p)), any draft law: rejections leave
  the argmax in place, so the walk follows the first child (by rank) whose token is the node's argmax and whose
  draft row gives it positive mass (``verify_tree`` skips impossible candidates), and the next token is the argmax
  of the last node's row after a rejection, else (a leaf, no possible candidate) a draw from it.

* vanilla with candidates drawn without replacement (``draft_law="without_replacement"``, static trees and the
  lossless dynamic trees): ``verify_tree``'s own walk (one candidate per round per step, the same operations on
  the same rows), with the acceptance evaluated at the candidate only and the residual built only on rejection:
  ``theory.rules.host_walks.host_walk`` (every rule's host walk, re-exported here), with vanilla's rules.

Same verdict as ``verify_tree(..., early_exit=True)`` (greedy and without replacement: the same operations;
vanilla with the point law: up to the rounding of the residual's normalisation, ~1 ulp of p per rejection, so a
decision differs only when a uniform falls within that of its threshold; the device walks: the same operations per
row, hence the same verdict), tested in tests/test_fast_verify.py against ``verify_tree``.
"""
from __future__ import annotations

from functools import partial

import array_api_compat
import numpy as np

from ..core.xp import gather, gather_rows, namespace, sample_categorical, take_last
from .acceptance import Vanilla, _weight_at, accept_at
from .chain import ChainVerdict
from .host_walks import _host, _sample, host_walk
from .resampling import Residual

__all__ = ["VANILLA_WALKS", "GREEDY_WALKS", "DRAFT_LAWS", "follow_chosen", "greedy_chain", "host_walk", "boosted_walks",
           "scaled_walks"]

DRAFT_LAWS = ("without_replacement", "point")      # as theory.tree.DRAFT_LAWS (this room sits below theory.tree)


def _walk(kind: str, p: np.ndarray, q: np.ndarray | None, tokens: np.ndarray, u_accept: np.ndarray,
          u_sample: np.ndarray, children: np.ndarray, D: int, max_depth: np.ndarray | None = None,
          draft_law: str = "point", *, boost=None, bound=None, weight=None, level=None):
    """The verdict of ``theory.tree.verify_tree`` for ``kind`` ("vanilla": the point law; "greedy": any law), numpy
    arrays: p (B, N+1, V) target rows, q (B, N+1, V) draft rows (read only for greedy with a non-point law: candidates
    it gives mass 0 are skipped), tokens (B, N+1), u_accept (B, N+1), u_sample (B,), children (N+1, K) shared or
    (B, N+1, K) per round (-1 padded), D the tree's depth, max_depth (B,) or None. ``boost`` (vanilla's walk for a
    rule whose residual under the point law is vanilla's, LANTERN++'s released one): the mass its acceptance adds
    to each candidate's (``Lantern.sibling_mass``), candidate j accepted iff u_j < (p(c_j) + boost_j) / (m - S_j)
    (the first candidate: u_1 < p(c_1) + boost_1, the row itself, as ``verify_tree``); with ``bound`` (the boost's
    bound, ``Lantern.sibling_cap``) only where the bounds do not decide (``_boosted``). ``weight`` (a scaled rule
    with G*, ``scaled_walks``: f = min(1, w_i p_res(c)), G* = Norm([p_res - f 1_c]_+)): ``weight(pos (B,), rows)`` the
    weights (B,) at the candidates' position; a rejection takes min(1, w) of the candidate's remaining mass (all of
    it when w >= 1, as vanilla), so candidate j is accepted iff u_j < w p_j(c_j) / (m - taken before j), with
    p_j(c_j) = p(c_j) (1 - min(1, w))^(earlier listings of c_j). ``level`` (a rule whose rejection zeroes more than
    the candidate, LANTERN's released "p" law: ``theory.rules.lantern_walk.delta_level``): ``level(B, V, K)`` gives
    the step that settles a level, ``step(pr, c, has, u)`` on the n <= B live rounds' rows (n, V) -> (ok (n, K),
    clear(stop, pr): zero in the node rows pr
    (the walk's own copy, before the residual rows are taken from it), for the rounds stop (B,) bool stopped there,
    the codes their residual lacks), or None (then so does the walk: the
    generic walk serves). Returns (accepted (B,), path (B, D), next_token (B,), last_node (B,)), or None when the
    arrays are not numpy (the rule's "device" walk serves them)."""
    if not _host(p, q, tokens, u_accept, u_sample):
        return None
    B, N1, V = p.shape
    D = int(D)
    children = np.asarray(children)
    if children.ndim == 2:
        children = np.broadcast_to(children, (B, *children.shape))
    K = children.shape[-1]
    rows = np.arange(B)
    cap = np.full(B, D, np.int64) if max_depth is None else np.asarray(max_depth, np.int64)
    node = np.zeros(B, np.int64)
    depth = np.zeros(B, np.int64)
    path = np.full((B, D), -1, np.int64)
    live = np.ones(B, bool)
    earlier = None                                            # earlier[j, i]: sibling i is tried before j
    res = []                                                  # vanilla: (stopped rounds, their residual rows)
    settle = None if level is None else level(B, V, K)       # ``level``: its step
    rejected = np.zeros(B, bool)                              # greedy: the walk ended with a rejection
    for _ in range(D):  # a loop over tree levels: each step settles one node of every live round
        kids = children[rows, node]                                              # (B, K)
        has = (kids >= 0) & (live & (depth < cap))[:, None]
        safe = np.where(has, kids, 0)
        c = tokens[rows[:, None], safe]                                          # (B, K) candidate tokens
        whole = level is None or live.all()     # (the level step reads the live rounds' rows only: (n, V), n <= B)
        lv = rows if whole else np.flatnonzero(live)
        pr = p[rows, node] if whole else p[lv, node[lv]]                         # (B, V) the node's row
        if kind == "greedy":
            valid = has if draft_law == "point" else has & (q[rows[:, None], node[:, None], c] > 0)
            ok = valid & (c == pr.argmax(-1)[:, None])
            rejected |= live & ~ok.any(-1) & valid.any(-1)      # the walk ends with a rejection: G = one-hot
        elif level is not None:
            uc = u_accept[rows[:, None], safe]
            out = settle(pr, c, has, uc) if whole else settle(pr, c[lv], has[lv], uc[lv])
            if out is None:
                return None
            ok, clear = out
            if not whole:
                ok = np.zeros((B, K), bool)
                ok[lv] = out[0]
        else:
            if earlier is None:
                earlier = np.tri(K, K, -1, dtype=bool)
            same = (c[:, :, None] == c[:, None, :]) & earlier & has[:, None, :]     # listed by an earlier sibling
            if weight is None:                      # a rejection takes all of c's mass (a repeat meets 0)
                pc = np.where(has & ~same.any(-1), pr[rows[:, None], c], 0.0)
                taken = num = pc
            else:                                   # a scaled rule with G*: it takes min(1, w) of c's remaining mass
                wv = np.broadcast_to(np.asarray(weight(np.minimum(depth + 1, D), pr)), (B,))[:, None]
                m1 = np.minimum(wv, 1.0)
                pc = np.where(has, pr[rows[:, None], c] * (1.0 - m1) ** same.sum(-1), 0.0)
                taken, num = pc * m1, wv * pc
            left = pr.sum(-1, keepdims=True) - (np.cumsum(taken, -1) - taken)    # mass not yet rejected
            if weight is not None or boost is not None:
                left[:, 0] = 1.0                    # the residual before the first candidate is the row itself
            uc = u_accept[rows[:, None], safe]
            if boost is not None and bound is None:
                num = pc + boost(pr, c, pc, _rank_of(c, has, V), left)
            thr = np.where(left > 0, num / np.where(left > 0, left, 1.0), 0.0)
            ok = has & (uc < thr)
            if boost is not None and bound is not None:   # thr above: the boost's floor (0); the boost where it decides
                ok = _boosted(boost, bound, pr, c, pc, left, has, uc, ok)
        acc = ok.any(-1)
        first = ok.argmax(-1)                                                    # the first accepted sibling
        if kind == "vanilla":                                                    # stopping rounds: their residual
            stop = live & ~acc
            if stop.any():
                tried = has & (np.arange(K)[None, :] < np.where(acc, first, K)[:, None])
                if level is not None:                   # (in pr, the walk's own copy, before the rows are taken)
                    clear(stop if whole else stop[lv], pr)
                r = pr[stop if whole else stop[lv]]                              # (a copy)
                cs, ts = c[stop], tried[stop]
                if level is None and weight is None:
                    r[np.nonzero(ts)[0], cs[ts]] = 0.0
                elif level is None:                 # each tried candidate's taken mass (repeats: one after another)
                    np.subtract.at(r, (np.nonzero(ts)[0], cs[ts]), taken[stop][ts].astype(r.dtype))
                    np.maximum(r, 0.0, out=r)
                empty = r.sum(-1) <= 0              # every sibling's mass rejected (round-off only): the node's row
                if empty.any():                         # (re-read from p: the level's clear wrote in pr)
                    r[empty] = p[rows[stop][empty], node[stop][empty]]
                res.append((stop, r))
        win = kids[rows, first]
        path[rows[acc], depth[acc]] = win[acc]
        node = np.where(acc, win, node)
        depth = depth + acc
        live = live & acc
        if not live.any():
            break
    # the next token: the last node's row (greedy: its argmax; vanilla: the residual, or the row after a leaf)
    last = p[rows, node]
    if kind == "greedy":                       # after a rejection the argmax; after a leaf / no candidate a draw
        nxt = np.where(rejected, last.argmax(-1), _sample(last, u_sample))
    else:
        for stop, r in res:                     # (last is a copy; a round stops once)
            last[stop] = r
        nxt = _sample(last, u_sample)
    return depth, path, nxt.astype(np.int64), node


def _rank_of(c, has, V):
    """(B, V) int16: the 1-based rank of each code's first listing among a node's tried candidates c (B, K) (0: none)."""
    B, K = c.shape
    rank_of = np.zeros((B, V), np.int16)
    rr, jj = np.nonzero(has[:, ::-1])                                            # latest rank first: the earliest wins
    rank_of[rr, c[rr, K - 1 - jj]] = K - jj
    return rank_of


def _boosted(boost, bound, pr, c, pc, left, has, u, floor):
    """``_walk``'s acceptances (B, K) bool of a level for a rule whose acceptance adds a boost in [0, bound] to each
    candidate's mass (docs/theory/trees.md section 9b, "The boost where it decides"): ``floor`` (B, K) the tests
    u < pc / left (the boost at 0: accepted whatever it is), ``bound(pc, left)`` (B, K) the boost's bound in the rows'
    dtype; a candidate with u >= (pc + bound) / left is rejected whatever the boost (rounding is monotone), and only
    the others before each round's first sure acceptance get theirs (``boost(..., need=)``), with the same bits."""
    B, K = c.shape
    pos = left > 0
    den = np.where(pos, left, 1.0)
    hi = np.where(pos, (pc + bound(pc, left)) / den, 0.0)
    sure = np.where(floor.any(-1), floor.argmax(-1), K)                           # each round's first sure rank
    need = has & ~floor & (u < hi) & (np.arange(K) < sure[:, None])
    if not need.any():
        return floor
    num = pc + boost(pr, c, pc, _rank_of(c, has, pr.shape[-1]), left, need=need)
    return floor | (need & (u < np.where(pos, num / den, 0.0)))


def _take(x, idx, xp):
    """x[b, idx[b, k]]: x (B, M), idx (B, K) non-negative -> (B, K)."""
    return x.gather(-1, idx) if array_api_compat.is_torch_array(x) else xp.take_along_axis(x, idx, axis=-1)


def _greedy_device(p, q, tokens, u_accept, u_sample, children, D: int, max_depth=None, draft_law: str = "point"):
    """The greedy walk of ``_walk`` for arrays that are not numpy (torch on a device, the engine's device path):
    every node's chosen child at once (its first candidate, by rank, that is the node's argmax and, unless the law
    is "point", has positive draft mass), then the chosen children followed from the root (``follow_chosen``); nothing is
    read back. The next token: the argmax of the last node's row after a rejection there, else (a leaf, no possible
    candidate, or the depth cap) a draw from it. Arguments and verdict as ``_walk``."""
    xp = namespace(p, tokens)
    dev = array_api_compat.device(p)
    B, N1, V = p.shape
    ch = xp.broadcast_to(xp.asarray(children, device=dev), (B, N1, children.shape[-1]))
    K = ch.shape[-1]
    safe = xp.clip(ch, 0, None)
    c = xp.reshape(take_last(xp.astype(tokens, xp.int64), xp.reshape(safe, (B, N1 * K)), xp), (B, N1, K))
    valid = ch >= 0
    if draft_law != "point":
        valid = valid & (take_last(q, c, xp) > 0)
    ok = valid & (c == xp.argmax(p, axis=-1)[..., None])                        # (B, N+1, K)
    first = take_last(safe, xp.argmax(xp.astype(ok, xp.int8), axis=-1)[..., None], xp)[..., 0]
    chosen = xp.where(xp.any(ok, axis=-1), first, xp.full_like(first, -1))       # (B, N+1)
    cap = None if max_depth is None else xp.astype(xp.asarray(max_depth, device=dev), xp.int64)
    path, depth, node = follow_chosen(chosen, int(D), cap, xp)
    rejected = gather(xp.astype(xp.any(valid, axis=-1), xp.int64), node, xp) > 0   # the walk ended on candidates
    if cap is not None:
        rejected = rejected & (depth < cap)
    last = gather_rows(p, node, xp)
    nxt = xp.where(rejected, xp.astype(xp.argmax(last, axis=-1), xp.int64), sample_categorical(last, u_sample, xp))
    return depth, path, xp.astype(nxt, xp.int64), node


def follow_chosen(chosen, D: int, cap, xp):
    """Follow each round's chosen children (B, N+1) (-1: none) from the root for at most D levels, stopping at each
    round's depth cap (B,) (None: no cap). A node without a chosen child points to itself, so a level is one gather
    and the path is read off where the node changed. Returns (path (B, D) accepted nodes by depth, -1 past them;
    depth (B,) accepted; last node (B,))."""
    B, N1 = chosen.shape
    dev = array_api_compat.device(chosen)
    nxt = xp.where(chosen >= 0, chosen, xp.arange(N1, device=dev))               # (B, N+1) next node, or itself
    nodes = [xp.zeros((B,), dtype=xp.int64, device=dev)]
    for _ in range(D):   # a loop over tree levels (gathers of (B,) entries)
        nodes.append(gather(nxt, nodes[-1], xp))
    nodes = xp.stack(nodes, axis=-1)                                             # (B, D + 1) node at each level
    moved = nodes[:, 1:] != nodes[:, :-1]
    if cap is not None:
        moved = moved & (xp.arange(D, device=dev) < cap[:, None])
    path = xp.where(moved, nodes[:, 1:], xp.full_like(nodes[:, 1:], -1))
    depth = xp.sum(xp.astype(moved, xp.int64), axis=-1)
    return path, depth, gather(nodes, depth, xp)


def _vanilla_device(p, q, tokens, u_accept, u_sample, children, D: int, max_depth=None, draft_law: str = "point", *,
                    accept=None):
    """Vanilla's walk for arrays that are not numpy (the engine's device path), both draft laws: every node's
    candidates tried at once, rank by rank (``theory.tree.verify_tree_nodes``: the walk's state at a node depends
    only on the node), then the chosen children followed from the root; no read-back. Vanilla's acceptance is read
    at the candidate only (u < p_res(c) / q_j(c): the same bits as min(1, p/q) at c, u < 1) and its residual
    Norm([p_res - q_j]_+) built as ``theory.rules.Residual`` builds it, so the verdict is ``verify_tree``'s. A round
    stopped by its depth cap draws from its last node's own row (no candidate was tried there). Arguments and
    verdict as ``_walk``. ``accept`` (the point law only; None for other laws): a rule whose residual under the point
    law is vanilla's and whose f does not depend on the position (``boosted_walks``: LANTERN++), its acceptance read at
    the candidate (``accept_at``) in place of p_res(c)."""
    if accept is not None and draft_law != "point":
        return None
    xp = namespace(p, tokens)
    dev = array_api_compat.device(p)
    B, N1, V = p.shape
    D, point = int(D), draft_law == "point"
    ch = xp.asarray(children, device=dev)
    K = ch.shape[-1]
    ch = xp.broadcast_to(ch, (B, N1, K))
    tokens = xp.astype(tokens, xp.int64)
    p_res = p
    chosen = xp.full((B, N1), -1, dtype=xp.int64, device=dev)
    ar_V = xp.arange(V, device=dev)
    q_left = q                                                 # the node's q without its rejected siblings
    for j in range(K):   # a loop over candidate ranks, every node of every round at once
        kid = ch[..., j]
        has = (kid >= 0) & (chosen < 0)
        kid_safe = xp.clip(kid, 0, None)                       # (where has is False the candidate is not read)
        c = take_last(tokens, kid_safe, xp)
        hit = ar_V == c[..., None]                             # (B, N+1, V) one-hot of each node's candidate
        u = take_last(u_accept, kid_safe, xp)
        pc = gather(p_res, c, xp)
        if point:                                              # q_j = one-hot(c): f = p_res(c)
            q_j, valid, thr = xp.astype(hit, p.dtype), has, pc
            if accept is not None:                             # (a position-free f: LANTERN's ignores i)
                thr = accept_at(accept, p_res, q_j, 1, c)
        else:                                                  # q_j = Norm(q_left) (all zero once exhausted)
            q_j = _norm(q_left, q_left, xp)
            qc = gather(q_j, c, xp)
            valid = has & (qc > 0)
            thr = pc / qc                                      # (read only where qc > 0)
        acc = valid & (u < thr)
        rej = valid & ~acc
        p_res = xp.where(rej[..., None], _norm(xp.clip(p_res - q_j, 0, None), p_res, xp), p_res)
        if not point:
            q_left = xp.where(rej[..., None] & hit, xp.zeros_like(q_left), q_left)
        chosen = xp.where(acc, kid, chosen)
    cap = None if max_depth is None else xp.astype(xp.asarray(max_depth, device=dev), xp.int64)
    path, depth, node = follow_chosen(chosen, D, cap, xp)
    last = gather_rows(p_res, node, xp)
    if cap is not None:                                        # stopped by the cap: no candidate tried there
        last = xp.where((depth >= cap)[:, None], gather_rows(p, node, xp), last)
    return depth, path, xp.astype(sample_categorical(last, u_sample, xp), xp.int64), node


def _norm(w, fallback, xp):
    """``theory.core.xp.normalize`` (the same bits: w / sum(w), ``fallback`` where the sum is 0) in fewer device
    operations, for arrays that are not numpy (a zero row's 0 / 0 is computed, then not taken)."""
    s = xp.sum(w, axis=-1, keepdims=True)
    return xp.where(s > 0, w / s, fallback)


# the walks each rule supplies for itself (``Verifier.walk``): draft law -> its walk on numpy rows, and "device" -> the
# walk on other arrays (both laws; ``theory.tree.verify_round`` picks by the rows' namespace)
VANILLA_WALKS = {"point": partial(_walk, "vanilla"), "without_replacement": partial(host_walk, Vanilla(), Residual()),
                 "device": _vanilla_device}
GREEDY_WALKS = {**{law: partial(_walk, "greedy") for law in DRAFT_LAWS}, "device": _greedy_device}


def _schedule_weight(schedule, pos, rows):
    """The schedule's weights (B,) at positions pos (B,) of rows (B, V) (``_walk``'s ``weight``)."""
    return _weight_at(schedule, pos, rows, np)


def scaled_walks(schedule) -> dict:
    """The point law's walk of a scaled rule with G* (``theory.rules.scaled``, Cool-SD, UniformRSD, ...): vanilla's
    level walk with the schedule's weight at the candidates' position (``_walk``'s ``weight``; picklable)."""
    return {"point": partial(_walk, "vanilla", weight=partial(_schedule_weight, schedule))}


def boosted_walks(boost, accept=None, bound=None) -> dict:
    """The walks of a rule whose residual under the point law is vanilla's and whose acceptance adds ``boost`` to a
    candidate's mass (``_walk``; LANTERN++ as released: ``Lantern.sibling_mass``), for the point law: on numpy rows
    (``bound``: the boost's bound, ``Lantern.sibling_cap``; then the boost only where the bounds do not decide), and
    on others (``accept``, the acceptance itself, whose f must not depend on the position: vanilla's device walk
    reading it at the candidates)."""
    return {"point": partial(_walk, "vanilla", boost=boost, bound=bound),
            **({"device": partial(_vanilla_device, accept=accept)} if accept is not None else {})}


def greedy_chain(p, q, tokens, u_accept, u_sample, n_drafted=None) -> ChainVerdict:
    """Greedy's own chain verdict (``Verifier.chain``): ``theory.rules.verify_chain``'s for f = 1[x = argmax p],
    G = one-hot(argmax p), from the rows' argmaxes alone, on any array namespace. Draft i is accepted iff it is
    the argmax of p_i (u < 1 always passes f = 1, never f = 0); after a rejection at tau + 1 the next token is
    argmax p_{tau+1} (the inverse-CDF draw from a one-hot row); after all n_drafted drafts, a draw from
    p_{n_drafted+1} with u_sample. Arguments and shapes as ``verify_chain`` (q is not read)."""
    xp = namespace(p, tokens)
    dev = array_api_compat.device(p)
    L = tokens.shape[-1]
    top = xp.argmax(p, axis=-1)                                                 # (..., L+1) argmax of each row
    ok = xp.astype(tokens, xp.int64) == top[..., :L]
    rejected = ~ok
    if n_drafted is None:
        cap = xp.full(tokens.shape[:-1], L, dtype=xp.int64, device=dev)
    else:
        cap = xp.astype(xp.asarray(n_drafted, device=dev), xp.int64)
        rejected = rejected & (xp.arange(L, device=dev) < cap[..., None])
    first = xp.astype(xp.argmax(xp.astype(rejected, xp.int8), axis=-1), xp.int64)
    tau = xp.where(xp.any(rejected, axis=-1), first, cap)
    bonus = sample_categorical(gather_rows(p, tau, xp), u_sample, xp)
    nxt = xp.where(tau == cap, bonus, xp.astype(gather(top, tau, xp), xp.int64))
    return ChainVerdict(tau, nxt, xp.astype(ok, p.dtype))

