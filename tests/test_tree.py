"""Static trees and multi-candidate verification: structure, exact theory against the chain case,
Monte-Carlo of the batched walk against the exact enumeration, losslessness with a negative control."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import sim
from theory.markov import chains
from theory import markov, rules
from theory.tree import EAGLE_25, EAGLE_57, Tree, chain_tree, draft_without_replacement, tree_round, verify_tree

SMALL = Tree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))


def test_tree_structure():
    t = Tree(EAGLE_25)
    assert t.n_nodes == 25 and t.depth == 5 and Tree(EAGLE_57).n_nodes == 57
    assert t.children[0].tolist() == [1, 2, 3, 4]                        # four first-level candidates
    M = SMALL.attention_mask
    # node (0,0,0) = 7 sees itself, (0,0) = 4, (0,) = 1 and the root
    assert np.flatnonzero(M[7]).tolist() == [0, 1, 4, 7]
    assert SMALL.position_ids(10).tolist() == [10, 11, 11, 11, 12, 12, 12, 13]
    assert SMALL.path_to(7) == [1, 4, 7]
    for bad, msg in [(((0, 0),), "parent"), (((1,),), "rank 1 without rank 0"), ((), "at least one")]:
        with pytest.raises(ValueError, match=msg):
            Tree(bad)


def test_draft_without_replacement_law():
    """First two draws of the Gumbel-top-k sampler follow q(a) q(b) / (1 - q(a))."""
    q = np.array([0.5, 0.3, 0.2, 0.0])
    n = 200_000
    g = np.random.default_rng(0).gumbel(size=(n, 4))
    d = draft_without_replacement(np.broadcast_to(q, (n, 4)), 2, g)
    assert not np.any(d == 3)
    pairs = [(a, b) for a in range(3) for b in range(3) if a != b]
    exp = np.array([q[a] * q[b] / (1 - q[a]) for a, b in pairs])
    obs = np.array([np.sum((d[:, 0] == a) & (d[:, 1] == b)) for a, b in pairs])
    assert stats.chisquare(obs, exp * n).pvalue > 1e-3
    # the exponential race draws the same candidates from e = exp(-g) (the engine's noise), in numpy and torch
    e = np.exp(-g)
    assert np.array_equal(draft_without_replacement(np.broadcast_to(q, (n, 4)), 2, exponential=e), d)
    qt = torch.as_tensor(q).expand(n, 4)
    assert np.array_equal(draft_without_replacement(qt, 2, exponential=torch.as_tensor(e)).numpy(), d)
    with pytest.raises(ValueError, match="exactly one"):
        draft_without_replacement(q, 2)


def simulate_tree(P, Q, tree, verifier, s, n, seed):
    out = sim.simulate_tree(P, Q, tree, verifier, s, n, seed)
    return out, out.tokens


@pytest.mark.parametrize("verifier", [rules.vanilla(), rules.cool_sd(2.0), rules.uniform_rsd(1.6), rules.typical(0.2, 0.3)],
                         ids=lambda v: v.name)
def test_chain_shaped_tree_equals_chain_theory(verifier):
    P, Q = chains.random_pair(4, 0.4, seed=3)
    F, G = markov.rule_tables(P, Q, 3, verifier)
    r = tree_round(P, Q, chain_tree(3), verifier, 1)
    assert abs(r.expected_accepted - markov.expected_accepted(P, Q, F, 1)) < 1e-12
    assert abs(r.tv - markov.exact_tv(P, Q, F, G, 1)) < 1e-12


def test_lantern_chain_shaped_tree_equals_chain_theory():
    P, Q = chains.random_pair(5, 0.4, seed=4)
    nb = rules.lantern_neighbors(np.random.default_rng(0).normal(size=(5, 2)))
    for v in (rules.lantern(nb, 2, 0.3), rules.lantern_pp(nb, 2, 2.0)):
        F, G = markov.rule_tables(P, Q, 2, v)
        r = tree_round(P, Q, chain_tree(2), v, 0)
        assert abs(r.expected_accepted - markov.expected_accepted(P, Q, F, 0)) < 1e-12
        assert abs(r.tv - markov.exact_tv(P, Q, F, G, 0)) < 1e-12


@pytest.mark.parametrize("verifier", [rules.vanilla(), rules.cool_sd(2.5), rules.uniform_rsd(1.6)], ids=lambda v: v.name)
def test_simulated_tree_rounds_match_exact_enumeration(verifier):
    P, Q = chains.ambiguous_pair(5, spread=1.0, tv=0.5, seed=2)
    exact = tree_round(P, Q, SMALL, verifier, 2)
    n = 40_000
    out, seq = simulate_tree(P, Q, SMALL, verifier, 2, n, seed=11)
    se = out.accepted.std() / np.sqrt(n)
    assert abs(out.accepted.mean() - exact.expected_accepted) < 4 * se, (out.accepted.mean(), exact.expected_accepted, se)
    # joint law of the D+1 = 4 output tokens: chi-square against the exact law (cells with expected >= 5)
    idx = np.ravel_multi_index(seq.T, (5,) * 4)
    obs = np.bincount(idx, minlength=5**4)
    exp = exact.law.ravel() * n
    keep = exp >= 5
    chi = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum() + (obs[~keep].sum() - exp[~keep].sum()) ** 2 / max(exp[~keep].sum(), 1e-300)
    assert stats.chi2.sf(chi, keep.sum()) > 1e-4


def test_vanilla_tree_is_lossless_and_a_wrong_residual_is_detected():
    """Vanilla multi-candidate verification reproduces P (chi-square); the same walk with the target row
    as 'residual' (a plausible bug) is biased, and the same test must detect it."""
    P, Q = chains.random_pair(4, 0.6, seed=5)
    n = 60_000

    def pvalue(verifier):
        _, seq = simulate_tree(P, Q, SMALL, verifier, 0, n, seed=21)
        target = tree_round(P, Q, SMALL, rules.vanilla(), 0).target_law.ravel()
        obs = np.bincount(np.ravel_multi_index(seq.T, (4,) * 4), minlength=4**4)
        keep = target * n >= 5
        return stats.chisquare(obs[keep], target[keep] * n * obs[keep].sum() / (target[keep] * n).sum()).pvalue

    assert tree_round(P, Q, SMALL, rules.vanilla(), 0).tv < 1e-12
    assert pvalue(rules.vanilla()) > 1e-3
    buggy = rules.Verifier(rules.Vanilla(), rules.Target(), "vanilla-with-target-resampling")
    assert tree_round(P, Q, SMALL, buggy, 0).tv > 0.02     # the bug really is lossy ...
    assert pvalue(buggy) < 1e-6                            # ... and the test sees it


def test_greedy_tree_walk_follows_the_argmax():
    P, Q = chains.random_pair(6, 0.3, seed=8)
    out, seq = simulate_tree(P, Q, Tree(EAGLE_25), rules.greedy(), 0, 2000, seed=1)
    # every accepted token, and the correction token after a rejection, is the target's argmax after
    # its prefix (after a leaf the bonus token is drawn from the target row, as in chain SD)
    t = Tree(EAGLE_25)
    not_leaf = t.children[out.last_node, 0] >= 0
    for d in range(5):
        prev = np.zeros(len(seq), np.int64) if d == 0 else seq[:, d - 1]
        live = (out.accepted > d) | ((out.accepted == d) & not_leaf)
        assert live.sum() > 0 and np.all(seq[live, d] == P[prev[live]].argmax(1))


def test_verify_tree_same_on_torch():
    torch = pytest.importorskip("torch")
    P, Q = chains.random_pair(5, 0.5, seed=9)
    rng = np.random.default_rng(0)
    n, N = 500, SMALL.n_nodes
    tokens = rng.integers(5, size=(n, N + 1))
    args = (P[tokens], Q[tokens], tokens, rng.random((n, N + 1)), rng.random(n))
    nb = rules.lantern_neighbors(rng.normal(size=(5, 2)))
    for v in (rules.vanilla(), rules.cool_sd(2.0), rules.lantern_pp(nb, 2, 2.0), rules.greedy()):
        a = verify_tree(*args, SMALL, v)
        b = verify_tree(*(torch.as_tensor(x) for x in args), SMALL, v)
        for x, y in zip(a, b):
            assert np.array_equal(x, y.numpy()), v.name


def test_verify_tree_early_exit_changes_nothing():
    """``early_exit=True`` (used by the real engine, batch 1) stops the walk once every round is done: same
    verdicts as the full static loop, on batches (numpy, torch) and on single rounds, for every rule kind."""
    torch = pytest.importorskip("torch")
    P, Q = chains.random_pair(5, 0.5, seed=10)
    rng = np.random.default_rng(1)
    t = Tree(EAGLE_25)
    n, N = 300, t.n_nodes
    tokens = rng.integers(5, size=(n, N + 1))
    args = (P[tokens], Q[tokens], tokens, rng.random((n, N + 1)), rng.random(n))
    nb = rules.lantern_neighbors(rng.normal(size=(5, 2)))
    for v in (rules.vanilla(), rules.cool_sd(2.0), rules.lantern_pp(nb, 2, 2.0), rules.greedy()):
        full = verify_tree(*args, t, v)
        for x, y in zip(full, verify_tree(*args, t, v, early_exit=True)):
            assert np.array_equal(x, y), v.name
        for i in range(0, n, 37):   # batch-1 rounds on torch, as the engine calls it
            one = verify_tree(*(torch.as_tensor(a[i:i + 1]) for a in args), t, v, early_exit=True)
            for x, y in zip(full, one):
                assert np.array_equal(x[i:i + 1], y.numpy()), v.name


def test_simulate_tree_is_seeded_and_checks_input():
    P, Q = chains.random_pair(4, 0.4, seed=0)
    a = sim.simulate_tree(P, Q, SMALL, rules.vanilla(), 0, 300, seed=3)
    b = sim.simulate_tree(P, Q, SMALL, rules.vanilla(), 0, 300, seed=3)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.accepted, b.accepted)
    with pytest.raises(ValueError, match="n_rounds"):
        sim.simulate_tree(P, Q, SMALL, rules.vanilla(), 0, 0)
    with pytest.raises(ValueError, match="row-stochastic"):
        sim.simulate_tree(P * 2, Q, SMALL, rules.vanilla(), 0, 10)
    with pytest.raises(ValueError, match="candidates but V=4"):
        sim.simulate_tree(P, Q, Tree(EAGLE_57), rules.vanilla(), 0, 10)
