"""theory.likelihood.tree_log_likelihood (T13, docs/theory.md section 11b) against an independent enumeration of
whole sequences of tree rounds (scalar rules written here), a simulator of the engine's tree rounds (chi-square), and
negative controls (the wrong candidate law, the wrong tree, the wrong convention)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bruteforce import (argmax_g, gsd_f, lantern_g_released, lantern_ptilde, optimal_g_rows, residual_g_rows, scaled_f,
                        typical_f)
from bruteforce_tree import all_sequences, context_rows, process_law, static_tree_at, teacher_rows
from theory import rules
from theory.likelihood import log_likelihood, log_target, tree_log_likelihood
from theory.tree import RowTrees, Tree, chain_tree
from treesim import chi2_pvalue, simulate

TREES = {"three": ((0,), (1,), (2,), (0, 0)),                  # three children at the root
         "eagle": ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)),   # an EAGLE-like small tree
         "chain": ((0,), (0, 0), (0, 0, 0))}

# --------------------------------------------------------------------------- scalar rules (written here)


def _min1(num, q):
    return [1.0 if q[x] == 0 else min(1.0, num[x] / q[x]) for x in range(len(q))]


def scalar_rule(name, V, rng):
    """(verifier, f(i, p, q) -> list, g(p, q, f, rejected) -> list): the package's rule and the same rule as scalars."""
    if name == "vanilla":
        return rules.vanilla(), lambda i, p, q: scaled_f(1.0, p, q), residual_g_rows
    if name == "cool-sd":
        v = rules.cool_sd(2.5, 0.7)                       # w_i = 1 + 1.5 exp(-0.7 (i - 1)), G*
        return v, lambda i, p, q: scaled_f(1 + 1.5 * np.exp(-0.7 * (i - 1)), p, q), optimal_g_rows
    if name == "uniform-rsd":
        return rules.uniform_rsd(1.7), lambda i, p, q: scaled_f(1.7, p, q), optimal_g_rows
    if name == "scaled":                                   # stricter than vanilla at position 1: G* != residual
        w = (0.6, 2.0, 1.3)
        return rules.scaled(rules.Explicit(w)), lambda i, p, q: scaled_f(w[i - 1], p, q), optimal_g_rows
    if name == "level":
        a = (0.3, 0.6, 0.1)
        return (rules.level(rules.Explicit(a)), lambda i, p, q: [v + a[i - 1] * (1 - v) for v in scaled_f(1.0, p, q)],
                optimal_g_rows)
    if name == "typical":
        return (rules.typical(0.3, 0.9), lambda i, p, q: typical_f(p, 0.3, 0.9, "release"),
                lambda p, q, f, x: argmax_g(p))
    if name == "greedy":
        return rules.greedy(), lambda i, p, q: argmax_g(p), lambda p, q, f, x: argmax_g(p)
    if name == "gsd":
        emb = rng.normal(size=(V, 2))
        return rules.gsd(emb, d_threshold=1.5), lambda i, p, q: gsd_f(p, q, emb, d_thr=1.5), residual_g_rows
    nb = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    if name == "lantern":
        return (rules.lantern(nb, 1, 0.35), lambda i, p, q: _min1(lantern_ptilde(p, nb, 1, delta=0.35), q),
                lambda p, q, f, x: lantern_g_released(p, q, nb, 1, x, "p", delta=0.35))
    if name == "lantern++":
        return (rules.lantern_pp(nb, 1, 2.5), lambda i, p, q: _min1(lantern_ptilde(p, nb, 1, lam=2.5), q),
                lambda p, q, f, x: lantern_g_released(p, q, nb, 1, x, "q", lam=2.5))
    if name == "lantern+G*":
        return (rules.lantern(nb, 1, 0.35, resample="optimal"),
                lambda i, p, q: _min1(lantern_ptilde(p, nb, 1, delta=0.35), q), optimal_g_rows)
    raise KeyError(name)


RULES = ["vanilla", "cool-sd", "uniform-rsd", "scaled", "level", "typical", "greedy", "gsd", "lantern", "lantern++",
         "lantern+G*"]

