"""T10-T11 for static trees (theory.likelihood.recorded.predict_tree_rounds): averaged over every way the tree's
candidates can be drafted (without replacement, enumerated exactly), the per-round estimates equal the
exact expected accepted drafts of ``theory.tree.tree_round`` (an independent enumeration), the bound
estimate is >= the exact one-round TV and 0 for vanilla, and a chain-shaped tree gives T10-T11 of
``predict_rounds`` exactly."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import rules
from theory.likelihood.recorded import predict_rounds, predict_tree_rounds
from theory.tree import Tree, chain_tree, tree_round

TOL = 1e-10
TREES = [Tree(((0,), (1,), (0, 0))), Tree(((0,), (1,), (2,), (0, 0), (1, 0))), Tree(((0,), (1,), (0, 0), (0, 1)))]


def _drafts(Q, tree, s):
    """Every assignment of tokens to the tree's nodes with its probability: each node's children are a
    sequential draw without replacement from Q[node token]. Returns tokens (M, N+1), weights (M,)."""
    V, N = Q.shape[0], tree.n_nodes
    out_t, out_w = [], []
    for assign in itertools.product(range(V), repeat=N):
        toks = np.array((s,) + assign)
        w = 1.0
        for n in range(N + 1):
            kids = [int(k) for k in tree.children[n] if k >= 0]
            row = Q[toks[n]].copy()
            for k in kids:
                tot = row.sum()
                if tot <= 0 or row[toks[k]] == 0:
                    w = 0.0
                    break
                w *= row[toks[k]] / tot
                row[toks[k]] = 0.0
            if w == 0.0:
                break
        if w > 0:
            out_t.append(toks)
            out_w.append(w)
    return np.array(out_t), np.array(out_w)


def _rows(P, Q, toks):
    return P[toks], Q[toks]


def _verifiers(V, rng):
    nb = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    return [rules.vanilla(), rules.cool_sd(2.5), rules.uniform_rsd(1.7), rules.cool_sd(1.5),
            rules.lantern(nb, 1, 0.3, resample="optimal"), rules.lantern_pp(nb, 1, 2.0)]


@settings(max_examples=12, deadline=None)
@given(st.integers(3, 4), st.sampled_from(range(len(TREES))), st.integers(0, 2**31 - 1))
def test_tree_predictions_average_to_exact_tree_round(V, t, seed):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(V, 0.7), size=V)
    Q = rng.dirichlet(np.full(V, 0.7), size=V)
    tree = TREES[t]
    s = int(rng.integers(V))
    toks, w = _drafts(Q, tree, s)
    assert abs(w.sum() - 1) < 1e-12
    p, q = _rows(P, Q, toks)
    for v in _verifiers(V, rng):
        pred = predict_tree_rounds(p, q, toks, tree, v)
        exact = tree_round(P, Q, tree, v, s)
        assert abs(w @ pred.accepted - exact.expected_accepted) < TOL, v.name
        assert w @ pred.bound >= exact.tv - TOL, v.name           # a bound on the exact one-round TV
        assert np.all(pred.reach[:, 0] == 1) and np.all((pred.reach >= 0) & (pred.reach <= 1 + TOL))
        if v.name == "vanilla":
            assert np.abs(pred.bound).max() < 1e-12


def test_chain_tree_is_t10_t11():
    rng = np.random.default_rng(3)
    R, L, V = 50, 3, 6
    p = rng.dirichlet(np.ones(V), size=(R, L + 1))
    q = rng.dirichlet(np.ones(V), size=(R, L + 1))
    toks = rng.integers(0, V, size=(R, L + 1))
    for v in (rules.cool_sd(2.0), rules.uniform_rsd(0.8), rules.vanilla()):
        a = predict_tree_rounds(p, q, toks, chain_tree(L), v)
        b = predict_rounds(p, q[:, :L], toks[:, 1:], v)
        np.testing.assert_allclose(a.accepted, b.accepted, atol=TOL)
        np.testing.assert_allclose(a.bound, b.bound, atol=TOL)


def test_negative_control_ignoring_residuals_is_detected():
    """Scoring every candidate against the untouched rows (no residual update, no removal from q) is a
    plausible mistake; its average misses the exact E[accepted] of a multi-candidate tree."""
    rng = np.random.default_rng(7)
    V, tree, s = 4, TREES[1], 0
    P = rng.dirichlet(np.full(V, 0.7), size=V)
    Q = rng.dirichlet(np.full(V, 0.7), size=V)
    toks, w = _drafts(Q, tree, s)
    p, q = _rows(P, Q, toks)
    v = rules.vanilla()
    exact = tree_round(P, Q, tree, v, s).expected_accepted
    good = w @ predict_tree_rounds(p, q, toks, tree, v).accepted
    reach = np.ones((len(toks), tree.n_nodes + 1))
    for n in range(tree.n_nodes + 1):
        surv = np.ones(len(toks))
        for k in [int(k) for k in tree.children[n] if k >= 0]:
            f = np.minimum(1, p[:, n, :] / q[:, n, :])[np.arange(len(toks)), toks[:, k]]
            reach[:, k] = reach[:, n] * surv * f
            surv = surv * (1 - f)
    wrong = w @ reach[:, 1:].sum(1)
    assert abs(good - exact) < TOL and abs(wrong - exact) > 1e-3


def test_shapes_are_checked():
    tree = TREES[0]
    with pytest.raises(ValueError, match="N\\+1"):
        predict_tree_rounds(np.ones((2, 3, 4)) / 4, np.ones((2, 4, 4)) / 4, np.zeros((2, 4), int), tree, rules.vanilla())
