"""Exact theory of one tree round on small Markov chains (T2 and T7 for trees, section 9): the expected accepted
drafts and the output law, by enumerating every ordered candidate tuple at every node.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .shapes import Tree

__all__ = ["TreeRound", "tree_round"]


class TreeRound(NamedTuple):
    expected_accepted: float   # E[accepted drafts] in one tree round
    law: np.ndarray            # law of the next D+1 tokens (virtually extended by P), shape (V,)*(D+1)
    target_law: np.ndarray     # the target's law of D+1 tokens
    tv: float                  # TV(law, target_law)


def tree_round(P, Q, tree: Tree, verifier, s: int, max_states: int = 10**6) -> TreeRound:
    """Exact E[accepted] (T2 for trees) and output law (T7 for trees) of one tree round on Markov chains P, Q from start state s,
    by enumerating every ordered candidate tuple at every node (memoised on (node, last token)).
    Cost grows like N V^(K+D+1); meant for small V (it refuses above ``max_states`` array entries)."""
    from ..core import checks
    from .shapes import Tree as _Tree

    checks.instance("tree_round: tree", tree, _Tree, "a theory.tree.Tree")
    checks.verifier(verifier, "tree_round: verifier")
    P = checks.float_array("tree_round: P", P, ndim=2)[0]
    Q = checks.float_array("tree_round: Q", Q, ndim=2)[0]
    V, D = P.shape[0], tree.depth
    if V ** (D + 1) * tree.children.shape[1] > max_states:
        raise ValueError(f"tree_round: V^(D+1) x K = {V}^{D + 1} x {tree.children.shape[1]} exceeds max_states={max_states}")

    def extend(row, remaining):
        """law over `remaining` tokens: the first from `row`, the rest from P."""
        law = row
        for _ in range(remaining - 1):
            law = _chain_extend(law, P)
        return law

    memo: dict = {}

    def at(node, s_last, d):
        """(E[accepted below], law of the next D+1-d tokens) on entering `node` after token s_last."""
        key = (node, s_last)
        if key not in memo:
            kids = [int(k) for k in tree.children[node] if k >= 0]
            p0 = P[s_last]
            if not kids:
                memo[key] = (0.0, extend(p0, D + 1 - d))
            else:
                memo[key] = try_candidates(kids, 0, p0, Q[s_last], d)
        return memo[key]

    def try_candidates(kids, j, pj, qj, d):
        """Candidates j, j+1, ... at a node, given the residual pj and the remaining draft row qj."""
        rem = D + 1 - d
        if j == len(kids) or qj.sum() == 0:   # all tried (or the draft's support exhausted)
            return 0.0, extend(pj, rem)
        f = np.asarray(verifier.accept(pj, qj, d + 1))
        e, law = 0.0, np.zeros((V,) * rem)
        for c in np.flatnonzero(qj > 0):       # candidate j is c with probability qj[c]
            if f[c] > 0:
                e_c, law_c = at(kids[j], int(c), d + 1)
                e += qj[c] * f[c] * (1 + e_c)
                law[c] += qj[c] * f[c] * law_c
            if f[c] < 1:
                G = np.asarray(verifier.resample(pj, qj, f, np.int64(c)))
                q_next = qj.copy()
                q_next[c] = 0.0
                tot = q_next.sum()
                e_r, law_r = try_candidates(kids, j + 1, G, q_next / tot if tot > 0 else q_next, d)
                e += qj[c] * (1 - f[c]) * e_r
                law += qj[c] * (1 - f[c]) * law_r
        return e, law

    e, law = at(0, int(s), 0)
    target = extend(P[int(s)], D + 1)
    return TreeRound(e, law, target, 0.5 * float(np.abs(law - target).sum()))


def _chain_extend(law, P):
    """law over k tokens -> law over k+1 tokens, the new token from P given the last one."""
    return law[..., None] * P.reshape((1,) * (law.ndim - 1) + P.shape)