def _case(rule, tree, V, T, per_depth, zp, seed, candidates, convention):
    rng = np.random.default_rng(seed)
    verifier, f_rule, g_rule = scalar_rule(rule, V, rng)
    paths = TREES[tree]
    D = max(len(t) for t in paths)
    prow, qrow = context_rows(rng, V, T, D, per_depth, zp)
    law = process_law(prow, qrow, f_rule, g_rule, T, convention, candidates, static_tree_at(paths))
    seqs = all_sequences(V, T)
    p, q = teacher_rows(prow, qrow, seqs, D, per_depth)
    return verifier, Tree(paths), seqs, p, q, np.array([law.get(tuple(s), 0.0) for s in seqs])


# --------------------------------------------------------------------------- brute force vs the recursion

@settings(max_examples=100, deadline=None)
@given(rule=st.sampled_from(RULES), tree=st.sampled_from(sorted(TREES)),
       candidates=st.sampled_from(["topk", "sampled"]), convention=st.sampled_from(["eagle", "theory"]),
       V=st.integers(2, 4), T=st.integers(1, 5),
       per_depth=st.booleans(), zp=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**32 - 1))
def test_matches_bruteforce_process(rule, tree, candidates, convention, V, T, per_depth, zp, seed):
    """Every rule family, three tree shapes (three children at the root, an EAGLE-like tree, a chain), both candidate
    constructions and conventions, q per depth or independent, rows with zeros: all V^T sequences (V <= 4, T <= 5,
    at most 256 sequences) to 1e-12."""
    if rule.startswith("lantern") or tree == "three":
        V = max(V, 3)                                    # k + 1 = 2 neighbours per code; three root candidates
    if V ** T > 256:
        T = 4
    verifier, tr, seqs, p, q, exact = _case(rule, tree, V, T, per_depth, zp, seed, candidates, convention)
    assert exact.sum() == pytest.approx(1.0, abs=1e-12)
    lp = tree_log_likelihood(p, q, seqs, verifier, tr, candidates=candidates, convention=convention)
    assert lp.shape == (len(seqs),) and lp.dtype == np.float64
    np.testing.assert_allclose(np.exp(lp), exact, rtol=1e-12, atol=1e-15)
    # impossible sequences: exactly -inf. GSD's f = min(1, P(G)/Q(G)) sums a group's masses, which the package and the
    # scalar rule add in different orders: f = 1 - 1.1e-16 in one is 1 in the other, so a rejection of probability
    # ~1e-16 (which the engine, running the package's rule, can draw) is exactly 0 only in the enumeration
    zero = lp[exact == 0]
    assert np.all(np.isneginf(zero) | ((rule == "gsd") & (np.exp(zero) < 1e-15)))


@pytest.mark.parametrize("rule", ["lantern++", "cool-sd", "typical"])
@pytest.mark.parametrize("candidates", ["topk", "sampled"])
def test_three_children_at_the_root_v4_t5(rule, candidates):
    """The largest brute-force case: V = 4, T = 5, three children at the root (sampled: 16 histories of rejected
    siblings per root row), context rows with zeros."""
    verifier, tr, seqs, p, q, exact = _case(rule, "three", 4, 5, True, 0.25, 21, candidates, "eagle")
    lp = tree_log_likelihood(p, q, seqs, verifier, tr, candidates=candidates)
    np.testing.assert_allclose(np.exp(lp), exact, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", list(__import__("theory.rules.methods", fromlist=["names"]).names())
                         + ["lantern:renormalised", "lantern++:renormalised"])
