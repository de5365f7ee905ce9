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

import threading
from functools import partial

import numpy as np

from .lantern import Lantern
from .lantern_at import upper
from .prefix_mass import prefix_rows, whole_bounds, whole_slack
from .walks import _walk

__all__ = ["delta_level", "lantern_walks", "CANCEL", "RANK_BY_RANK"]

CANCEL = 1e-6     # below this fraction of the row's mass left, the level gives way to the generic walk
RANK_BY_RANK = 1 << 14    # above this many (entries x neighbours) a level is settled rank by rank (``_by_rank``)
ROUNDS_APART = 16         # up to this many rounds trying a level of many entries, it is settled round by round
#                           (``_one_round``: a rejected sibling costs a gather, a sum and a scatter of k + 1 masses and
#                           a few scalar steps, below a rank-by-rank pass's ~40 numpy calls per rank at B = 16 and
#                           k = 1,000; bench_relaxed_verify); fewer entries take the stamps layout (one round alone:
#                           ``_one_round``)


def delta_level(acc: Lantern, B: int, V: int, K: int, every_t: bool = False, one_round: bool = True):
    """The level step of LANTERN's released walk under the point law (module note) for a walk over B rounds of rows
    with V codes and nodes of at most K children: ``step(pr, c, has, u)`` with pr (R, V) the nodes' rows of R <= B
    rounds, c (R, K) their candidates in rank order, has (R, K) bool tried (a prefix of the ranks), u (R, K) their
    uniforms returns (ok (R, K) bool, whose first True in a row is the round's first accepted sibling; clear(stop, pr),
    which zeroes in pr, for the rounds stop (R,) bool that accepted none, the codes their residual lacks), or None (the
    generic walk serves). numpy rows. A level that one round tries, or at most ``ROUNDS_APART`` rounds of more than
    ``RANK_BY_RANK`` (entries x neighbours) in all, is settled on their scalars, round after round (``_one_round``;
    unless ``every_t``, or ``one_round`` is False: then by the layouts, as tests compare them); other levels by the
    layouts (rank by rank, ``_by_rank``, above ``RANK_BY_RANK``; else the stamps). After a step of the stamps
    layout, and any step with ``every_t``, ``step.last`` = (live (n,) the rounds that tried a candidate, thresholds
    (n K,) float64 each sibling's acceptance threshold, round-major; those
    after a round's first accepted one are not meaningful; by default a sibling's admitted mass A_j is summed only
    where the bounds [p'(c_j), p'(c_j) + thr_j] / m_j do not decide it, and its threshold is the lower bound elsewhere:
    ``every_t`` sums every tried sibling's, for inspection))."""
    k = acc.k
    table = np.asarray(acc.neighbors)
    table = table if table.shape[1] == k + 1 else table[:, : k + 1]
    # per code of each round: off + K - (the rank of the first sibling whose removal set lists it), off the pass's
    # offset (earlier passes' and walks' entries are below it): sibling j meets the code zeroed iff its entry is
    # > off + K - j
    first, back, base_all = _stamps(B, V, K)     # (back: K - an entry's rank; base_all: its row start, all live)
    dummy = B * V                                   # (the neighbours of siblings not admitted, or not tried)

    def step(pr, c, has, u):
        R = pr.shape[0]                             # (the rounds given: at most B)
        dt = pr.dtype
        z = dt.type(0)
        live = np.flatnonzero(has[:, 0])
        n = live.size
        if n == 0:
            return np.zeros((R, K), bool), _nothing
        whole = n == R
        h = has if whole else has[live]
        if (h[:, 1:] > h[:, :-1]).any():            # not a prefix of the ranks
            return None
        many = n * K * (k + 1) > RANK_BY_RANK                                  # many entries (LlamaGen's k)
        if (n == 1 or many and n <= ROUNDS_APART) and not every_t and one_round:   # each round on its scalars
            ok = _one_round(acc, table, pr, c, has, u, live.tolist(), np.zeros((R, K), bool))
            return None if ok is None else (ok, _nothing)
        if many:                                                                # many entries: rank by rank
            return _by_rank(acc, table, pr, c, has, u, live, K, every_t, step)
        m_ = n * K
        cl, hm = (c if whole else c[live]).reshape(-1), h.reshape(-1)          # (m,) entries: round-major
        base = base_all[:m_] if whole else np.repeat(live * V, K)
        fc = base + cl                                                          # flat entries of the c_j in pr
        fn = np.take(table, cl, axis=0)                                         # (m, k+1): their nearest,
        if R > 1:
            fn += base[:, None]                                                 # flat (in place: one array)
        prf = pr.reshape(-1)
        gc, gn = prf[fc], prf[fn]
        total = (pr if whole else pr[live]).sum(-1).astype(np.float64)          # (n,) the row's mass
        uu = (u if whole else u[live]).reshape(-1)
        adm, every = None, hm.all()                                             # assumed first: all admitted
        for _ in range(K + 1):   # a loop over fixed-point passes (one when the assumption holds; at most K + 1)
            off, first.off = first.off, first.off + K     # (this pass writes off + 1 .. off + K: above every stamp)
            val = back[:m_] + off                                               # (the earliest rank: the largest)
            wn = fn if every else np.where((hm if adm is None else hm & adm)[:, None], fn, dummy)
            np.maximum.at(first.a, wn.reshape(-1), np.repeat(val, k + 1))
            np.maximum.at(first.a, fc if every else np.where(hm, fc, dummy), val)
            pz = np.where(first.a[fc] > val, z, gc)                             # (m,) p'(c_j)
            gz = np.where(first.a[fn] > val[:, None], z, gn)                    # (m, k+1) p' at N_{k+1}(c_j)
            nsum = gz.sum(-1, dtype=np.float64)
            taken = pz + (nsum if adm is None else np.where(adm, nsum, 0.0))   # t_j (float64)
            ma = np.empty((n, K + 1))                                           # [1, mass left after each]
            ma[:, 0] = 1.0
            np.subtract(total[:, None], np.cumsum(taken.reshape(n, K), -1), out=ma[:, 1:])
            after, m = ma[:, 1:], ma[:, :-1].reshape(-1)                        # m_j (the first: the row itself)
            if acc.delta is not None:   # (compared in the rows' dtype, the first sibling's as ``verify_tree`` does:
                thr = (acc.delta * m).astype(dt)                                # m_1 = 1, delta itself)
            else:
                thr = (acc.lam - 1.0) * pz
            mm = np.maximum(m, 1e-300)                                          # (m tiny: returned None below)
            t = pz / mm                                                         # the threshold with A_j = 0 ...
            a = hm & (uu < t)                                                   # ... accepted whatever A_j is
            # A_j in [0, thr_j]: u_j >= (p'(c_j) + thr_j) / m_j rejects whatever A_j is (section 9b): A_j where it
            # decides (a is within hm: hm ^ a, the tried siblings not accepted yet)
            need = hm if every_t else (hm ^ a) & (uu < upper(pz, thr) / mm)
            if need.any():
                e = np.flatnonzero(need)
                t[e] = (pz[e] + prefix_rows(gz[e, :k], thr[e], dt)) / mm[e]
                a[e] = uu[e] < t[e]
            rejected = hm & ~np.logical_or.accumulate(a.reshape(n, K), 1).ravel()   # tried before the first accepted
            now = gz[:, 0] <= thr                                               # adm_j, given the assumed earlier
            if not (rejected & ~now if adm is None else rejected & (now != adm)).any():
                break
            adm = now if adm is None else np.where(rejected, now, adm)
            every = False
        else:
            return None
        # the mass left after each rejected sibling (it never grows: the last one's is the least)
        if (rejected.reshape(n, K) & (after <= CANCEL * total[:, None])).any():
            return None
        step.last = (live, t)
        a = a.reshape(n, K)
        if whole:
            ok = a
        else:
            ok = np.zeros((R, K), bool)
            ok[live] = a

        def clear(stop, rows):
            """Zero, in ``rows`` (B, V): the rows pr given to the step (the walk's own copy, C-ordered), for the rounds
            of ``stop``, the codes their rejections removed (every candidate tried was rejected there), at the flat
            entries read above."""
            out = np.repeat(stop[live], K) & hm                                 # their tried entries
            rf = rows.reshape(-1)
            rf[fc[out]] = 0
            sel = out if adm is None else out & adm                             # (N_{k+1}(c_j) where admitted)
            rf[fn if sel.all() else fn[sel]] = 0

        return ok, clear

    return step


