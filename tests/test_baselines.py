"""Baselines as their authors run them: LANTERN / LANTERN++ as released in jadohu/LANTERN,
typical acceptance as in vLLM's sampler, each formula pinned on examples worked by hand below; the released
variants against our renormalised ones where the release differs; the released static-tree walk written
out as a plain loop (independent of theory.tree) against ``verify_tree``; neighbour tables (raw vs l2)
and their validation at the API boundary.

The hand examples use codes on a line at 0, 1, 3, 7, 15 (raw 1-D vectors), so the neighbour lists are
  0: 1 2 3 4    1: 0 2 3 4    2: 1 0 3 4    3: 2 1 0 4    4: 3 2 1 0
and rows in sixteenths (exact binary fractions):
  p = (4, 2, 1, 5, 4) / 16,   q = (8, 2, 2, 2, 2) / 16.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bruteforce as bf
from theory.likelihood import recorded
from theory import rules
from theory.tree import Tree, draft_without_replacement, verify_tree
from theory.rules.chain import verify_chain

LINE = np.array([[0.0], [1.0], [3.0], [7.0], [15.0]])
P = np.array([4, 2, 1, 5, 4]) / 16
Q = np.array([8, 2, 2, 2, 2]) / 16


def nb():
    return rules.lantern_neighbors(LINE)


def given_rejected(v, p, q, x):
    f = v.accept(p, q, 1)
    return f, v.resample(p, q, f, np.int64(x))


def test_line_codebook_neighbours():
    assert nb().tolist() == [[1, 2, 3, 4], [0, 2, 3, 4], [1, 0, 3, 4], [2, 1, 0, 4], [3, 2, 1, 0]]


# ------------------------------------------------------------------ LANTERN++ (static tree, variant "q")

def test_lantern_pp_released_law_with_an_admitted_neighbour():
    """lambda = 2, k = 1. Token 0: threshold (2 - 1) p(0) = 4/16; its nearest neighbour 1 has 2/16 <= 4/16:
    admitted, p~(0) = 6/16, f(0) = (6/16) / (8/16) = 3/4.
    Release after rejecting 0: q' = q with N(0) = {1, 2} (k+1 = 2 nearest) zeroed, NOT renormalised, token 0
    kept: q' = (8, 0, 0, 2, 2)/16; p - q' = (-4, 2, 1, 3, 2)/16; [.]_+ sums to 8/16: G = (0, 2, 1, 3, 2)/8.
    Ours (renormalised): S = {0, 1, 2} zeroed, q renormalised to (0, 0, 0, 1/2, 1/2); [p - q]_+ =
    (4, 2, 1, 0, 0)/16: G = (4, 2, 1, 0, 0)/7.
    G*: f = (3/4, 1, 1/2, 1, 1) (token 2: neighbour 1 has 2/16 > p(2) = 1/16, nothing admitted, f = 1/2);
    q f = (6, 2, 1, 2, 2)/16; [p - q f]_+ = (0, 0, 0, 3, 2)/16: G* = (0, 0, 0, 3, 2)/5."""
    rel, ren, opt = (rules.lantern_pp(nb(), 1, 2.0, r) for r in ("lantern", "renormalised", "optimal"))
    for v in (rel, ren, opt):
        f, _ = given_rejected(v, P, Q, 0)
        assert f.tolist() == [0.75, 1.0, 0.5, 1.0, 1.0]
    assert given_rejected(rel, P, Q, 0)[1].tolist() == (np.array([0, 2, 1, 3, 2]) / 8).tolist()
    assert np.allclose(given_rejected(ren, P, Q, 0)[1], np.array([4, 2, 1, 0, 0]) / 7, rtol=0, atol=1e-15)
    assert np.allclose(given_rejected(opt, P, Q, 0)[1], np.array([0, 0, 0, 3, 2]) / 5, rtol=0, atol=1e-15)


def test_lantern_pp_released_law_without_an_admitted_neighbour():
    """Token 2 (same rows, lambda = 2, k = 1): threshold p(2) = 1/16 < 2/16 = p(nearest neighbour 1): nothing
    admitted, f(2) = (1/16) / (2/16) = 1/2. Release: q kept whole: [p - q]_+ = (0, 0, 0, 3, 2)/16, G = (0, 0, 0,
    3, 2)/5. Ours: S(2) = {2, 1, 0} zeroed, q -> (0, 0, 0, 1/2, 1/2): G = (4, 2, 1, 0, 0)/7."""
    rel = rules.lantern_pp(nb(), 1, 2.0)
    ren = rules.lantern_pp(nb(), 1, 2.0, "renormalised")
    assert given_rejected(rel, P, Q, 2)[0][2] == 0.5
    assert np.allclose(given_rejected(rel, P, Q, 2)[1], np.array([0, 0, 0, 3, 2]) / 5, rtol=0, atol=1e-15)
    assert np.allclose(given_rejected(ren, P, Q, 2)[1], np.array([4, 2, 1, 0, 0]) / 7, rtol=0, atol=1e-15)


def test_lantern_pp_a_zero_mass_neighbour_counts_as_admitted():
    """p = (0, 0, 4, 8, 4)/16, q = (4, 4, 4, 2, 2)/16, lambda = 2, k = 1. Token 0: p(0) = 0, threshold 0, its
    nearest neighbour 1 has mass 0 <= 0: admitted (the release's test is on the cumulative mass), f(0) = 0.
    q' = q with N(0) = {1, 2} zeroed = (4, 0, 0, 2, 2)/16; [p - q']_+ = (0, 0, 4, 6, 2)/16: G = (0, 0, 4, 6, 2)/12.
    Had nothing been admitted: [p - q]_+ = (0, 0, 0, 6, 2)/16 -> (0, 0, 0, 3, 1)/4."""
    p = np.array([0, 0, 4, 8, 4]) / 16
    q = np.array([4, 4, 4, 2, 2]) / 16
    v = rules.lantern_pp(nb(), 1, 2.0)
    assert bool(v.accept.admits(p)[0]) and v.accept(p, q, 1)[0] == 0.0
    assert np.allclose(given_rejected(v, p, q, 0)[1], np.array([0, 0, 4, 6, 2]) / 12, rtol=0, atol=1e-15)


# ------------------------------------------------------------------ LANTERN (dynamic path, variant "p")

def test_lantern_released_law_with_and_without_an_admitted_neighbour():
    """delta = 1/8, k = 1: token 0's nearest neighbour 1 has 2/16 <= 1/8: admitted, p~(0) = 6/16, f(0) = 3/4;
    after rejecting 0 the release zeroes {0} and N(0) = {1, 2}: p -> (0, 0, 0, 5, 4)/16, G = (0, 0, 0, 5, 4)/9
    (ours the same here).
    delta = 1/16: 2/16 > 1/16, nothing admitted, f(0) = (4/16) / (8/16) = 1/2; the release zeroes only {0}:
    G = (0, 2, 1, 5, 4)/12; ours still zeroes {0, 1, 2}: G = (0, 0, 0, 5, 4)/9."""
    for delta, f0, g_rel, g_ren in ((0.125, 0.75, np.array([0, 0, 0, 5, 4]) / 9, np.array([0, 0, 0, 5, 4]) / 9),
                                    (0.0625, 0.5, np.array([0, 2, 1, 5, 4]) / 12, np.array([0, 0, 0, 5, 4]) / 9)):
        rel = rules.lantern(nb(), 1, delta)
        ren = rules.lantern(nb(), 1, delta, "renormalised")
        assert given_rejected(rel, P, Q, 0)[0][0] == f0 == given_rejected(ren, P, Q, 0)[0][0]
        assert np.allclose(given_rejected(rel, P, Q, 0)[1], g_rel, rtol=0, atol=1e-15)
        assert np.allclose(given_rejected(ren, P, Q, 0)[1], g_ren, rtol=0, atol=1e-15)


def test_lantern_released_uniform_when_nothing_is_left():
    """p = (4, 2, 2, 0, 0)/8 rows, delta = 1/2, k = 1, reject 0: admitted (2/8 <= 1/2), {0, 1, 2} zeroed leaves
    no mass: the release falls back to the uniform law (1/5 each)."""
    p = np.array([4, 2, 2, 0, 0]) / 8
    v = rules.lantern(nb(), 1, 0.5)
    assert given_rejected(v, p, Q, 0)[1].tolist() == [0.2] * 5


# ------------------------------------------------------------------ typical acceptance (vLLM / Medusa)

def test_typical_release_entropy_and_argmax_correction():
    """p = (1/2, 1/4, 1/8, 1/8), eps = 1, alpha = 0.42044. Exact entropy H = 1.75 ln 2, exp(-H) = 2^-1.75 =
    0.29730178: threshold 0.42044 * 0.29730178 = 0.124998 < 1/8, so the 1/8 tokens pass (p > threshold).
    Release: H' = -sum p ln(p + 1e-5) = H - sum p ln(1 + 1e-5/p) = H - (4e-5 - 5.5e-10) to first orders, so the
    threshold is larger by the factor e^(4e-5): 0.125003 > 1/8, and the 1/8 tokens are rejected.
    Correction after a rejection: the release emits argmax p = token 0; G* with q = (1, 1, 2, 4)/8 and f = (1, 1,
    0, 0) is Norm([p - q f]_+) = Norm((3, 1, 1, 1)/8) = (1/2, 1/6, 1/6, 1/6)."""
    p = np.array([0.5, 0.25, 0.125, 0.125])
    q = np.array([1, 1, 2, 4]) / 8
    rel = rules.typical(1.0, 0.42044)
    ours = rules.typical(1.0, 0.42044, resample="optimal", entropy="exact")
    assert rel.accept(p, q, 1).tolist() == [1.0, 1.0, 0.0, 0.0]
    assert ours.accept(p, q, 1).tolist() == [1.0, 1.0, 1.0, 1.0]
    f = rel.accept(p, q, 1)
    assert rel.resample(p, q, f, np.int64(3)).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert np.allclose(rules.typical(1.0, 0.42044, resample="optimal").resample(p, q, f, np.int64(3)),
                       [0.5, 1 / 6, 1 / 6, 1 / 6], rtol=0, atol=1e-15)
    # in a chain: draft token 2 at position 1 is rejected and the next token is argmax p = 0 whatever u_sample
    pr = np.stack([p, p])[None]
    for u in (0.01, 0.6, 0.99):
        out = verify_chain(pr, q[None, None], np.array([[2]]), np.array([[0.0]]), np.array([u]), rel)
        assert int(out.accepted[0]) == 0 and int(out.next_token[0]) == 0


# ------------------------------------------------------------------ where the variants differ

def test_second_candidate_in_a_tree_sees_a_different_residual():
    """Tree node with candidates (0, 3), the rows of the first example: after rejecting candidate 0 the draft
    row is q_2 = q without 0, renormalised = (0, 1, 1, 1, 1)/4. Release: p_2 = (0, 2, 1, 3, 2)/8; candidate 3:
    threshold p_2(3) = 3/8, nearest neighbour 2 has 1/8: admitted, p~ = 4/8, f = min(1, (4/8)/(1/4)) = 1.
    Ours: p_2 = (4, 2, 1, 0, 0)/7; p_2(3) = 0, neighbour 2 has 1/7 > 0: nothing admitted, f = 0."""
    q2 = np.array([0, 1, 1, 1, 1]) / 4
    for r, f3 in (("lantern", 1.0), ("renormalised", 0.0)):
        v = rules.lantern_pp(nb(), 1, 2.0, r)
        p2 = v.resample(P, Q, v.accept(P, Q, 1), np.int64(0))
        assert v.accept(p2, q2, 1)[3] == f3
    # the same through verify_tree: root candidates 0 (rejected: u = 0.9 >= 3/4) then 3 (u = 0.5)
    tree = Tree(((0,), (1,)))
    p = np.stack([P, P, P])[None]
    q = np.stack([Q, Q, Q])[None]
    toks = np.array([[0, 0, 3]])
    depth = {r: int(verify_tree(p, q, toks, np.array([[0.0, 0.9, 0.5]]), np.array([0.5]), tree,
                                rules.lantern_pp(nb(), 1, 2.0, r)).accepted[0]) for r in ("lantern", "renormalised")}
    assert depth == {"lantern": 1, "renormalised": 0}


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(5, 9), st.sampled_from(["lantern", "lantern++"]))
def test_acceptance_is_the_same_and_the_law_differs_only_where_the_issue_says(seed, V, kind):
    """Same f for the released and renormalised variants (and G*); after a rejection the laws agree exactly when
    the renormalisation is a no-op and differ otherwise on some rows of a random batch (checked in aggregate)."""
    rng = np.random.default_rng(seed)
    table = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    p = rng.dirichlet(np.full(V, 0.5), size=64)
    q = rng.dirichlet(np.full(V, 0.5), size=64)
    mk = (lambda r: rules.lantern(table, 1, 0.15, r)) if kind == "lantern" else (lambda r: rules.lantern_pp(table, 1, 2.0, r))
    rel, ren, opt = mk("lantern"), mk("renormalised"), mk("optimal")
    f = rel.accept(p, q, 1)
    assert np.array_equal(f, ren.accept(p, q, 1)) and np.array_equal(f, opt.accept(p, q, 1))
    x = rng.integers(V, size=64)
    g_rel = rel.resample(p, q, f, x)
    g_ren = ren.resample(p, q, f, x)
    adm = rel.accept.admits(p)[np.arange(64), x]
    if kind == "lantern":
        # the laws agree exactly where a neighbour was admitted (both remove {x} + N(x))
        assert np.allclose(g_rel[adm], g_ren[adm], atol=1e-12)
    tv = 0.5 * np.abs(g_rel - g_ren).sum(1)
    assert tv.max() > 1e-3


# ------------------------------------------------------------------ the released static-tree walk as a loop

def release_walk(p, q, tokens, u_accept, u_sample, tree, table, k, lam):
    """One round of the release's static-tree verification (evaluate_posterior_v1), one round at a time.
    Returns (accepted depth, next token)."""
    node, depth = 0, 0
    while True:
        kids = [int(c) for c in tree.children[node] if c >= 0]
        if not kids:
            return depth, _inverse_cdf(p[node], u_sample)
        gtp = p[node].copy()
        earlier = []
        moved = False
        for kid in kids:
            x = int(tokens[kid])
            qj = q[node].copy()
            qj[earlier] = 0.0
            qj = qj / qj.sum() if qj.sum() > 0 else qj
            earlier.append(x)
            if qj[x] <= 0:
                continue
            c = np.cumsum(gtp[table[x, :k]])
            ok = c <= (lam - 1) * gtp[x]
            px = gtp[x] + (c[ok][-1] if ok.any() else 0.0)
            if u_accept[kid] < px / qj[x]:
                node, depth, moved = kid, depth + 1, True
                break
            qq = qj.copy()
            if ok.any():
                qq[table[x, : k + 1]] = 0.0
            gtp = np.maximum(gtp - qq, 0.0)
            gtp = gtp / gtp.sum() if gtp.sum() > 0 else np.full_like(gtp, 1 / len(gtp))
        if not moved:
            return depth, _inverse_cdf(gtp, u_sample)


def _inverse_cdf(w, u):
    c = np.cumsum(w)
    return int(min(np.sum(c <= u * c[-1]), len(w) - 1))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_verify_tree_walks_as_the_release(seed):
    rng = np.random.default_rng(seed)
    V, R, k, lam = 6, 200, 1, 2.0
    tree = Tree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
    N = tree.n_nodes
    table = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    p = rng.dirichlet(np.full(V, 0.4), size=(R, N + 1))
    p[rng.random(p.shape) < 0.2] = 0.0
    p[p.sum(-1) == 0, 0] = 1.0
    p /= p.sum(-1, keepdims=True)
    q = rng.dirichlet(np.full(V, 2.0), size=(R, N + 1))            # full support: enough candidates to draw
    tokens = np.zeros((R, N + 1), dtype=np.int64)
    for n in range(N + 1):                                            # each node's children without replacement
        kids = [int(c) for c in tree.children[n] if c >= 0]
        if kids:
            tokens[:, kids] = draft_without_replacement(q[:, n], len(kids), rng.gumbel(size=(R, V)))
    ua, us = rng.random((R, N + 1)), rng.random(R)
    out = verify_tree(p, q, tokens, ua, us, tree, rules.lantern_pp(table, k, lam))
    ref = [release_walk(p[r], q[r], tokens[r], ua[r], us[r], tree, table, k, lam) for r in range(R)]
    assert np.asarray(out.accepted).tolist() == [d for d, _ in ref]
    assert np.asarray(out.next_token).tolist() == [t for _, t in ref]
    # negative control: our renormalised variant walks differently on some of these rounds
    alt = verify_tree(p, q, tokens, ua, us, tree, rules.lantern_pp(table, k, lam, "renormalised"))
    assert np.asarray(alt.next_token).tolist() != [t for _, t in ref] or \
        np.asarray(alt.accepted).tolist() != [d for d, _ in ref]


# ------------------------------------------------------------------ effective laws (section 6) by enumeration

@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(3, 7), st.integers(1, 2), st.sampled_from("pq"),
       st.sampled_from(["released", "renormalised"]))
def test_effective_law_is_the_mixture_over_rejected_tokens(seed, V, k, variant, law):
    """G_eff = sum_x q(x) (1 - f(x)) G(.|x) / (1 - beta), brute force with the scalar references, on numpy and
    torch (batched rows with zeros)."""
    torch = pytest.importorskip("torch")
    k = min(k, V - 2)
    rng = np.random.default_rng(seed)
    table = rules.lantern_neighbors(rng.normal(size=(V, 2)))
    p = rng.dirichlet(np.full(V, 0.5), size=6)
    q = rng.dirichlet(np.full(V, 0.5), size=6)
    p[rng.random(p.shape) < 0.25] = 0.0
    p[p.sum(1) == 0, 0] = 1.0
    p /= p.sum(1, keepdims=True)
    kw = {"delta": 0.2} if variant == "p" else {"lam": 2.0}
    acc = rules.Lantern(table, k, **kw)
    G = rules.LanternResample(table, k, variant, law, acc)
    f = acc(p, q, 1)
    got = G(p, q, f)
    got_t = G(torch.as_tensor(p), torch.as_tensor(q), torch.as_tensor(f)).numpy()
    for r in range(len(p)):
        pr, qr, fr = list(p[r]), list(q[r]), list(f[r])
        w = [qr[x] * (1 - fr[x]) for x in range(V)]
        if sum(w) == 0:
            want = pr
        else:
            want = [0.0] * V
            for x in range(V):
                if w[x] > 0:
                    g = (bf.lantern_g_released(pr, qr, table, k, x, variant, **kw) if law == "released"
                         else bf.lantern_g(pr, qr, table, k, x, variant))
                    want = [a + w[x] * b / sum(w) for a, b in zip(want, g)]
        assert np.allclose(got[r], want, atol=1e-12) and np.allclose(got_t[r], want, atol=1e-12)


def test_recorded_predictions_cover_the_released_variants():
    """T10 / T11 from recorded rounds use the released effective law: the bound term of a one-position round is
    D = 1/2 |q f + (1 - beta) G_eff - p|_1 (T3), here checked against the brute-force mixture."""
    rng = np.random.default_rng(3)
    V = 5
    table = nb()
    p = rng.dirichlet(np.ones(V), size=(40, 2))
    q = rng.dirichlet(np.ones(V), size=(40, 1))
    drafts = rng.integers(V, size=(40, 1))
    for v, variant, kw in ((rules.lantern(table, 1, 0.2), "p", {"delta": 0.2}),
                           (rules.lantern_pp(table, 1, 2.0), "q", {"lam": 2.0})):
        pred = recorded.predict_rounds(p, q, drafts, v)
        for r in range(40):
            pr, qr = list(p[r, 0]), list(q[r, 0])
            f = bf.scaled_f(1.0, bf.lantern_ptilde(pr, table, 1, **kw), qr)
            w = [qr[x] * (1 - f[x]) for x in range(V)]
            beta = 1 - sum(w)
            g = [0.0] * V
            for x in range(V):
                if w[x] > 0:
                    gx = bf.lantern_g_released(pr, qr, table, 1, x, variant, **kw)
                    g = [a + w[x] * b / sum(w) for a, b in zip(g, gx)]
            D = 0.5 * sum(abs(qr[y] * f[y] + (1 - beta) * g[y] - pr[y]) for y in range(V))
            assert math.isclose(float(pred.bound[r]), D, abs_tol=1e-12)
            assert math.isclose(float(pred.accepted[r]), f[int(drafts[r, 0])], abs_tol=1e-12)


# ------------------------------------------------------------------ neighbour tables

def test_raw_and_l2_tables_differ_on_a_codebook_with_varied_norms():
    """Codes (1, 0), (3, 0), (0, 1.2). Raw: |c0 - c2| = sqrt(1 + 1.44) = 1.56 < |c0 - c1| = 2, so code 0's nearest
    is 2 (the release's table); code 1: |c1 - c0| = 2 < |c1 - c2| = sqrt(9 + 1.44) = 3.23; code 2: 1.56 < 3.23.
    l2-normalised: c0 and c1 both become (1, 0), distance 0: code 0's nearest is 1 (ours)."""
    E = np.array([[1.0, 0.0], [3.0, 0.0], [0.0, 1.2]])
    assert rules.lantern_neighbors(E)[0].tolist() == [2, 1]
    assert rules.lantern_neighbors(E, normalize=True)[0].tolist() == [1, 2]
    torch = pytest.importorskip("torch")
    from real.models.vq import codebook_neighbors
    assert codebook_neighbors(torch.as_tensor(E), 2).tolist() == [[2, 1], [0, 2], [0, 1]]
    assert codebook_neighbors(torch.as_tensor(E), 2, normalize=True)[0].tolist() == [1, 2]


@pytest.mark.parametrize("bad, msg", [
    (np.array([[1, -1], [0, 2], [1, 0]]), r"neighbors entries must be code ids in \[0, 3\).*-1"),
    (np.array([[1, 3], [0, 2], [1, 0]]), r"neighbors entries must be code ids in \[0, 3\)"),
    (np.array([1, 2, 0]), r"neighbors must be a 2-D \(V, K\) table"),
    ([[1, 2], [0, 2], [1, 0]], r"neighbors must be a \(V, K\) integer array.*list"),
    (np.array([[1.0, 2.0], [0.0, 2.0], [1.0, 0.0]]), r"neighbors must hold integer code ids"),
    (np.array([[0, 2], [0, 2], [1, 0]]), r"neighbors: row 0 lists its own code"),
    (np.array([[1, 1], [0, 2], [1, 0]]), r"neighbors: row 0 lists a code twice"),
])
def test_bad_neighbour_tables_are_refused_naming_the_argument(bad, msg):
    for make in (lambda: rules.Lantern(bad, 2, delta=0.1), lambda: rules.lantern(bad, 1, 0.1),
                 lambda: rules.lantern_pp(bad, 2, 2.0, "optimal"),
                 lambda: rules.LanternResample(bad, 1, "p", "renormalised")):
        with pytest.raises(ValueError, match=msg):
            make()


def test_neighbour_tables_are_checked_on_the_columns_a_rule_reads():
    """Acceptance reads k columns, the released resampler k + 1: a code listed twice only in column 3 of a
    4-column table passes a rule reading 2 (no sort of the unread columns) and is refused by one reading 3."""
    bad = np.array([[1, 2, 3, 1], [0, 2, 3, 0], [0, 1, 3, 0], [0, 1, 2, 0]])
    rules.Lantern(bad, 2, delta=0.1)
    rules.lantern(bad, 1, 0.1)                          # (acceptance 1 column, its resampler 2)
    for make in (lambda: rules.Lantern(bad, 4, delta=0.1), lambda: rules.lantern(bad, 3, 0.1)):
        with pytest.raises(ValueError, match="row 0 lists a code twice"):
            make()


def test_bad_neighbour_tables_on_torch_and_bad_options():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"neighbors entries must be code ids in \[0, 3\)"):
        rules.lantern(torch.tensor([[1, -1], [0, 2], [1, 0]]), 1, 0.1)
    with pytest.raises(ValueError, match="released law needs accept=Lantern"):
        rules.LanternResample(nb(), 1, "p")
    with pytest.raises(ValueError, match="law must be one of"):
        rules.LanternResample(nb(), 1, "p", "paper")
    with pytest.raises(ValueError, match=r"unknown resampler 'argmax2'"):
        rules.lantern(nb(), 1, 0.1, "argmax2")
    with pytest.raises(ValueError, match="entropy must be 'release' or 'exact'"):
        rules.typical(entropy="nat")
    with pytest.raises(ValueError, match="embeddings contain NaN"):
        rules.lantern_neighbors(np.array([[0.0], [np.nan], [1.0]]))