def test_every_registered_method(name):
    """Every method of the registry (and any added later) with its default parameters, and LANTERN's renormalised
    resamplers, both constructions: the recursion against the enumeration driven by the verifier's own rules (G(.|c)
    given the rejected candidate)."""
    from theory.rules import methods

    rng = np.random.default_rng(17)
    V, T, tree = 3, 4, "three"
    name, _, resampler = name.partition(":")
    m = methods.get(name)
    kw = {"k": 1} if m.needs_neighbors else {}
    kw.update({"resampler": resampler} if resampler else {})
    kw.update({p.name: "2.0,1.3" for p in m.params if p.default is None and not p.optional})   # scaled's weights
    v = methods.build(name, 2, neighbors=rules.lantern_neighbors(rng.normal(size=(V, 2))),
                      embeddings=rng.normal(size=(V, 2)) if m.needs_embeddings else None, **kw)
    f_rule = lambda i, p, q: v.accept(np.array(p), np.array(q), i).tolist()                        # noqa: E731
    g_rule = lambda p, q, f, x: v.resample(np.array(p), np.array(q), np.array(f), np.array(x)).tolist()  # noqa: E731
    prow, qrow = context_rows(rng, V, T, 2, True, 0.2)
    seqs = all_sequences(V, T)
    p, q = teacher_rows(prow, qrow, seqs, 2, True)
    for cand in ("topk", "sampled"):
        law = process_law(prow, qrow, f_rule, g_rule, T, "eagle", cand, static_tree_at(TREES[tree]))
        exact = np.array([law.get(tuple(s), 0.0) for s in seqs])
        np.testing.assert_allclose(np.exp(tree_log_likelihood(p, q, seqs, v, Tree(TREES[tree]), candidates=cand)),
                                   exact, rtol=1e-12, atol=1e-15)


def test_wrong_candidate_law_tree_and_convention_are_detected():
    """Negative controls against the enumeration: topk rows scored as sampled (and vice versa), the wrong tree, the
    other convention each move the law by more than 1e-3 in TV."""
    for cand, other in (("topk", "sampled"), ("sampled", "topk")):
        verifier, tr, seqs, p, q, exact = _case("cool-sd", "three", 3, 4, True, 0.0, 5, cand, "eagle")
        right = np.exp(tree_log_likelihood(p, q, seqs, verifier, tr, candidates=cand))
        assert np.max(np.abs(right - exact)) < 1e-13
        swapped = np.exp(tree_log_likelihood(p, q, seqs, verifier, tr, candidates=other))
        assert 0.5 * np.abs(swapped - exact).sum() > 1e-3
        wrong_tree = Tree(((0,), (1,), (2,)))                         # the first child's child missing
        q2 = q[:, :, :1]
        assert 0.5 * np.abs(np.exp(tree_log_likelihood(p, q2, seqs, verifier, wrong_tree, candidates=cand))
                            - exact).sum() > 1e-3
        theory = np.exp(tree_log_likelihood(p, q, seqs, verifier, tr, candidates=cand, convention="theory"))
        assert 0.5 * np.abs(theory - exact).sum() > 1e-3


def test_dynamic_trees_match_bruteforce():
    """Per-round-start trees (random shapes, random distinct sibling tokens, a function of the prefix), point law:
    the RowTrees entry against the enumeration, for a relaxed rule and LANTERN++'s rejected-dependent resampler."""
    V, T, N, K, D = 3, 4, 5, 3, 3
    for rule, seed in (("cool-sd", 1), ("lantern++", 2), ("typical", 3)):
        rng = np.random.default_rng(seed)
        verifier, f_rule, g_rule = scalar_rule(rule, V, rng)
        prow, qrow = context_rows(rng, V, T, D, False, 0.2)
        trees = {}
        for n in range(T):
            for pre in itertools.product(range(V), repeat=n):
                parent, depth = [-1], [0]
                for a in range(1, N + 1):               # random parents among shallower nodes with room
                    opts = [b for b in range(a) if depth[b] < D and parent.count(b) < K]
                    b = int(rng.choice(opts))
                    parent.append(b)
                    depth.append(depth[b] + 1)
                ch = np.full((N + 1, K), -1, np.int64)
                tok = np.zeros(N + 1, np.int64)
                for b in range(N + 1):
                    kids = [a for a in range(1, N + 1) if parent[a] == b]
                    ch[b, : len(kids)] = kids
                    tok[kids] = rng.permutation(V)[: len(kids)]
                trees[pre] = (ch, np.array(depth), tok)

        def tree_at(pre):
            ch, dep, tok = trees[pre]
            kids = {b: [int(c) for c in ch[b] if c >= 0] for b in range(N + 1)}
            return kids, {a: int(t) for a, t in enumerate(tok)}, D
        law = process_law(prow, qrow, f_rule, g_rule, T, "eagle", "topk", tree_at)
        seqs = all_sequences(V, T)
        p, _ = teacher_rows(prow, qrow, seqs, D, False)
        ch = np.array([[trees[tuple(s[:n])][0] for n in range(T)] for s in seqs])
        dep = np.array([[trees[tuple(s[:n])][1] for n in range(T)] for s in seqs])
        tok = np.array([[trees[tuple(s[:n])][2] for n in range(T)] for s in seqs])
        lp = tree_log_likelihood(p, None, seqs, verifier, None, row_trees=RowTrees(ch, dep, D), node_tokens=tok)
        exact = np.array([law.get(tuple(s), 0.0) for s in seqs])
        np.testing.assert_allclose(np.exp(lp), exact, rtol=1e-12, atol=1e-15)


