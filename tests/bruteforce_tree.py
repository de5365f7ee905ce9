"""Independent brute-force reference for tree drafting (tests/test_tree_likelihood.py): whole sequences of tree rounds
enumerated with plain Python loops (every candidate draw, accept / reject outcome and final token), as
docs/theory.md section 9 describes the walk, with rules given as scalar functions. Nothing here imports the package
under test."""
from __future__ import annotations

import itertools

import numpy as np


def _norm(v):
    t = sum(v)
    return [a / t for a in v]


def process_law(prow, qrow, f_rule, g_rule, T, convention, candidates, tree_at, given_law="point"):
    """Law of the T emitted tokens (dict tuple -> prob) by enumerating whole tree rounds: every candidate draw, accept /
    reject outcome and final token. prow(prefix) -> target row; qrow(prefix, d) -> draft row of a node of depth d whose
    path ends the prefix; tree_at(prefix) -> (children: dict node -> child nodes in rank order, token: dict node ->
    token or None, depth D): the round's tree (tokens given: dynamic trees, point law; None: drafted by
    ``candidates``, "topk" (point law) or "sampled" (without replacement)). Given tokens are verified with
    ``given_law``: "point" (q_j = one-hot(c_j)) or "drawn" (the candidates were drawn without replacement from the
    node's q row: q_j = Norm(q without c_1..c_{j-1}); a candidate with q_j(c_j) = 0 is skipped). ``tree_at`` may
    return a list of (weight, tree) instead: the round draws its tree from that finite law (weights summing to 1).
    A round starting with n tokens cuts its tree at min(D, T - n - 1) (0 at n = 0 under "eagle")."""
    V = len(prow(()))
    law: dict[tuple, float] = {}
    memo: dict[tuple, dict] = {}

    def round_law(prefix):
        if prefix in memo:
            return memo[prefix]
        trees = tree_at(prefix)
        if isinstance(trees, list):                    # a finite law of trees: the mixture of their round laws
            out: dict[tuple, float] = {}
            for wt, tr in trees:
                for em, pr in one_round(prefix, *tr).items():
                    out[em] = out.get(em, 0.0) + wt * pr
        else:
            out = one_round(prefix, *trees)
        memo[prefix] = out
        return out

    def one_round(prefix, kids_of, token_of, D):
        n = len(prefix)
        cap = 0 if (convention == "eagle" and n == 0) else min(D, T - n - 1)
        out: dict[tuple, float] = {}

        def emit(path, row, prob):
            for x, v in enumerate(_norm(row)):
                if v > 0 and prob > 0:
                    out[path + (x,)] = out.get(path + (x,), 0.0) + prob * v

        def node(nd, path, prob):
            d = len(path)
            kids = kids_of.get(nd, []) if d < cap else []
            cur = prefix + path
            p = list(prow(cur))
            if not kids:                               # a leaf (or the cut): bonus token from the node's row
                emit(path, p, prob)
                return
            if token_of is not None or candidates == "topk":
                if token_of is not None:
                    cands = [token_of[k] for k in kids]
                else:
                    q = qrow(cur, d)
                    cands = sorted(range(V), key=lambda y: (-q[y], y))[: len(kids)]
                pj, s = p, prob
                left = list(qrow(cur, d)) if token_of is not None and given_law == "drawn" else None
                for k, c in zip(kids, cands):
                    if left is None:                   # point law: q_j = one-hot(c_j)
                        qj = [1.0 if y == c else 0.0 for y in range(V)]
                    else:                              # drawn: the rest of q, renormalised
                        if sum(left) == 0 or left[c] == 0:
                            continue                   # a candidate the row cannot draw is skipped
                        qj = _norm(left)
                        left = [0.0 if y == c else left[y] for y in range(V)]
                    f = f_rule(d + 1, pj, qj)
                    if f[c] > 0:
                        node(k, path + (c,), s * f[c])
                    if f[c] == 1:
                        return
                    pj, s = g_rule(pj, qj, f, c), s * (1 - f[c])
                emit(path, pj, s)
                return

            def try_(j, pj, left, pr):                 # candidate j drawn from Norm(q without earlier candidates)
                if pr == 0:
                    return
                if j == len(kids) or sum(left) == 0:
                    emit(path, pj, pr)
                    return
                qj = _norm(left)
                f = f_rule(d + 1, pj, qj)
                for c in range(V):
                    if qj[c] == 0:
                        continue
                    if f[c] > 0:
                        node(kids[j], path + (c,), pr * qj[c] * f[c])
                    if f[c] < 1:
                        try_(j + 1, g_rule(pj, qj, f, c), [0.0 if y == c else left[y] for y in range(V)],
                             pr * qj[c] * (1 - f[c]))
            try_(0, p, list(qrow(cur, d)), prob)

        node(0, (), 1.0)
        return out

    def run(prefix, prob):
        if len(prefix) >= T:
            law[prefix] = law.get(prefix, 0.0) + prob
            return
        for em, pr in round_law(prefix).items():
            run(prefix + em, prob * pr)

    run((), 1.0)
    return law


def static_tree_at(paths):
    idx = {(): 0, **{pth: i + 1 for i, pth in enumerate(sorted(paths, key=lambda t: (len(t), t)))}}
    kids = {}
    for pth in sorted(paths, key=lambda t: (len(t), t)):
        kids.setdefault(idx[pth[:-1]], []).append(idx[pth])
    D = max(len(t) for t in paths)
    return lambda prefix: (kids, None, D)


def _row(rng, V, zp):
    a = rng.gamma(rng.choice([0.3, 1.0, 4.0]), size=V)
    a[rng.random(V) < zp] = 0.0
    if a.sum() == 0:
        a[rng.integers(V)] = 1.0
    return a / a.sum()


def context_rows(rng, V, T, D, per_depth, zp):
    """Random rows for every prefix: p(prefix), q(prefix, d) (independent of d unless per_depth; some q = p)."""
    pres = [pre for n in range(T + 1) for pre in itertools.product(range(V), repeat=n)]
    P = {pre: _row(rng, V, zp) for pre in pres}
    Q = {(pre, d): _row(rng, V, zp) for pre in pres for d in range(D)}
    same = {pre: rng.random() < 0.2 for pre in pres}
    return (lambda pre: P[pre[:T]],
            lambda pre, d: P[pre[:T]] if same[pre[:T]] else Q[(pre[:T], d if per_depth else 0)])


def all_sequences(V, T):
    return np.array(list(itertools.product(range(V), repeat=T)), dtype=np.int64)


def teacher_rows(prow, qrow, seqs, D, per_depth):
    """p (S, T, V); q (S, T, D, V) with q[n, d] = qrow(x_<n+d, d) (NaN where n + d >= T: never read), or (S, T, V)."""
    S, T = seqs.shape
    p = np.array([[prow(tuple(s[:t])) for t in range(T)] for s in seqs])
    if not per_depth:
        return p, np.array([[qrow(tuple(s[:t]), 0) for t in range(T)] for s in seqs])
    V = p.shape[-1]
    q = np.full((S, T, D, V), np.nan)
    for i, s in enumerate(seqs):
        for n, d in itertools.product(range(T), range(D)):
            if n + d < T:
                q[i, n, d] = qrow(tuple(s[: n + d]), d)
    return p, q