class _Stamps:
    """A stamp array (int32, zeros at first) and the bound ``off`` its stamps are at most (``delta_level``)."""
    def __init__(self, size: int):
        self.a, self.off = np.zeros(size, np.int32), 0


_LOCAL = threading.local()      # per thread: {(B, V, K): (stamps, back, base)}, reused across walks


def _stamps(B: int, V: int, K: int):
    """This thread's stamps of B V + 1 entries (shared by the walks of that size: stale stamps are at most its offset;
    new when the offset nears the int32 range), and the entries' K - rank (int32) and row starts (entries round-major)."""
    cache = _LOCAL.__dict__.setdefault("stamps", {})
    got = cache.get((B, V, K))
    if got is None or got[0].off > 1 << 30:
        if len(cache) >= 8:
            cache.clear()
        st = next((g[0] for key, g in cache.items() if key[0] * key[1] == B * V), None) or _Stamps(B * V + 1)
        if st.off > 1 << 30:
            st = _Stamps(B * V + 1)
        got = cache[(B, V, K)] = (st, (K - np.tile(np.arange(K), B)).astype(np.int32), np.repeat(np.arange(B) * V, K))
    return got


def _by_rank(acc: Lantern, table, pr, c, has, u, live, K: int, every_t: bool, step):
    """``delta_level``'s step rank by rank (a loop over the K sibling ranks, every round still trying at once): sibling
    j of a round reads p' from the row pr itself, in which the rejections of its earlier siblings have zeroed their
    removal sets (so no stamps, and no fixed point: adm_j is known when j is read), and its own rejection zeroes c_j
    and, if admitted, N_{k+1}(c_j) there (its clear has nothing left to do). Every round trying rank j reads its
    N_{k+1}(c_j) (those the bound p'(c_j) / m_j accepts too, when some are not: the walk reads an accepting round's
    node row afresh, so what it zeroes there is not read), whose float64 sum (the mass its rejection takes, if
    admitted) brackets the whole sum of the k nearest in the rows' dtype (``whole_bounds``): A_j is that whole sum
    where its upper bound is <= thr_j, so A_j in [lo, hi] there and in [0, min(thr_j, hi)] elsewhere, and A_j is
    summed (``prefix_rows``) only where (p'(c_j) + those bounds) / m_j, rounded as the threshold is (monotone), do not
    decide; at LlamaGen's shapes (k = 1,000, the whole sum far below delta m_j) hardly ever. The same quantities as the
    fixed-point layout, in the same operations per entry (sums of the same rows, the mass taken accumulated in rank
    order as its cumulative sum): the same bits (tests/test_lantern_walk_rank.py). Few numpy calls per rank (each
    costs about a microsecond, the order of a rank's arithmetic at B = 16): the candidates' flat entries are laid out
    once per level."""
    B, V = pr.shape
    k, dt = acc.k, pr.dtype
    prf = pr.reshape(-1)
    total = np.zeros(B)
    total[live] = (pr if live.size == B else pr[live]).sum(-1)                 # (float32 sums, as the fixed layout)
    s = np.zeros(B)                                                             # the mass taken so far (float64)
    t_all = np.full((B, K), np.nan) if every_t else None
    ok = np.zeros((B, K), bool)
    fcs = c + np.arange(0, B * V, V)[:, None]                                   # (B, K) the candidates' flat entries
    tried = np.logical_and.reduce(has[live]).tolist()                           # rank j: tried by every live round
    slack = whole_slack(k, dt)                                                  # (None: A_j's bounds [0, thr_j])
    rr = live
    for j in range(K):   # a loop over sibling ranks (K <= a handful), the rounds still trying at once
        if j:
            if not tried[j]:
                rr = rr[has[rr, j]]
            n = rr.size
            if n == 0:
                break
            m = (total - s)[rr]                                                 # m_j
            mm = np.maximum(m, 1e-300)
        else:
            n = rr.size
            m = mm = np.ones(n)                                                 # (the first: the row itself)
        fc = fcs[rr, j]
        pz = prf[fc]                                                            # p'(c_j)
        thr = (acc.delta * m).astype(dt) if acc.delta is not None else (acc.lam - 1.0) * pz
        uj = u[rr, j]
        t = pz / mm
        a = uj < t                                                              # accepted whatever A_j is
        if not every_t and np.count_nonzero(a) == n:
            ok[rr, j] = True
            break
        cj = c[rr, j]
        fn = table.take(cj, 0, mode="clip")                                     # (codes: in range, as the entries)
        fn += (fc - cj)[:, None]
        gz = prf.take(fn, mode="clip")                                          # p' at N_{k+1}(c_j)
        nsum = gz.sum(-1, dtype=np.float64)                                     # p'(N_{k+1}(c_j))
        if every_t:
            need = np.ones(n, bool)
        elif slack is None:                                                     # A_j in [0, thr_j]
            need = ~a & (uj < upper(pz, thr) / mm)                              # A_j where it decides
        else:            # A_j in [lo, hi] where hi <= thr_j (the whole sum, ``prefix_rows``), else [0, min(thr_j, hi)]
            lo, hi = whole_bounds(nsum, gz[:, k], slack, dt)
            a |= (hi <= thr) & (uj < (pz + lo) / mm)
            need = ~a & (uj < upper(pz, np.fmin(thr, hi)) / mm)                 # (fmin: a NaN hi decides nothing)
        if np.count_nonzero(need):
            e = need.nonzero()[0]
            t[e] = te = (pz[e] + prefix_rows(gz[e, :k], thr[e], dt)) / mm[e]
            a[e] = uj[e] < te
        if every_t:
            t_all[rr, j] = t
        ok[rr, j] = a
        adm = gz[:, 0] <= thr
        prf[fc] = 0                  # (in the rounds that accepted c_j too: the walk reads their node rows afresh)
        if np.count_nonzero(adm) == n:
            taken = pz + nsum
            prf[fn] = 0
        else:
            taken = pz + np.where(adm, nsum, 0.0)
            prf[fn[adm]] = 0
        rej = ~a
        rr = rr[rej]
        s[rr] += taken[rej]
    # the mass left after each round's last rejected sibling (it never grows: the least of them); a round rejected
    # some sibling iff it rejected the first
    if ((total - s <= CANCEL * total) & ~ok[:, 0])[live].any():
        return None
    if every_t:
        step.last = (live, t_all[live].reshape(-1))
    return ok, _nothing