def test_static_topk_equals_its_dynamic_form():
    """A static topk tree on a Markov chain written as per-round RowTrees (node tokens = top-m of Q_d[parent token],
    every node, off-path ones included) gives the same likelihood: the two entry points agree."""
    rng = np.random.default_rng(8)
    V, T, B = 5, 6, 40
    tree = Tree(TREES["eagle"])
    D, N = tree.depth, tree.n_nodes
    P, Q = rng.dirichlet(np.ones(V), size=V), rng.dirichlet(np.full(V, 0.5), size=(D, V))
    x = rng.integers(V, size=(B, T))
    prev = np.concatenate([np.zeros((B, 1), np.int64), x[:, :-1]], 1)
    p = P[prev]
    q = np.stack([Q[d][np.concatenate([prev[:, d:], np.zeros((B, d), np.int64)], 1)] for d in range(D)], axis=2)
    tok = np.zeros((B, T, N + 1), np.int64)
    tok[:, :, 0] = prev
    for s in range(1, N + 1):                          # nodes in (depth, path) order: parents first
        par, d = tree.parent[s], tree.node_depth[s] - 1
        rank = int(np.flatnonzero(tree.children[par] == s)[0])
        tok[:, :, s] = np.argsort(-Q[d][tok[:, :, par]], axis=-1, kind="stable")[..., rank]
    rt = RowTrees(np.broadcast_to(tree.children, (B, T, N + 1, tree.children.shape[1])),
                  np.broadcast_to(tree.node_depth, (B, T, N + 1)), D)
    for v in (rules.cool_sd(3.0), rules.lantern_pp(rules.lantern_neighbors(rng.normal(size=(V, 2))), 1, 2.0)):
        np.testing.assert_allclose(tree_log_likelihood(p, None, x, v, row_trees=rt, node_tokens=tok),
                                   tree_log_likelihood(p, q, x, v, tree), rtol=1e-12)


# --------------------------------------------------------------------------- lossless and consistency checks

def test_vanilla_is_the_target_for_both_constructions():
    rng = np.random.default_rng(9)
    B, T, V = 5, 30, 24
    p = rng.dirichlet(np.full(V, 0.3), size=(B, T))
    p[p < 0.01] = 0
    p /= p.sum(-1, keepdims=True)
    x = np.array([[rng.choice(V, p=p[b, t]) for t in range(T)] for b in range(B)])
    tree = Tree(TREES["eagle"])
    q = rng.dirichlet(np.full(V, 0.3), size=(B, T, tree.depth))
    for cand in ("topk", "sampled"):
        for conv in ("eagle", "theory"):
            lh = tree_log_likelihood(p, q, x, rules.vanilla(), tree, candidates=cand, convention=conv)
            np.testing.assert_allclose(lh, log_target(p, x), rtol=1e-12, atol=1e-10)
    lh = tree_log_likelihood(p, q[:, :, 0], x, rules.vanilla(), Tree(TREES["three"]), candidates="sampled")
    np.testing.assert_allclose(lh, log_target(p, x), rtol=1e-12, atol=1e-10)
    rt, tok = random_row_trees(rng, B, T, V, TREES["eagle"])        # dynamic trees: any prefix-fixed candidates
    for conv in ("eagle", "theory"):
        lh = tree_log_likelihood(p, None, x, rules.vanilla(), row_trees=rt, node_tokens=tok, convention=conv)
        np.testing.assert_allclose(lh, log_target(p, x), rtol=1e-12, atol=1e-10)