# ------------------------------------------------------------------ the CLI runs the released baselines

def test_cli_runs_the_released_lantern_pp_and_selects_the_variants(capsys):
    import json

    from coolsd.cli import main

    def run(*extra):
        assert main(["generate", "--model", "mnist", "--method", "lantern++", "--tree", "eagle25", "--num-tokens", "12",
                     "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert (run()["verifier"], run()["params"]["resampler"]) == ("lantern++", "lantern")
    assert run("--resampler", "renormalised")["verifier"] == "lantern++-renormalised"
    assert run("--resampler", "optimal")["verifier"] == "lantern++G*"
    assert run("--resampler", "lantern", "--lantern-neighbors", "l2")["verifier"] == "lantern++"
    for argv, msg in ((["--method", "lantern++", "--resampler", "argmax"], "parameter 'resampler' must be one of"),
                      (["--method", "vanilla", "--resampler", "optimal"], "--resampler do(es) not apply to method vanilla")):
        assert main(["generate", "--model", "mnist", *argv, "--num-tokens", "4", "--json"]) == 2
        assert msg in capsys.readouterr().err


def test_method_registry_maps_resampler_names_to_the_rules():
    from real.decode.methods import make_verifier

    table = rules.lantern_neighbors(np.random.default_rng(0).normal(size=(40, 2)))
    names = {r: make_verifier("lantern", 4, {"resampler": r}, table).name for r in rules.LANTERN_RESAMPLERS}
    assert names == {"lantern": "lantern", "renormalised": "lantern-renormalised", "optimal": "lantern+G*"}
    assert make_verifier("typical", 4).resample == rules.Argmax()
    assert make_verifier("typical", 4, {"resampler": "optimal"}).resample == rules.Optimal()