def _one_round(acc: Lantern, table, pr, c, has, u, rounds, ok):
    """``delta_level``'s step for the rounds ``rounds`` (a list of row indices into pr, c, has, u; a batch-1 walk's one
    round, or the few rounds a level of a batch leaves trying), each on its own scalars: its siblings in rank order, no
    stamps and no fixed point (as ``_by_rank``: sibling j reads p' from the row pr[b] itself, in which its earlier
    siblings' rejections have zeroed their removal sets, so adm_j is known when j is read). A sibling the bounds
    [p'(c_j), p'(c_j) + thr_j] / m_j accept reads no neighbour; each rejected one reads its N_{k+1} once (a view of its
    table row), for the mass it takes and its admission, then zeroes c_j and, if admitted, N_{k+1}(c_j) in pr. Sets
    ok[b, j] (ok (R, K) bool, False on entry) for each round's first accepted sibling; returns ok, or None where a
    round's mass left falls below CANCEL (the generic walk serves). The same operations per entry as the fixed-point
    layout, in its dtypes (numpy scalars of the rows' dtype, float64 Python floats where it computes in float64: the
    row's mass, the mass taken, m_j and the quotients; the mass taken accumulated in rank order as its cumulative sum
    does): the same bits (tests/test_lantern_one_round.py). Python loops over the given rounds and their K sibling
    ranks (a handful): each step is a few scalar operations and, for a rejected sibling, one gather of k + 1 masses,
    one sum and one scatter of zeros (the few rounds' per-round cost is below a rank-by-rank pass's numpy calls)."""
    dt = pr.dtype
    f = dt.type
    delta, k = acc.delta, acc.k
    lam1 = None if delta is not None else acc.lam - 1.0
    f64, add = np.float64, np.add.reduce
    slack = whole_slack(k, dt)                                                  # (None: A_j's bounds [0, thr_j])
    up, dn = (1.0 + slack, 1.0 - slack) if slack is not None else (None, None)
    hs, us, cs = has.tolist(), u.tolist(), c.tolist()                          # (R, K) each: a handful of entries
    for b in rounds:   # a loop over the given rounds (a few)
        ub, cb = us[b], cs[b]
        row = pr[b]                                                             # (V,) a view: zeroes written in pr
        s = total = 0.0         # the mass taken so far and the row's (float64; the row's at the first rejection)
        for j in range(sum(hs[b])):   # a loop over the round's sibling ranks (a prefix: K <= a handful), in order
            x = cb[j]
            pz = row[x]                                                         # p'(c_j), the rows' dtype
            pf = float(pz)
            if j:
                m = total - s                                                   # m_j
                mm = 1e-300 if m < 1e-300 else m                                # (np.maximum: NaN kept)
            else:
                m = mm = 1.0                                                    # (the first: the row itself)
            uj = ub[j]
            if uj < pf / mm:                                                    # accepted whatever A_j is
                ok[b, j] = True
                break
            thr = f(delta * m) if lam1 is None else lam1 * pz
            nbr = table[x]                                                      # (k+1,) N_{k+1}(c_j): a view
            gz = row.take(nbr)                                                  # p' there
            nsum = float(add(gz, dtype=f64))                                    # p'(N_{k+1}(c_j)), as ``_by_rank``
            if up is None:                                                      # A_j in [0, thr_j]
                cap = thr
            else:        # A_j in [lo, hi] where hi <= thr_j (the whole sum, ``whole_bounds``), else [0, min(thr_j, hi)]
                hi = f(nsum * up)
                if hi <= thr:
                    if uj < float(pz + f(nsum * dn - float(gz[k]))) / mm:
                        ok[b, j] = True
                        break
                    cap = hi
                else:
                    cap = thr                                                   # (np.fmin: a NaN hi decides nothing)
            if uj < float(upper(pz, cap)) / mm:                                 # A_j decides
                if uj < float(pz + prefix_rows(gz[None, :k], thr, dt)[0]) / mm:
                    ok[b, j] = True
                    break
            adm = gz[0] <= thr                                                  # adm_j
            taken = pf + (nsum if adm else 0.0)                                 # t_j
            if j:
                s = s + taken
            else:
                s, total = taken, float(row.sum())                              # (float32 sum, as the fixed layout)
            if total - s <= CANCEL * total:                                     # (the mass left after c_j)
                return None
            row[x] = 0
            if adm:
                row[nbr] = 0
    return ok


def _nothing(stop, r):
    """No code to zero (no round tried a candidate at this level)."""


def lantern_walks(acc: Lantern) -> dict:
    """The point law's walk of LANTERN as released (``theory.rules.lantern``): the level walk of ``theory.rules.walks``
    with ``delta_level`` (numpy rows; picklable)."""
    return {"point": partial(_walk, "vanilla", level=partial(delta_level, acc))}