def random_row_trees(rng, B, T, V, paths):
    """RowTrees (B, T, N+1, K) of the shape ``paths`` at every round start with random node tokens, distinct among
    siblings (a random permutation of the vocabulary per node, read by rank)."""
    tree = Tree(paths)
    N, K = tree.n_nodes, tree.children.shape[1]
    perm = np.argsort(rng.random((B, T, N + 1, V)), axis=-1)
    tok = np.zeros((B, T, N + 1), np.int64)
    for s in range(1, N + 1):   # a loop over the (few) nodes of a test tree
        tok[:, :, s] = perm[:, :, tree.parent[s], int(np.flatnonzero(tree.children[tree.parent[s]] == s)[0])]
    return RowTrees(np.broadcast_to(tree.children, (B, T, N + 1, K)).copy(),
                    np.broadcast_to(tree.node_depth, (B, T, N + 1)).copy(), tree.depth), tok


def test_sampled_chain_tree_is_the_chain_likelihood():
    """One candidate per node drawn from q is chain SD: tree q[n, d] = chain q[n + d, d] gives log_likelihood (T12)."""
    rng = np.random.default_rng(10)
    B, T, V, L = 4, 9, 6, 3
    p, qc = rng.dirichlet(np.ones(V), size=(B, T)), rng.dirichlet(np.ones(V), size=(B, T, L))
    x = rng.integers(V, size=(B, T))
    qt = np.full((B, T, L, V), np.nan)
    for n, d in itertools.product(range(T), range(L)):
        if n + d < T:
            qt[:, n, d] = qc[:, n + d, d]
    nb = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    for v in (rules.cool_sd(2.0), rules.lantern(nb, 2, 0.3), rules.typical(0.2, 0.5)):
        for conv in ("eagle", "theory"):
            np.testing.assert_allclose(
                tree_log_likelihood(p, qt, x, v, chain_tree(L), candidates="sampled", convention=conv),
                log_likelihood(p, qc, x, v, L, convention=conv), rtol=1e-12)


def test_batch_dims_and_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    T, V = 6, 5
    tree = Tree(TREES["three"])
    p = rng.dirichlet(np.ones(V), size=(2, 3, T))
    q = rng.dirichlet(np.ones(V), size=(2, 3, T, tree.depth))
    x = rng.integers(V, size=(2, 3, T))
    v = rules.cool_sd(3.0)
    for cand in ("topk", "sampled"):
        lh = tree_log_likelihood(p, q, x, v, tree, candidates=cand)
        assert lh.shape == (2, 3)
        flat = tree_log_likelihood(p.reshape(6, T, V), q.reshape(6, T, tree.depth, V), x.reshape(6, T), v, tree,
                                   candidates=cand)
        np.testing.assert_array_equal(lh.ravel(), flat)
        one = tree_log_likelihood(p[1, 2], q[1, 2], x[1, 2], v, tree, candidates=cand)
        assert one.shape == () and float(one) == pytest.approx(lh[1, 2], rel=1e-14)
        lt = tree_log_likelihood(torch.as_tensor(p), torch.as_tensor(q), torch.as_tensor(x), v, tree, candidates=cand)
        assert lt.dtype == torch.float64
        np.testing.assert_allclose(lt.numpy(), lh, rtol=1e-12)
    rt, tok = random_row_trees(rng, 6, T, V, TREES["eagle"])
    lh = tree_log_likelihood(p.reshape(6, T, V), None, x.reshape(6, T), v, row_trees=rt, node_tokens=tok)
    rtt = RowTrees(torch.as_tensor(rt.children), torch.as_tensor(rt.node_depth), rt.depth)
    lt = tree_log_likelihood(torch.as_tensor(p.reshape(6, T, V), dtype=torch.float32), None,
                             torch.as_tensor(x.reshape(6, T)), v, row_trees=rtt, node_tokens=torch.as_tensor(tok))
    assert lt.dtype == torch.float64
    np.testing.assert_allclose(lt.numpy(), lh, rtol=1e-5)


# --------------------------------------------------------------------------- the simulator's frequencies

