"""T15 (docs/theory/likelihood.md section 11d): the Monte Carlo likelihood of lossless dynamic trees,
``theory.likelihood.tree_mc.dynamic_log_likelihood_mc``.

Against an independent enumeration (tests/bruteforce_tree.py: whole sequences of rounds, every accept / reject outcome,
scalar rules written in tests/test_tree_likelihood.py): when a round draws its tree uniformly from M given trees and
all M are passed as the samples, the pooled estimate IS the mixture law, exactly. Negative controls: the same trees
verified with the point law (the release's qx = 1), and per-node averaging over the trees (states = depths only,
which multiplies the means of one round's emissions instead of averaging their products)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bruteforce_tree import all_sequences, context_rows, process_law, teacher_rows
from test_tree_likelihood import scalar_rule
from theory.likelihood import tree_log_likelihood
from theory.likelihood import tree as _tree
from theory.likelihood.tree_mc import dynamic_log_likelihood_mc, tree_log_likelihood_mc
from theory.likelihood.tree_walks import path_emissions
from theory.tree import RowTrees

RULES = ["vanilla", "cool-sd", "scaled", "typical", "gsd", "lantern", "lantern++", "lantern+G*"]


def _random_tree(rng, V, N, K, D):
    """A random tree of N drafted nodes (depth <= D, <= K children, distinct sibling tokens) in array form."""
    parent, depth = [-1], [0]
    for a in range(1, N + 1):
        opts = [b for b in range(a) if depth[b] < D and parent.count(b) < min(K, V)]
        if not opts:
            break
        b = int(rng.choice(opts))
        parent.append(b)
        depth.append(depth[b] + 1)
    n1 = len(parent)
    ch = np.full((N + 1, K), -1, np.int64)
    tok = np.zeros(N + 1, np.int64)
    dep = np.zeros(N + 1, np.int64)
    dep[:n1] = depth
    for b in range(n1):
        kids = [a for a in range(1, n1) if parent[a] == b]
        ch[b, : len(kids)] = kids
        tok[kids] = rng.permutation(V)[: len(kids)]
    return ch, dep, tok


def _mixture_case(rule, V, T, M, N, K, D, per_depth, zp, convention, seed):
    """Rows, M random trees per prefix (the round's tree law: uniform over them), the brute-force law and the
    estimator's inputs for every sequence."""
    rng = np.random.default_rng(seed)
    verifier, f_rule, g_rule = scalar_rule(rule, V, rng)
    prow, qrow = context_rows(rng, V, T, D, per_depth, zp)
    trees = {pre: [_random_tree(rng, V, N, K, D) for _ in range(M)]
             for n in range(T) for pre in itertools.product(range(V), repeat=n)}

    def as_dicts(tr):
        ch, dep, tok = tr
        return ({b: [int(c) for c in ch[b] if c >= 0] for b in range(N + 1)}, {a: int(t) for a, t in enumerate(tok)},
                D)

    law = process_law(prow, qrow, f_rule, g_rule, T, convention, "topk",
                      lambda pre: [(1.0 / M, as_dicts(tr)) for tr in trees[pre]], given_law="drawn")
    seqs = all_sequences(V, T)
    p, q = teacher_rows(prow, qrow, seqs, D, per_depth)
    if per_depth:
        q = np.nan_to_num(q, nan=1.0 / V)          # entries past the image: never read
    arr = lambda i: np.array([[[tr[i] for tr in trees[tuple(s[:n])]] for n in range(T)] for s in seqs])  # noqa: E731
    exact = np.array([law.get(tuple(s), 0.0) for s in seqs])
    return verifier, seqs, p, q, RowTrees(arr(0), arr(1), D), arr(2), exact


@settings(max_examples=60, deadline=None)
@given(rule=st.sampled_from(RULES), V=st.integers(2, 3), T=st.integers(1, 4), M=st.sampled_from([2, 4]),
       per_depth=st.booleans(), zp=st.sampled_from([0.0, 0.3]), convention=st.sampled_from(["eagle", "theory"]),
       seed=st.integers(0, 2**32 - 1))
def test_pooled_estimate_is_the_mixture_law_when_every_tree_is_given(rule, V, T, M, per_depth, zp, convention, seed):
    """Each round draws its tree uniformly from M trees (random shapes and sibling tokens, tokens the draft row cannot
    draw included: skipped) verified with the without-replacement law; passing all M as the samples makes the pooled
    estimate the mixture's law exactly (T15's per-round mean is then the expectation itself)."""
    assume(V >= 3 or not rule.startswith("lantern"))            # LANTERN's k = 1 needs two neighbours per token
    verifier, seqs, p, q, rt, tok, exact = _mixture_case(rule, V, T, M, 5, 3, 3, per_depth, zp, convention, seed)
    out = dynamic_log_likelihood_mc(p, q, seqs, verifier, rt, tok, groups=2, convention=convention)
    assert abs(exact.sum() - 1) < 1e-9
    np.testing.assert_allclose(np.exp(out["log_p_hat_pooled"]), exact, rtol=1e-10, atol=1e-14)
    assert out["samples"] == M // 2 and out["groups"] == 2
    assert np.all(out["se"][exact > 0] >= 0)


def test_negative_controls_point_law_and_per_node_means():
    """The same trees verified with the point law (the release's qx = 1) give another law, and averaging each node's
    emissions over the trees (depth states only) is not the mixture: both miss the enumeration by far more than
    rounding."""
    verifier, seqs, p, q, rt, tok, exact = _mixture_case("cool-sd", 3, 4, 4, 5, 3, 3, True, 0.0, "eagle", 11)
    ok = np.exp(dynamic_log_likelihood_mc(p, q, seqs, verifier, rt, tok, groups=2)["log_p_hat_pooled"])
    np.testing.assert_allclose(ok, exact, rtol=1e-10, atol=1e-14)
    one = RowTrees(rt.children[:, :, 0], rt.node_depth[:, :, 0], rt.depth)       # tree 0 alone, point law
    point = np.exp(tree_log_likelihood(p, None, seqs, verifier, None, row_trees=one, node_tokens=tok[:, :, 0]))
    assert 0.5 * np.abs(point - exact).sum() > 0.02
    # per-node means: states = depths, a and r averaged over the trees separately
    x = seqs
    pt = np.take_along_axis(p, x[..., None], -1)[..., 0]
    Dp = _tree.depth_caps(4, 3, "eagle")
    E, R = path_emissions(p, x, pt, verifier, rt.children, tok, 3, Dp, np, q=q, per_depth=True)
    wrong = np.exp(_tree._forward(E.mean(2), R.mean(2), np.arange(-1, 3), np.arange(4), np))
    assert 0.5 * np.abs(wrong - exact).sum() > 1e-3


def test_identical_trees_have_no_monte_carlo_error_and_bad_input_is_refused():
    """M copies of one tree: the jackknife SE is 0 and the estimate is the pooled one; bad input: one-line errors
    before any work."""
    verifier, seqs, p, q, rt, tok, exact = _mixture_case("vanilla", 2, 4, 1, 4, 2, 2, False, 0.0, "eagle", 5)
    rep = lambda a: np.repeat(a, 4, axis=2)                                      # noqa: E731
    rt4 = RowTrees(rep(rt.children), rep(rt.node_depth), rt.depth)
    out = dynamic_log_likelihood_mc(p, q, seqs, verifier, rt4, rep(tok), groups=4)
    np.testing.assert_allclose(np.exp(out["log_p_hat_pooled"]), exact, rtol=1e-10, atol=1e-14)
    fin = exact > 0
    assert np.all(out["se"][fin] == 0) and np.allclose(out["log_p_hat"][fin], out["log_p_hat_pooled"][fin])
    with pytest.raises(ValueError, match="groups = 3 equal groups"):
        dynamic_log_likelihood_mc(p, q, seqs, verifier, rt4, rep(tok), groups=3)
    with pytest.raises(ValueError, match=r"children must be \(\.\.\., T, M, N\+1, K\)"):
        dynamic_log_likelihood_mc(p, q, seqs, verifier, RowTrees(rt.children[:, :, 0], rt.node_depth[:, :, 0], 2),
                                  tok[:, :, 0], groups=2)
    with pytest.raises(ValueError, match="q must be"):
        dynamic_log_likelihood_mc(p, q[..., :1], seqs, verifier, rt4, rep(tok), groups=2)
    bad = rep(tok).copy()
    bad[:, 1:, :, 1:] = 7                                                        # tokens outside [0, V)
    with pytest.raises(ValueError, match="node tokens in"):
        dynamic_log_likelihood_mc(p, q, seqs, verifier, rt4, bad, groups=2)


@settings(max_examples=30, deadline=None)
@given(rule=st.sampled_from(RULES), V=st.integers(2, 3), T=st.integers(1, 4), per_depth=st.booleans(),
       convention=st.sampled_from(["eagle", "theory"]), seed=st.integers(0, 2**32 - 1))
def test_the_one_mc_entry_with_row_trees_is_the_dynamic_estimate(rule, V, T, per_depth, convention, seed):
    """``tree_log_likelihood_mc`` with ``row_trees=`` (the one Monte Carlo entry, as ``tree_log_likelihood`` is the
    one exact one: ``real.decode.score_tree.tree_likelihood`` calls it for both tree kinds) gives
    ``dynamic_log_likelihood_mc``'s dict bit for bit, importance weights included."""
    assume(V >= 3 or not rule.startswith("lantern"))
    verifier, seqs, p, q, rt, tok, _ = _mixture_case(rule, V, T, 4, 5, 3, 3, per_depth, 0.3, convention, seed)
    w = np.random.default_rng(seed).random(tok.shape[:-1])                      # (n, T, M)
    got = tree_log_likelihood_mc(p, q, seqs, verifier, row_trees=rt, node_tokens=tok, weights=w, groups=2,
                                 convention=convention)
    want = dynamic_log_likelihood_mc(p, q, seqs, verifier, rt, tok, groups=2, convention=convention, weights=w)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_the_one_mc_entry_reads_the_weights_and_takes_one_kind_of_tree():
    """Control for the equivalence above: the entry's estimate moves with the importance weights it passes on (so
    comparing it with ``dynamic_log_likelihood_mc`` can fail); a static tree and row trees together are refused."""
    from theory.tree import chain_tree

    verifier, seqs, p, q, rt, tok, _ = _mixture_case("cool-sd", 3, 4, 4, 5, 3, 3, True, 0.0, "eagle", 11)
    w = np.random.default_rng(0).random(tok.shape[:-1])
    a = tree_log_likelihood_mc(p, q, seqs, verifier, row_trees=rt, node_tokens=tok, weights=w, groups=2)
    b = tree_log_likelihood_mc(p, q, seqs, verifier, row_trees=rt, node_tokens=tok, groups=2)
    assert not np.array_equal(a["log_p_hat_pooled"], b["log_p_hat_pooled"])
    with pytest.raises(ValueError, match="give tree .* or row_trees .*, not both"):
        tree_log_likelihood_mc(p, q, seqs, verifier, chain_tree(2), row_trees=rt, node_tokens=tok, groups=2)


# --------------------------------------------------------------------------- regrown lossless trees on a real model

def test_regrown_lossless_trees_estimate_the_target_law_and_the_weights_matter():
    """T15 end to end on a tiny LlamaGen pair (V = 4, T = 4, CFG 1.5, temperature 0.9, top-k 3: 81 sequences, exact
    law by enumeration): ``tree_rows`` regrows 16 importance-sampled stochastic-beam trees per round start
    (``real.decode.regrow._Guide``), the pooled estimate P^_hat is unbiased for P^, and vanilla verification is
    lossless (P^ = P): over 20 seeds, the mean of sum_x P^_hat(x) over the 81 sequences is 1 within 4 SEs (measured
    0.998, SE 0.018). Negative control: the same trees without their importance weights (the proposals draft the
    path's tokens often): 1.93. ``tree_likelihood`` reports the jackknifed log with its SE ("mc"), as --fidelity and
    the sweep do (docs/theory/likelihood.md 11d: validated on vanilla images, whose log P is known)."""
    import torch

    from real.decode import score_tree as st
    from real.decode.dynamic_tree import DynamicTree
    from real.decode.regrow import LOSSLESS_TREES
    from real.decode.sampling import Processing
    from test_real_engine import _exact_law, _law_models
    from theory import rules

    torch.set_num_threads(1)
    t, d = _law_models()
    proc = Processing(temperature=0.9, top_k=3, cfg_scale=1.5)
    law = _exact_law(t, 2, 4, proc)
    seqs = [s for s in law if law[s] > 0]
    tok = torch.tensor(seqs)
    spec = DynamicTree(total=6, depth=2, topk=3)
    st.check(spec, rules.vanilla(), 4, proc)                                    # --fidelity and the sweep use it
    assert st.method(spec, rules.vanilla(), 4) == "mc"
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        st.tree_rows(t, d, [2], tok[:1], spec, processing=proc, seed=-1)
    sums = {False: [], True: []}
    for seed in range(20):
        rows = st.tree_rows(t, d, [2] * len(seqs), tok, spec, processing=proc, seed=seed)
        assert rows.trees.children.shape == (len(seqs), 4, LOSSLESS_TREES, 6, 3)
        rt = RowTrees(rows.trees.children.numpy(), rows.trees.node_depth.numpy(), rows.trees.depth)
        for control in (False, True):
            w = np.ones(rows.weights.shape) if control else rows.weights.numpy()
            out = dynamic_log_likelihood_mc(rows.p.numpy(), rows.q.numpy(), tok.numpy(), rules.vanilla(), rt,
                                            rows.node_tokens.numpy(), groups=st.LOSSLESS_GROUPS, weights=w)
            sums[control].append(np.exp(out["log_p_hat_pooled"]).sum())
        if seed == 0:
            got = st.tree_likelihood(rows, tok, rules.vanilla(), spec, detail=True)
            assert got["kl_method"] == "mc" and np.all(np.isfinite(got["log_p_hat"]))
    ok, ctl = np.array(sums[False]), np.array(sums[True])
    assert abs(ok.mean() - 1) < 4 * ok.std() / np.sqrt(len(ok))
    assert ctl.mean() - 1 > 10 * ctl.std() / np.sqrt(len(ctl))


def test_guided_children_reweighted_are_the_stochastic_beam_law():
    """``theory.tree.guided_children``: orders drawn from its three proposals (a mode per draw, uniform) and weighted
    by the balance heuristic from the log ratios it returns, 1 / mean_m pi_m(order) / q(order), have the law of
    ``child_keys``' orders (Gumbel-top-k), and the keys drawn given the order have its conditional mean (V = 5,
    k = 3, 200,000 draws each; tolerance 4 standard errors). Each proposal alone is right on its own support (the
    orders it can draw): "first" with the path's token x at ranks 1, 2 and 3 (q(x) < p(x): its rank law spreads),
    and with x = 0 (q(x) >= p(x): rank 1 only, as ``rank_guide`` says); its support is every order holding x.
    Control: unweighted, the proposals over-draft x = 4 first."""
    from theory.tree import child_keys, guided_children, rank_guide

    rng = np.random.default_rng(0)
    V, k, N = 5, 3, 200_000
    q = np.broadcast_to(np.array([0.4, 0.3, 0.15, 0.1, 0.05]), (N, V))
    p = np.broadcast_to(np.array([0.1, 0.2, 0.3, 0.2, 0.2]), (N, V))
    z = np.zeros(N)
    i1, k1, l1 = child_keys(z, z, q, -np.log(-np.log(rng.random((N, V)))), k)
    mode = rng.integers(0, 3, N)
    i2, k2, l2, lr = guided_children(z, z, q, p, np.full(N, 4), rng.random((N, k, 3)), k, mode)
    w = 1.0 / ((1 + np.exp(lr[:, 0]) + np.exp(lr[:, 1])) / 3)
    assert abs(w.mean() - 1) < 4 * w.std() / np.sqrt(N)
    np.testing.assert_array_equal(l2, np.log(np.take_along_axis(q, i2, -1)))
    for pat in [(0, 1, 2), (4, 0, 1), (2, 3, 4), (1, 0, 3), (0, 4, 1)]:
        a = np.all(i1 == pat, 1)
        b = w * np.all(i2 == pat, 1)
        assert abs(a.mean() - b.mean()) < 4 * np.sqrt(a.var() / N + b.var() / N), pat
        m2 = np.all(i2 == pat, 1)
        for r in (1, 2):                                    # E[key_r | order] under both
            e1, e2 = k1[a, r].mean(), (w[m2] * k2[m2, r]).sum() / w[m2].sum()
            assert abs(e1 - e2) < 4 * np.sqrt(k1[a, r].var() / a.sum() + k2[m2, r].var() / m2.sum()), (pat, r)
    for x, m, pat in ((4, 1, (4, 0, 1)), (4, 1, (0, 4, 1)), (4, 1, (1, 0, 4)), (4, 2, (0, 1, 2)), (0, 1, (0, 2, 1))):
        u = rng.random((N, k, 3))
        i3, _, _, lr3 = guided_children(z, z, q, p, np.full(N, x), u, k, np.full(N, m))
        a = np.all(i1 == pat, 1)
        b = np.exp(-lr3[:, m - 1]) * np.all(i3 == pat, 1)
        assert abs(a.mean() - b.mean()) < 4 * np.sqrt(a.var() / N + b.var() / N + 1e-12), (x, m, pat)
        if m == 1:                                          # x is always drafted
            assert np.all(np.any(i3 == x, 1))
    has = np.any(i2 == 4, 1)                                # "first" can draw every order holding x (defensive
    assert np.all(np.isfinite(lr[has, 0])) and np.all(np.isneginf(lr[~has, 0]))   # share), no order without it
    i4, _, _, _ = guided_children(z, z, q, p, np.zeros(N, np.int64), rng.random((N, k, 3)), k, np.ones(N, np.int64))
    assert np.all(i4[:, 0] == 0)                            # q(0) >= p(0): rank 1 only
    np.testing.assert_allclose(rank_guide(np.array([0.4, 0.05]), np.array([0.1, 0.2]), 3),
                               [[1, 0, 0], [0.25, 0.75 * 0.6, 0.75 * 0.4]])
    assert np.all(i1[:, :1] == 4, 1).mean() < 0.06 < (i2[mode == 1, 0] == 4).mean()    # q(4) = 0.05


def test_regrown_path_rows_are_the_chain_rows_the_walk_reads(monkeypatch):
    """T15 reads the path nodes' draft rows from the chain rows by round start (``score_tree.tree_rows``' q); the
    regrowth draws the path nodes' children from its own drafter forwards. On the shipped MNIST EAGLE-1 head (2
    images, 49 tokens) the two agree: the root rows exactly at every (round start, tree), and the depth-1 rows
    wherever the path's node was grown (most units). Control: the chain rows one position off match nowhere."""
    import torch

    from real.decode import engine, regrow
    from real.decode import score_tree as st
    from real.decode.dynamic_tree import DynamicTree
    from real.decode.sampling import Processing
    from real.zoo.gpt import load_eagle, load_target
    from theory import rules

    torch.set_num_threads(1)
    t = load_target()
    d = load_eagle(t)
    proc, spec, conds = Processing(cfg_scale=2.0), DynamicTree(), [3, 7]
    gens = engine.generate(t, d, conds, num_tokens=49, verifier=rules.vanilla(), drafting=spec, processing=proc,
                           seed=0, batch_size=2)
    tok = torch.stack([torch.as_tensor(g.tokens) for g in gens])
    seen, orig = [], regrow.guided_children
    monkeypatch.setattr(regrow, "guided_children", lambda *a: (seen.append(a[2].clone()), orig(*a))[1])
    rows = st.tree_rows(t, d, conds, tok, spec, processing=proc)
    q0, q1 = seen[0], seen[1]                        # the first chunk: root rows, then the depth-1 path rows
    ns = np.repeat(np.arange(1, 48), regrow.LOSSLESS_TREES)[:q0.shape[1]]
    assert torch.equal(q0, rows.q[:, ns, 0].double())
    close = lambda a, b: ((a - b).abs().amax(-1) < 1e-5).double().mean().item()    # noqa: E731
    assert close(q1, rows.q[:, ns, 1].double()) > 0.7
    assert close(q0, rows.q[:, ns + 1, 0].double()) < 0.05
