"""LANTERN as released (absolute delta, its dynamic-path resampler, ``theory.rules.lantern(...)``) under the point draft
law (deterministic candidates, the release's ``qx = 1``): every sibling of a level settled at once in the node row's
own units, O(k) per candidate, with no row renormalised in between (docs/theory/trees.md section 9b, "Closed forms of
a level under the point law"). The level step of ``theory.rules.walks``' level walk (its ``level`` hook).

Candidate c_j of a node with row p meets r_j = p with Z_j zeroed, over m_j: Z_1 = {}, m_1 = 1 (the row itself, as
``verify_tree``), and after rejecting c_j (adm_j: a neighbour admitted)
  Z_{j+1} = Z_j + {c_j} + (N_{k+1}(c_j) if adm_j),   m_{j+1} = sum(p) - sum_{i <= j} t_i,
  t_i = p'(c_i) + adm_i p'(N_{k+1}(c_i))   (p' = p with Z_i zeroed: the mass the rejection of c_i takes),
adm_j = [p'(n_1(c_j)) <= delta m_j] (n_1 the nearest neighbour) and acceptance u_j < (p'(c_j) + A_j) / m_j, A_j the
longest prefix mass of p' over c_j's k nearest whose sum is <= delta m_j (``prefix_rows``). Given the admissions
adm_1, adm_2, ... every sibling's Z_j, m_j and threshold follow at once: a code is in Z_j iff the first sibling whose
removal set lists it ranks before j (a scatter of the ranks keeping the earliest, ``np.maximum.at``, and a gather). The
admissions are found as a fixed point: assume every neighbour admitted (image rows: p(n_1) is far below delta), compute
them, and repeat with the computed ones until the rejected siblings' agree (adm_j depends on adm_1 .. adm_{j-1} only, so
at most K passes). Where the mass left before a tried sibling or after the last falls below ``CANCEL`` of the row's
(cancellation, or an empty residual: the release then draws, and later siblings meet, the uniform row) the level
returns None and the caller takes the generic walk.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from .lantern import Lantern
from .prefix_mass import prefix_rows
from .walks import _walk

__all__ = ["delta_level", "lantern_walks", "CANCEL"]

CANCEL = 1e-6     # below this fraction of the row's mass left, the level gives way to the generic walk


def delta_level(acc: Lantern, B: int, V: int, K: int, every_t: bool = False):
    """The level step of LANTERN's released walk under the point law (module note) for a walk over B rounds of rows
    with V codes and nodes of at most K children: ``step(pr, c, has, u)`` with pr (B, V) the nodes' rows, c (B, K)
    their candidates in rank order, has (B, K) bool tried (a prefix of the ranks), u (B, K) their uniforms returns
    (ok (B, K) bool, whose first True in a row is the round's first accepted sibling; clear(stop, pr), which zeroes in
    pr, for the rounds stop (B,) bool that accepted none, the codes their residual lacks), or None (the
    generic walk serves). numpy rows. After a step, ``step.last`` = (live (n,) the rounds that tried a candidate,
    thresholds (n K,) float64 each sibling's acceptance threshold, round-major; those after a round's first accepted
    one are not meaningful; by default a sibling's admitted mass A_j is summed only where the bounds
    [p'(c_j), p'(c_j) + thr_j] / m_j do not decide it, and its threshold is the lower bound elsewhere: ``every_t`` sums
    every tried sibling's, for inspection))."""
    k = acc.k
    table = np.asarray(acc.neighbors)
    table = table if table.shape[1] == k + 1 else table[:, : k + 1]
    # per code of each round: off + K - (the rank of the first sibling whose removal set lists it), off the pass's
    # offset (earlier passes' entries are below it): sibling j meets the code zeroed iff its entry > off + K - j
    first = np.zeros(B * V + 1, np.int32)
    dummy = B * V                                   # (the neighbours of siblings not admitted, or not tried)
    rank = np.tile(np.arange(K), B)                 # an entry's rank (entries round-major), and K - rank
    back = (K - rank).astype(np.int32)
    lead = rank == 0
    state = {"off": 0}

    def step(pr, c, has, u):
        dt = pr.dtype
        z = np.zeros((), dt)
        live = np.nonzero(has[:, 0])[0]
        n = live.size
        ok = np.zeros((B, K), bool)
        if n == 0:
            return ok, _nothing
        whole = n == B
        h = has if whole else has[live]
        if (h[:, 1:] > h[:, :-1]).any():            # not a prefix of the ranks
            return None
        m_ = n * K
        cl, hm = (c if whole else c[live]).reshape(-1), h.reshape(-1)          # (m,) entries: round-major
        base = np.repeat(live * V, K)
        fc = base + cl                                                          # flat entries of the c_j in pr
        fn = np.take(table, cl, axis=0)                                         # (m, k+1): their nearest,
        fn += base[:, None]                                                     # flat (in place: one array)
        prf = pr.reshape(-1)
        gc, gn = prf[fc], prf[fn]
        total = (pr if whole else pr[live]).sum(-1).astype(np.float64)          # (n,) the row's mass
        uu = (u if whole else u[live]).reshape(-1)
        adm, every = None, hm.all()                                             # assumed first: all admitted
        for _ in range(K + 1):   # a loop over fixed-point passes (one when the assumption holds; at most K + 1)
            off = state["off"] = state["off"] + K + 1
            val = back[:m_] + np.int32(off)                                     # (the earliest rank: the largest)
            wn = fn if every else np.where((hm if adm is None else hm & adm)[:, None], fn, dummy)
            np.maximum.at(first, wn.reshape(-1), np.repeat(val, k + 1))
            np.maximum.at(first, fc if every else np.where(hm, fc, dummy), val)
            pz = np.where(first[fc] > val, z, gc)                               # (m,) p'(c_j)
            gz = np.where(first[fn] > val[:, None], z, gn)                      # (m, k+1) p' at N_{k+1}(c_j)
            nsum = gz.sum(-1, dtype=np.float64)
            taken = pz + (nsum if adm is None else np.where(adm, nsum, 0.0))   # t_j (float64)
            after = total[:, None] - np.cumsum(taken.reshape(n, K), -1)        # (n, K) mass left after each
            m = np.empty((n, K))
            m[:, 0], m[:, 1:] = 1.0, after[:, :-1]                              # m_j (the first: the row itself)
            m = m.reshape(-1)
            if acc.delta is not None:   # (compared in the rows' dtype, the first sibling's as ``verify_tree`` does)
                thr = np.where(lead[:m_], acc.delta, acc.delta * m).astype(dt)
            else:
                thr = (acc.lam - 1.0) * pz
            mm = np.maximum(m, 1e-300)                                          # (m tiny: returned None below)
            t = pz / mm                                                         # the threshold with A_j = 0 ...
            a = hm & (uu < t)                                                   # ... accepted whatever A_j is
            sure = np.repeat(np.where((s := a.reshape(n, K)).any(-1), s.argmax(-1), K), K)
            # A_j in [0, thr_j]: u_j >= (p'(c_j) + thr_j) / m_j rejects whatever A_j is (section 9b): A_j where it decides
            need = hm if every_t else hm & ~a & (uu < (pz + thr) / mm) & (rank[:m_] < sure)
            if need.any():
                e = np.flatnonzero(need)
                t[e] = (pz[e] + prefix_rows(gz[e, :k], thr[e], dt)) / mm[e]
                a[e] = uu[e] < t[e]
            a = a.reshape(n, K)
            fa = np.where(a.any(-1), a.argmax(-1), K)                           # first accepted rank (K: none)
            rejected = hm & (rank[:m_] < np.repeat(fa, K))
            now = gz[:, 0] <= thr                                               # adm_j, given the assumed earlier
            if not (rejected & ~now if adm is None else rejected & (now != adm)).any():
                break
            adm = now if adm is None else np.where(rejected, now, adm)
            every = False
        else:
            return None
        met = np.minimum(fa, h.sum(-1))                                        # residuals met after the first
        low = after[np.arange(n), np.maximum(met - 1, 0)] <= CANCEL * total     # (the mass left never grows)
        if (low & (met > 0)).any():
            return None
        step.last = (live, t)
        ok[live] = a

        def clear(stop, rows):
            """Zero, in ``rows`` (B, V): the rows pr given to the step (the walk's own copy, C-ordered), for the rounds
            of ``stop``, the codes their rejections removed (every candidate tried was rejected there), at the flat
            entries read above."""
            out = np.repeat(stop[live], K) & hm                                 # their tried entries
            rf = rows.reshape(-1)
            rf[fc[out]] = 0
            rf[fn[out if adm is None else out & adm]] = 0                       # (N_{k+1}(c_j) where admitted)

        return ok, clear

    return step


def _nothing(stop, r):
    """No code to zero (no round tried a candidate at this level)."""


def lantern_walks(acc: Lantern) -> dict:
    """The point law's walk of LANTERN as released (``theory.rules.lantern``): the level walk of ``theory.rules.walks``
    with ``delta_level`` (numpy rows; picklable)."""
    return {"point": partial(_walk, "vanilla", level=partial(delta_level, acc))}