@pytest.mark.parametrize("rule", ["cool-sd", "lantern++"])
@pytest.mark.parametrize("candidates", ["topk", "sampled"])
def test_matches_simulator_frequencies(rule, candidates):
    """The simulated law of S = 40,000 sequences (V = 3, T = 5: 243 cells; a cell of probability 0.01 has SE 5e-4)
    against exp(tree_log_likelihood); the wrong candidate law and the wrong tree must be rejected at the same S."""
    rng = np.random.default_rng(12)
    V, T, S = 3, 5, 40_000
    verifier, _, _ = scalar_rule(rule, V, rng)
    tree = Tree(TREES["three"])
    P = rng.dirichlet(np.full(V, 0.7), size=V)
    Q = rng.dirichlet(np.full(V, 0.7), size=(tree.depth, V))
    x = simulate(P, Q, tree, verifier, T, S, seed=13, candidates=candidates)
    seqs = all_sequences(V, T)
    counts = np.bincount((x * V ** np.arange(T - 1, -1, -1)).sum(1), minlength=len(seqs)).astype(float)
    prev = np.concatenate([np.zeros((len(seqs), 1), np.int64), seqs[:, :-1]], axis=1)
    p = P[prev]
    q = np.stack([Q[d][np.concatenate([prev[:, d:], np.zeros((len(seqs), d), np.int64)], 1)]
                  for d in range(tree.depth)], axis=2)
    score = lambda tr, qq, c: np.exp(tree_log_likelihood(p, qq, seqs, verifier, tr, candidates=c))  # noqa: E731
    probs = score(tree, q, candidates)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert chi2_pvalue(counts, probs) > 1e-3
    other = score(tree, q, "sampled" if candidates == "topk" else "topk")
    wrong_tree = score(Tree(((0,), (1,), (2,))), q[:, :, :1], candidates)      # the first child's child missing
    for bad in (other, wrong_tree):
        assert 0.5 * np.abs(bad - probs).sum() > 0.02
        assert chi2_pvalue(counts, bad) < 1e-6


# --------------------------------------------------------------------------- bad input

def _good():
    rng = np.random.default_rng(0)
    T, V = 5, 4
    tree = Tree(TREES["three"])
    return (rng.dirichlet(np.ones(V), size=(2, T)), rng.dirichlet(np.ones(V), size=(2, T)),
            rng.integers(V, size=(2, T)), rules.vanilla(), tree)


def _row_trees(B=2, T=5, V=4):
    tree = Tree(TREES["eagle"])
    N, K = tree.n_nodes, tree.children.shape[1]
    tok = np.tile(np.array([0, 0, 1, 0, 1, 2, 3]), (B, T, 1))
    return RowTrees(np.broadcast_to(tree.children, (B, T, N + 1, K)).copy(),
                    np.broadcast_to(tree.node_depth, (B, T, N + 1)).copy(), tree.depth), tok


@pytest.mark.parametrize("case,match", [
    ("token_high", "tokens must lie in"), ("token_float", "integer tokens"), ("tok_shape", "tokens must be"),
    ("p_sum", "p rows must sum to 1"), ("p_int", "p must be a real floating"), ("q_sum", "q rows that are read"),
    ("q_depth", "q must be"), ("q_none", "q must be a real floating"), ("tree", "tree must be a theory.tree.Tree"),
    ("cand", "candidates must be one of"), ("conv", "convention must be one of"), ("verifier", "verifier must be"),
    ("too_many_kids", "children but V"), ("both", "not both"), ("rt_type", "row_trees must be"),
    ("rt_q", "q must be None"), ("rt_tokens", "needs node_tokens"), ("rt_shape", "children must be"),
    ("rt_dup", "distinct tokens"), ("rt_struct", "must hold trees"), ("rt_tok_range", "must hold trees"),
    ("nt_static", "node_tokens go with row_trees"),
])
def test_bad_input_one_line(case, match):
    p, q, x, v, tree = _good()
    rt, nt = _row_trees()
    args, kw = [p, q, x, v, tree], {}
    if case == "token_high":
        x = x.copy(); x[0, 0] = 4; args[2] = x
    elif case == "token_float":
        args[2] = x.astype(float)
    elif case == "tok_shape":
        args[2] = x[:, :-1]
    elif case == "p_sum":
        args[0] = p * 1.01
    elif case == "p_int":
        args[0] = (p > 0.5).astype(np.int64)
    elif case == "q_sum":
        q = q.copy(); q[0, 1, 0] *= 0.5; args[1] = q
    elif case == "q_depth":
        args[1] = np.repeat(q[:, :, None], 3, axis=2)          # depth 3 for a depth-2 tree
    elif case == "q_none":
        args[1] = None
    elif case == "tree":
        args[4] = TREES["three"]
    elif case == "cand":
        kw = {"candidates": "beam"}
    elif case == "conv":
        kw = {"convention": "engine"}
    elif case == "verifier":
        args[3] = "vanilla"
    elif case == "too_many_kids":
        args[4] = Tree(((0,), (1,), (2,), (3,), (4,)))
    elif case == "nt_static":
        kw = {"node_tokens": nt}
    else:
        args[1], args[4] = None, None
        kw = {"row_trees": rt, "node_tokens": nt}
        if case == "both":
            args[4] = tree
        elif case == "rt_type":
            kw["row_trees"] = tree
        elif case == "rt_q":
            args[1] = q
        elif case == "rt_tokens":
            kw["node_tokens"] = None
        elif case == "rt_shape":
            kw["row_trees"] = RowTrees(rt.children[:, :-1], rt.node_depth, rt.depth)
        elif case == "rt_dup":
            nt = nt.copy(); nt[0, 2, 2] = nt[0, 2, 1]; kw["node_tokens"] = nt
        elif case == "rt_struct":
            ch = rt.children.copy(); ch[1, 3, 1, 0] = 0; kw["row_trees"] = RowTrees(ch, rt.node_depth, rt.depth)
        elif case == "rt_tok_range":
            nt = nt.copy(); nt[0, 2, 3] = 9; kw["node_tokens"] = nt
    with pytest.raises(ValueError, match=match) as e:
        tree_log_likelihood(*args, **kw)
    assert "\n" not in str(e.value)


