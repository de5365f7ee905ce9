"""Whole sequences of tree rounds on order-1 Markov chains, run as the engine runs them (drafting level by level,
``theory.tree.verify_tree`` with the per-round depth cap), and a pooled chi-square: the simulator side of
tests/test_tree_likelihood.py."""
from __future__ import annotations

import numpy as np
from scipy import stats

from theory.tree import draft_without_replacement, verify_tree


def simulate(P, Q, tree, verifier, T, S, seed, candidates, convention="eagle"):
    """S sequences of T tokens from whole tree rounds on an order-1 chain, as the engine runs them: P (V, V) target
    rows by last token (start state 0), Q (D, V, V) draft rows by node depth and token; a round starting with n tokens
    drafts the tree (top-m by stable argsort, or draft_without_replacement with Exp(1) noise) and is verified by
    theory.tree.verify_tree with its depth cap D'(n) (max_depth); round 0 under "eagle" is a target step alone."""
    rng = np.random.default_rng(seed)
    N, D = tree.n_nodes, tree.depth
    out = np.zeros((S, T), np.int64)
    n = np.zeros(S, np.int64)
    rows = np.arange(S)
    law = "point" if candidates == "topk" else "without_replacement"
    while np.any(n < T):   # a loop over rounds (each emits >= 1 token per unfinished sequence)
        act = n < T
        cap = np.where(act, np.minimum(D, T - n - 1), 0)
        if convention == "eagle":
            cap = np.where(n == 0, 0, cap)
        tok = np.zeros((S, N + 1), np.int64)
        tok[:, 0] = np.where(n > 0, out[rows, np.maximum(n - 1, 0)], 0)
        for nd in range(N + 1):   # parents before children
            kids = tree.children[nd][tree.children[nd] >= 0]
            if len(kids):
                qr = Q[tree.node_depth[nd]][tok[:, nd]]
                tok[:, kids] = (np.argsort(-qr, axis=1, kind="stable")[:, : len(kids)] if candidates == "topk" else
                                draft_without_replacement(qr, len(kids), exponential=rng.exponential(size=qr.shape)))
        qrows = Q[np.minimum(tree.node_depth, D - 1)][np.arange(N + 1), tok]      # leaves' rows: unused
        res = verify_tree(P[tok], qrows, tok, rng.random((S, N + 1)), rng.random(S), tree, verifier, max_depth=cap,
                          draft_law=law)
        for d in range(D):   # commit the accepted path, then the next token
            m = act & (res.accepted > d)
            out[rows[m], n[m] + d] = tok[rows[m], res.path[m, d]]
        out[rows[act], np.minimum(n[act] + res.accepted[act], T - 1)] = res.next_token[act]
        n = np.where(act, n + res.accepted + 1, n)
    return out


def chi2_pvalue(counts, probs):
    """Pearson chi-square p-value of counts against probs (cells with expected < 5 pooled)."""
    e = counts.sum() * probs
    small = e < 5
    obs, exp = np.append(counts[~small], counts[small].sum()), np.append(e[~small], e[small].sum())
    keep = exp > 0
    if np.any(obs[~keep] > 0):
        return 0.0
    return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue
