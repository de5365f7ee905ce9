"""Static-tree rounds on Markov chains (EAGLE-1 / LANTERN++ setting, docs/theory.md section 9).

Drafting draws each node's candidates from the draft row after the node's path, without replacement
(Gumbel top-k); verification is ``theory.tree.verify_tree`` with the real rule objects.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from theory.core import checks
from theory import markov
from theory.tree import Tree, draft_without_replacement, verify_tree


__all__ = ["TreeSimResult", "simulate_tree"]


@dataclass
class TreeSimResult:
    accepted: np.ndarray   # (n,) accepted drafts per round (tokens per target call = accepted + 1)
    tokens: np.ndarray     # (n, D+1) the round's output virtually extended to D+1 tokens by P
    start: np.ndarray      # (n,) start state of each round
    path: np.ndarray       # (n, D) accepted tree nodes by depth, -1 after the last
    last_node: np.ndarray  # (n,) last accepted node (0 = root)


def simulate_tree(P, Q, tree: Tree, verifier, init, n_rounds: int, seed: int | None = 0, *,
                  chunk: int = 8192) -> TreeSimResult:
    """n independent tree rounds (section 9) from start states drawn from ``init`` (int or distribution).

    Vectorised over rounds; loops run over tree nodes (drafting, in breadth-first order) and over the
    static number of verification steps, never over rounds. Same seed, same output.
    """
    P, Q = markov.check_chain(P, Q)
    V = P.shape[0]
    mu = markov.init_distribution(init, V)
    n = checks.count("n_rounds", n_rounds)
    if tree.children.shape[1] > V:
        raise ValueError(f"the tree has a node with {tree.children.shape[1]} candidates but V={V}")
    rng = np.random.default_rng(checks.seed(seed))
    N, D = tree.n_nodes, tree.depth
    out = TreeSimResult(np.empty(n, np.int64), np.empty((n, D + 1), np.int64), np.empty(n, np.int64),
                        np.empty((n, D), np.int64), np.empty(n, np.int64))
    for lo in range(0, n, chunk):
        m = min(chunk, n - lo)
        s = rng.choice(V, size=m, p=mu)
        tokens = np.empty((m, N + 1), np.int64)
        tokens[:, 0] = s
        for node in range(N + 1):  # breadth-first: a parent's token is drawn before its children
            kids = tree.children[node][tree.children[node] >= 0]
            if len(kids):
                tokens[:, kids] = draft_without_replacement(Q[tokens[:, node]], len(kids), rng.gumbel(size=(m, V)))
        res = verify_tree(P[tokens], Q[tokens], tokens, rng.random((m, N + 1)), rng.random(m), tree, verifier)
        seq = np.full((m, D + 1), -1, np.int64)
        live = res.path >= 0
        seq[:, :D] = np.where(live, np.take_along_axis(tokens, np.maximum(res.path, 0), 1), -1)
        seq[np.arange(m), res.accepted] = res.next_token
        for d in range(1, D + 1):  # virtual extension by P after the round's last token
            fill = np.flatnonzero(d > res.accepted)
            c = np.cumsum(P[seq[fill, d - 1]], 1)
            seq[fill, d] = np.minimum((rng.random(len(fill))[:, None] * c[:, -1:] >= c).sum(1), V - 1)
        sl = slice(lo, lo + m)
        out.accepted[sl], out.tokens[sl], out.start[sl], out.path[sl] = res.accepted, seq, s, res.path
        out.last_node[sl] = res.last_node
    return out