def test_no_exact_likelihood_is_refused():
    """NotImplementedError with the reason and the exact alternative: the lossless dynamic trees, and the sampled
    construction above its cost limit (EAGLE_25's four root children at V = 512)."""
    p, q, x, v, tree = _good()
    rt, nt = _row_trees()
    with pytest.raises(NotImplementedError, match="candidates='topk'"):
        tree_log_likelihood(p, None, x, v, None, candidates="sampled", row_trees=rt, node_tokens=nt)
    from theory.tree import EAGLE_25
    V = 512
    big = Tree(EAGLE_25)
    pp = np.full((1, 8, V), 1.0 / V)
    with pytest.raises(NotImplementedError, match=r"V\^4.*sampled_limit.*candidates='topk'"):
        tree_log_likelihood(pp, np.full((1, 8, 5, V), 1.0 / V), np.zeros((1, 8), np.int64), v, big,
                            candidates="sampled")
    with pytest.raises(NotImplementedError, match="V\\^3"):                      # the limit is the caller's
        tree_log_likelihood(p, q, x, v, tree, candidates="sampled", sampled_limit=63)
    assert np.all(np.isfinite(tree_log_likelihood(p, q, x, v, tree, candidates="sampled", sampled_limit=None)))
    lp = tree_log_likelihood(pp, np.full((1, 8, 5, V), 1.0 / V), np.zeros((1, 8), np.int64), v, big)   # topk: fine
    assert lp[0] == pytest.approx(8 * np.log(1.0 / V))


def test_unread_q_rows_and_unused_round_starts_may_hold_anything():
    p, q, x, v, tree = _good()
    v = rules.cool_sd(2.0)
    qd = np.repeat(q[:, :, None], tree.depth, axis=2)
    ref = tree_log_likelihood(p, qd, x, v, tree, candidates="sampled")
    q2 = qd.copy()
    q2[:, 0] = np.nan                  # eagle: no round starts at n = 0
    q2[:, -1] = np.nan                 # n = T - 1: a target step
    q2[:, -2, 1] = np.nan              # n = T - 2: the tree is cut at depth 1
    np.testing.assert_array_equal(tree_log_likelihood(p, q2, x, v, tree, candidates="sampled"), ref)
    rt, nt = _row_trees()
    ch = rt.children.copy()
    ch[:, 0] = 99                      # garbage at the unused round starts (eagle n = 0, n = T - 1)
    ch[:, -1] = -7
    ref = tree_log_likelihood(p, None, x, v, row_trees=rt, node_tokens=nt)
    np.testing.assert_array_equal(tree_log_likelihood(p, None, x, v, row_trees=RowTrees(ch, rt.node_depth, rt.depth),
                                                      node_tokens=nt), ref)
