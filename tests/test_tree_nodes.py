"""theory.tree.verify_tree_nodes: every node's candidates tried at once, then the chosen children followed from the
root (a fixed count of array operations, no read-back: the engine's device path). It must give verify_tree's verdict
(the walk, one candidate per step) for every rule, both draft laws, static and per-round trees, depth caps, repeated
sibling tokens and exact zeros, on numpy and torch arrays; a control with the residual update left out (resampling
G = p) must be told apart. The greedy device walk (theory.rules.walks) is checked the same way."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import rules
from theory.tree import Tree, verify_round, verify_tree
from theory.tree.verify import verify_tree_nodes
from tree_cases import same, tree_case

V = 12
NEIGH = np.stack([np.roll(np.arange(V), -k) for k in range(1, 4)], 1)        # (V, 3) LANTERN's neighbour table
VERIFIERS = {
    "vanilla (generic)": lambda: rules.Verifier(rules.Vanilla(), rules.Residual(), "vanilla-generic"),
    "cool-sd": lambda: rules.cool_sd(2.0),
    "uniform-rsd": lambda: rules.uniform_rsd(1.7),
    "lantern++": lambda: rules.lantern_pp(NEIGH, 2, 1.6),
    "lantern": lambda: rules.lantern(NEIGH, 2, 0.15),
    "typical": lambda: rules.typical(),
    "greedy (generic)": lambda: rules.Verifier(rules.Greedy(), rules.Argmax(), "greedy-generic"),
}


def _case(seed, static):
    return tree_case(seed, static, V, B=4, max_nodes=20)


def _torch(tree, *arrays):
    t = [None if a is None else torch.as_tensor(a) for a in arrays]
    if not isinstance(tree, Tree):
        tree = type(tree)(torch.as_tensor(tree.children), torch.as_tensor(tree.node_depth), tree.depth)
    return tree, t


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10 ** 6), static=st.booleans(), law=st.sampled_from(["without_replacement", "point"]),
       name=st.sampled_from(sorted(VERIFIERS)))
def test_nodes_verdict_equals_the_walk(seed, static, law, name):
    p, q, tokens, u, us, tree, cap = _case(seed, static)
    v = VERIFIERS[name]()
    ref = verify_tree(p, q, tokens, u, us, tree, v, early_exit=True, max_depth=cap, draft_law=law)
    got = verify_tree_nodes(p, q, tokens, u, us, tree, v, max_depth=cap, draft_law=law)
    assert same(ref, got), (name, law, ref, got)
    ttree, t = _torch(tree, p, q, tokens, u, us, cap)
    got_t = verify_tree_nodes(*t[:5], ttree, v, max_depth=t[5], draft_law=law)
    assert same(ref, [x.numpy() for x in got_t]), (name, law, ref, got_t)


def test_the_cases_accept_deep_and_the_control_is_told_apart():
    """The comparison has power: paths of several depths are accepted, and the nodes' verdict with the residual
    update left out (G = p: a rejection changes nothing) differs from the walk's on these cases."""
    depths, diff = [], 0
    wrong = rules.Verifier(rules.Vanilla(), rules.Target(), "no-residual")
    for seed in range(60):
        p, q, tokens, u, us, tree, cap = _case(seed, seed % 2 == 0)
        ref = verify_tree(p, q, tokens, u, us, tree, rules.vanilla(), early_exit=True, max_depth=cap)
        depths += list(np.asarray(ref.accepted))
        diff += not same(ref, verify_tree_nodes(p, q, tokens, u, us, tree, wrong, max_depth=cap))
    assert max(depths) >= 3 and np.mean(np.asarray(depths) > 0) > 0.3
    assert diff >= 10


@pytest.mark.parametrize("static", [True, False])
def test_verify_round_takes_the_nodes_verdict_on_torch_arrays(static):
    """verify_round on torch rows (the device path) for a rule without its own walk: the walk's verdict, as tensors."""
    p, q, tokens, u, us, tree, cap = _case(5, static)
    ttree, t = _torch(tree, p, q, tokens, u, us, cap)
    ref = verify_tree(p, q, tokens, u, us, tree, rules.cool_sd(2.0), early_exit=True, max_depth=cap)
    got = verify_round(*t[:5], ttree, rules.cool_sd(2.0), max_depth=t[5])
    assert all(isinstance(x, torch.Tensor) for x in got) and same(ref, [x.numpy() for x in got])
