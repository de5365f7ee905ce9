"""Random verification cases shared by tests/test_fast_verify.py and tests/test_tree_nodes.py: target and draft rows
with exact zeros (peaked or flat), static (EAGLE-25) or random per-round trees, tokens the target likes or random ones
(repeated siblings), uniforms and optional depth caps."""
from __future__ import annotations

import numpy as np

from theory.tree import EAGLE_25, Tree, row_trees


def rows(rng, B, N1, V, peaked):
    """(B, N1, V) probability rows, about a fifth of the entries exactly 0, peaked (sharper) or flat."""
    logits = rng.normal(size=(B, N1, V)) * (6.0 if peaked else 1.0)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p[rng.random(p.shape) < 0.2] = 0.0                      # exact zeros
    p[..., 0] += 1e-3                                       # no all-zero row
    return p / p.sum(-1, keepdims=True)


def tree_case(seed, static, V, B=5, max_nodes=30):
    """(p, q, tokens, u_accept, u_sample, tree, cap) for B rounds: EAGLE-25 (static) or random trees of 1 to
    max_nodes - 2 drafted nodes per round; every third seed drafts the target's argmaxes; every fourth caps depths."""
    rng = np.random.default_rng(seed)
    if static:
        tree = Tree(EAGLE_25)
        N1 = tree.n_nodes + 1
    else:
        N1 = int(rng.integers(2, max_nodes))
        parent = np.stack([np.concatenate([[-1], [rng.integers(0, a) for a in range(1, N1)]]) for _ in range(B)])
        tree = row_trees(parent, K=N1, depth=None)
    p = rows(rng, B, N1, V, peaked=bool(seed % 2))
    q = rows(rng, B, N1, V, peaked=False)
    tokens = rng.integers(0, V, size=(B, N1))
    if seed % 3 == 0:                                       # candidates the target likes (long accepted paths)
        tokens = p.argmax(-1)[np.arange(B)[:, None], np.maximum(np.arange(N1) - 1, 0)[None, :]]
    u = rng.random((B, N1))
    us = rng.random(B)
    cap = rng.integers(0, tree.depth + 1, size=B) if seed % 4 == 0 else None
    return p, q, tokens, u, us, tree, cap


def same(a, b) -> bool:
    """Every field of two verdicts equal (numpy or torch)."""
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))
