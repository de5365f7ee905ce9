"""Dynamic draft trees (EAGLE-2 / LANTERN release default mode; docs/theory.md section 10): the theory pieces
(stochastic-beam-search keys, the node selection, per-round trees) against brute force, the point-mass draft law
against an exact enumeration, and the engine's batched dynamic rounds: greedy identities at B = 1 and B > 1 with
and without CFG, the chi-square law test of the lossless mode at B > 1 with negative controls, the release mode's
measured deviation, per-row masks that never leak, and bad input."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from theory import rules
from theory.tree.dynamic import child_keys, select_nodes
from theory.likelihood.recorded import predict_tree_rounds
from theory.rules import Target, Vanilla, Verifier
from theory.tree import EAGLE_25, Tree, row_trees, verify_tree
from real.decode import dynamic_tree as dt
from real.decode.dynamic_tree import DynamicTree
from real.decode.sampling import Processing
from real.registry import tiny_llamagen_pair
from real.models.eagle import EagleDrafter

from test_real_engine import _chi2, _exact_law, _law_models

torch.set_num_threads(1)  # tiny models: threads only contend (see test_real_engine)


# --------------------------------------------------------------------------- generation through the engine

def _generate(target, draft, conds, T, verifier, spec, proc, seed=0, batch_size=None, record=False):
    """Dynamic-tree generation of one image per condition: tokens (n, T) (and the per-batch steps)."""
    from real.decode import engine

    gens = engine.generate(target, draft, conds, num_tokens=T, verifier=verifier, drafting=spec, processing=proc,
                           seed=seed, batch_size=batch_size or len(conds), record_rows=record)
    return torch.stack([g.tokens for g in gens]), gens


# --------------------------------------------------------------------------- theory: keys, selection, trees

def _sbs_key_direct(G, phi, Z):
    """-log(exp(-G) - exp(-Z) + exp(-phi)) in exact-enough arithmetic (math.fsum over floats of moderate size)."""
    return -math.log(math.fsum([math.exp(-G), -math.exp(-Z), math.exp(-phi)]))


def test_child_keys_are_truncated_gumbels_of_a_draw_without_replacement():
    """The children are the Gumbel-top-k of parent_logp + log q + g (the draw without replacement), the first
    child's key is the parent's key exactly, keys decrease, and each equals the direct formula of Kool et al."""
    rng = np.random.default_rng(0)
    V, k = 7, 4
    for _ in range(20):
        q = rng.dirichlet(np.ones(V))
        q[rng.integers(V)] = 0.0
        q /= q.sum()
        g = rng.gumbel(size=V)
        G, lp = rng.normal(), -abs(rng.normal())
        tok, key, logp = child_keys(np.array(G), np.array(lp), q, g, k)
        with np.errstate(divide="ignore"):
            phi = lp + np.log(q) + g
        assert tok.tolist() == list(np.argsort(-phi, kind="stable")[:k])
        assert key[0] == G and np.all(np.diff(key) < 0)
        Z = phi.max()
        for j in range(1, k):
            if np.isfinite(phi[tok[j]]):
                assert abs(key[j] - _sbs_key_direct(G, phi[tok[j]], Z)) < 1e-9
            else:
                assert key[j] == -np.inf
        with np.errstate(divide="ignore"):
            assert np.allclose(logp, lp + np.log(q[tok]))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 9))
def test_select_nodes_matches_brute_force(seed, n):
    """The n best pool nodes (key desc, ties to the lower index), ordered by index, with node parents: against a
    sort of Python tuples; the selection is closed under ancestors when keys never increase along paths."""
    rng = np.random.default_rng(seed)
    M = 10
    parent = np.array([-1, -1, -1] + [int(rng.integers(0, i)) for i in range(3, M)])
    key = np.zeros(M)
    for i in range(M):   # keys never increase along a path; some ties (rounded)
        key[i] = (0.0 if parent[i] < 0 else key[parent[i]]) - round(float(rng.exponential()), 1)
    n = min(n, M)
    sel, par = select_nodes(key[None], parent[None], n)
    best = sorted(sorted(range(M), key=lambda i: (-key[i], i))[:n])
    assert sel[0].tolist() == best
    node_of = {pool: j + 1 for j, pool in enumerate(best)}
    assert par[0].tolist() == [-1] + [0 if parent[i] < 0 else node_of[parent[i]] for i in best]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_row_trees_match_brute_force(seed):
    """children by rank and node depths from parent pointers, per round, against a Python walk."""
    rng = np.random.default_rng(seed)
    R, N, K = 3, 8, 4
    parent = np.full((R, N + 1), -1)
    for r in range(R):
        for a in range(1, N + 1):
            while True:
                b = int(rng.integers(0, a))
                if (parent[r, 1:a] == b).sum() < K:
                    break
            parent[r, a] = b
    t = row_trees(parent, K)
    for r in range(R):
        for n in range(N + 1):
            kids = [a for a in range(1, N + 1) if parent[r, a] == n]
            assert t.children[r, n].tolist() == kids + [-1] * (K - len(kids))
            d, a = 0, n
            while parent[r, a] >= 0:
                a, d = parent[r, a], d + 1
            assert t.node_depth[r, n] == d
    assert t.depth == int(t.node_depth.max())
    given_d = row_trees(parent, K, depth=t.depth, node_depth=t.node_depth)   # the engine passes the depths it built
    assert np.array_equal(given_d.children, t.children) and np.array_equal(given_d.node_depth, t.node_depth)
    with pytest.raises(ValueError, match="node_depth must have the shape"):
        row_trees(parent, K, node_depth=t.node_depth[:, 1:])


def test_row_trees_reduce_to_the_static_walk_and_prediction():
    """A static tree given per round (RowTrees) verifies and predicts exactly as the static tree."""
    tree = Tree(EAGLE_25)
    R, V = 40, 6
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(V), size=(R, 26))
    q = rng.dirichlet(np.ones(V), size=(R, 26))
    tok = rng.integers(0, V, (R, 26))
    rt = row_trees(np.broadcast_to(tree.parent, (R, 26)).copy(), 4)
    u, us = rng.random((R, 26)), rng.random(R)
    for v in (rules.vanilla(), rules.cool_sd(0.5)):
        a, b = verify_tree(p, q, tok, u, us, tree, v), verify_tree(p, q, tok, u, us, rt, v)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        a, b = predict_tree_rounds(p, q, tok, tree, v), predict_tree_rounds(p, q, tok, rt, v)
        assert np.array_equal(a.accepted, b.accepted) and np.array_equal(a.bound, b.bound)


def _point_walk_law(P, s, kids_of, V, D, f_rule):
    """Exact law of the next D+1 tokens of one round with DETERMINISTIC candidates ``kids_of(prefix)`` (a
    function of the accepted prefix) verified by the point-mass draft law (q_j = one-hot(c_j)), on a Markov chain
    P: a brute-force recursion independent of verify_tree. ``f_rule(p, c)``: the acceptance probability."""
    law = np.zeros((V,) * (D + 1))

    def extend(prefix, prob, row):
        rem = D + 1 - len(prefix)
        for tail in itertools.product(range(V), repeat=rem):
            pr, last, r = prob, prefix[-1] if prefix else s, row
            for j, x in enumerate(tail):
                pr *= r[x]
                r = P[x]
            law[tuple(prefix) + tail] += pr

    def node(prefix, prob):
        p = P[prefix[-1] if prefix else s].copy()
        cands = kids_of(tuple(prefix)) if len(prefix) < D else []
        for c in cands:
            f = f_rule(p, c)
            if f > 0:
                node(prefix + [c], prob * f)
            prob *= (1 - f)
            if prob == 0:
                return
            p = p.copy()
            p[c] = 0.0
            p /= p.sum()
        extend(prefix, prob, p)

    node([], 1.0)
    return law


def test_point_mass_verification_of_any_fixed_candidates_is_lossless():
    """Section 10, proposition 1: candidates fixed before verification (the release's top-k tree, whatever
    decided its shape) verified with q_j = one-hot(c_j) give exactly the target's law (vanilla); the walk
    of verify_tree with draft_law='point' matches the brute-force law of that walk (Monte Carlo), and a relaxed
    acceptance (f = min(1, 2 p)) is not lossless (the negative control of the derivation)."""
    rng = np.random.default_rng(3)
    V, D = 4, 2
    P = rng.dirichlet(np.ones(V), size=V)
    kids = {(): [2, 0], (2,): [1], (0,): [3, 1, 0], (0, 3): [], (2, 1): []}
    kf = lambda pre: kids.get(pre, [])  # noqa: E731
    target = np.einsum("a,ab,bc->abc", P[1], P, P)
    law = _point_walk_law(P, 1, kf, V, D, lambda p, c: p[c])
    assert abs(law.sum() - 1) < 1e-12 and np.abs(law - target).max() < 1e-12
    relaxed = _point_walk_law(P, 1, kf, V, D, lambda p, c: min(1.0, 2 * p[c]))
    assert 0.5 * np.abs(relaxed - target).sum() > 0.02
    # verify_tree's point walk on this tree (nodes by depth) reproduces the law's first two tokens
    paths = ((0,), (1,), (0, 0), (1, 0), (1, 1), (1, 2))     # node 1 = token 2, node 2 = token 0, ...
    tree = Tree(paths)
    tok = np.array([1, 2, 0, 1, 3, 1, 0])
    p_rows = np.stack([P[1], P[2], P[0], P[1], P[3], P[1], P[0]])
    n = 200_000
    u, us = rng.random((n, 7)), rng.random(n)
    pb = np.broadcast_to(p_rows, (n, 7, V))
    v = verify_tree(pb, pb, np.broadcast_to(tok, (n, 7)), u, us, tree, rules.vanilla(), draft_law="point")
    first = np.where(v.accepted >= 1, tok[np.maximum(v.path[:, 0], 0)], v.next_token)
    emp = np.bincount(first, minlength=V) / n
    assert np.abs(emp - P[1]).max() < 4 * np.sqrt(0.25 / n)


# --------------------------------------------------------------------------- engine: greedy identities

@pytest.fixture(scope="module")
def llamagen():
    return tiny_llamagen_pair(seed=0)


@pytest.mark.parametrize("kind", ["eagle", "small"])
@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_greedy_dynamic_equals_plain_greedy_at_every_batch_size(llamagen, kind, cfg):
    """Greedy dynamic trees (release defaults and a small tree) give plain greedy's tokens at B = 1 and B = 3."""
    from real.decode import engine

    t = llamagen[0]
    d = EagleDrafter.from_target(t, seed=3) if kind == "eagle" else llamagen[1]
    proc = Processing(temperature=0, cfg_scale=cfg)
    conds, T = [3, 5, 7], 24
    ref = torch.stack([engine.ar_generate(t, c, num_tokens=T, processing=proc).tokens for c in conds])
    accepted = 0
    for spec in (DynamicTree(), DynamicTree(total=9, depth=2, topk=3)):
        for B in (1, 3):
            out, gens = _generate(t, d, conds, T, rules.greedy(), spec, proc, batch_size=B)
            assert torch.equal(out, ref), (spec, B)
            accepted = max(accepted, max(r.accepted for g in gens for r in g.rounds))
    assert kind == "eagle" or accepted >= 2      # the trees were used (the random EAGLE drafter rarely hits)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_grown_tree_depths_are_the_pointer_jumped_depths(llamagen, monkeypatch, temperature):
    """grow_tree hands its node depths to row_trees (no pointer jumping): on every round of a batched run, to the
    last (truncated) rounds of each image, they equal the depths the parent pointers give."""
    from real.decode import dynamic_tree as DT

    orig, seen = DT.row_trees, []

    def check(parent, K, depth=None, node_depth=None):
        assert np.array_equal(np.asarray(node_depth), np.asarray(orig(parent, K, depth=depth).node_depth))
        seen.append(int(np.asarray(node_depth).max()))
        return orig(parent, K, depth=depth, node_depth=node_depth)

    monkeypatch.setattr(DT, "row_trees", check)
    t, d = llamagen
    _generate(t, d, [1, 4, 6], 20, rules.greedy() if temperature == 0 else rules.vanilla(),
              DynamicTree(total=9, depth=2, topk=3), Processing(temperature=temperature, cfg_scale=3.0), batch_size=3)
    assert len(seen) > 3 and max(seen) == 3 and min(seen) < 3     # full-depth rounds and truncated ones


@pytest.mark.parametrize("sampling", ["lossless", "release"])
def test_an_image_grows_the_tree_it_grows_alone(llamagen, monkeypatch, sampling):
    """Image k of a batched dynamic-tree run depends only on (seed, k): near its end an image's tree is selected among
    its own levels only (deeper nodes the batch grew rank last), so a relaxed rule's tokens at B = 4 equal those at
    B = 1, image by image (temperature 0.3: peaked draft rows, whose deep nodes outrank shallow ones when left in).
    Negative control: selecting among every grown level (no per-image caps) changes some image's tokens."""
    t, d = llamagen
    spec, proc, conds, T = DynamicTree(total=5, depth=3, topk=3, sampling=sampling), Processing(0.3, cfg_scale=2.0), \
        [1, 4, 6, 2, 7, 3], 24
    run = lambda B, s: _generate(t, d, conds, T, rules.cool_sd(3.0), spec, proc, seed=s, batch_size=B)[0]  # noqa: E731
    alone = [run(1, s) for s in range(3)]
    assert all(torch.equal(run(6, s), alone[s]) for s in range(3))
    orig = dt.grow_tree
    monkeypatch.setattr(dt, "grow_tree", lambda *a, caps=None, **kw: orig(*a, **kw))
    assert not all(torch.equal(run(6, s), alone[s]) for s in range(3))


# --------------------------------------------------------------------------- engine: the law (chi-square)

def _counts(t, d, verifier, spec, proc, T, N, B, seed):
    out, _ = _generate(t, d, [2] * N, T, verifier, spec, proc, seed=seed, batch_size=B)
    c: dict = {}
    for s in out.tolist():
        c[tuple(s)] = c.get(tuple(s), 0) + 1
    return c


def test_lossless_dynamic_trees_follow_the_target_law_at_batch_size_50():
    """Section 10, theorem: stochastic-beam-search trees verified by the vanilla multi-candidate walk output the
    target's law exactly, batched (B = 50, every image its own tree).

    V = 4, T = 4, CFG 1.5 + temperature 0.9 + top-k 3 (81 support sequences, exact law by enumeration); tree
    total 6, depth 2, topk 3 (pool 21, depth 3). N = 1500 images: a cell of probability 0.02 has expected count
    30, SE 5.5. Negative controls, which must be rejected at p < 1e-3: the wrong resampler (the target row after
    a rejection; chi-square ~240 when written) and the release's deterministic top-k tree verified as if its
    candidates were drawn from q (the mistake the release avoids with qx = 1; chi-square ~85, p ~ 1e-7)."""
    t, d = _law_models()
    proc = Processing(temperature=0.9, top_k=3, cfg_scale=1.5)
    T, N, B = 4, 1500, 50
    law = _exact_law(t, 2, T, proc)
    assert sum(v > 0 for v in law.values()) == 81
    spec = DynamicTree(total=6, depth=2, topk=3)
    p_ok, s_ok = _chi2(_counts(t, d, rules.vanilla(), spec, proc, T, N, B, 1), law, N)
    p_c1, s_c1 = _chi2(_counts(t, d, Verifier(Vanilla(), Target(), "wrong-resampler"), spec, proc, T, N, B, 1), law, N)
    wrong = DynamicTree(total=6, depth=2, topk=3, sampling="release")
    orig = DynamicTree.draft_law
    try:
        DynamicTree.draft_law = property(lambda self: "without_replacement")   # top-k candidates as if sampled
        p_c2, s_c2 = _chi2(_counts(t, d, rules.vanilla(), wrong, proc, T, N, B, 3), law, N)
    finally:
        DynamicTree.draft_law = orig
    print(f"chi2 lossless p = {p_ok:.3g} ({s_ok:.1f}); wrong resampler p = {p_c1:.3g} ({s_c1:.1f}); "
          f"top-k as sampled p = {p_c2:.3g} ({s_c2:.1f})")
    assert p_ok > 1e-3
    assert p_c1 < 1e-3 and p_c2 < 1e-3


def test_release_mode_deviation_is_measured():
    """The release's construction (top-k candidates, qx = 1) is lossless under vanilla (section 10,
    proposition 1): chi-square and TV on the same setting (N = 1500, B = 50). The TV printed is the empirical
    one (sampling noise alone gives ~0.04 here: the lossless mode's figure on the same N)."""
    t, d = _law_models()
    proc = Processing(temperature=0.9, top_k=3, cfg_scale=1.5)
    T, N, B = 4, 1500, 50
    law = _exact_law(t, 2, T, proc)
    c = _counts(t, d, rules.vanilla(), DynamicTree(total=6, depth=2, topk=3, sampling="release"), proc, T, N, B, 1)
    p, s = _chi2(c, law, N)
    tv = 0.5 * sum(abs(c.get(k, 0) / N - law[k]) for k in law)
    print(f"release mode: chi2 p = {p:.3g} (stat {s:.1f}), empirical TV {tv:.3f}")
    assert p > 1e-3 and tv < 0.08


# --------------------------------------------------------------------------- engine: batching and masks

def test_per_row_masks_never_leak(llamagen):
    """A block with one tree mask per row (KVCache per-row masks, rows at different lengths) scores every row
    as that row alone under its own (S, K) mask: nothing of another row's tree, or of a longer row's cache
    slots, leaks into a row's attention."""
    t = llamagen[0]
    rng = np.random.default_rng(0)
    parents = [torch.tensor([[-1, 0, 0, 1, 1, 2]]), torch.tensor([[-1, 0, 1, 2, 0, 4]])]
    masks = torch.cat([dt._ancestors(p, 5) for p in parents])                   # (2, 6, 6)
    depth = torch.cat([row_trees(p, 5).node_depth for p in parents])             # (2, 6)
    toks = torch.as_tensor(rng.integers(0, t.vocab_size, (2, 6)))
    seqs = torch.as_tensor(rng.integers(0, t.vocab_size, (2, 5)))
    t.prefill([1, 2], seqs)
    t.rollback(np.array([2, 0]))                                                # rows hold 3 and 5 image tokens
    pos = torch.as_tensor(t.cache_lens)[:, None] + depth
    out = t.forward(toks, position_ids=pos, attn_mask=masks).logits
    assert not torch.equal(masks[0], masks[1])
    for r, (c, n) in enumerate(((1, 3), (2, 5))):
        t.prefill([c], seqs[r:r + 1, :n])
        one = t.forward(toks[r:r + 1], position_ids=(int(t.cache_lens[0]) + depth[r])[None], attn_mask=masks[r])
        assert torch.allclose(out[r], one.logits[0], atol=1e-5), r


# --------------------------------------------------------------------------- bad input

def test_bad_input(llamagen):
    t, d = llamagen
    for kw, msg in [(dict(total=0), "total"), (dict(depth=0), "depth"), (dict(topk=0), "topk"),
                    (dict(sampling="x"), "sampling"), (dict(total=50, depth=1, topk=3), "exceeds")]:
        with pytest.raises(ValueError, match=msg):
            DynamicTree(**kw)
    proc = Processing()
    with pytest.raises(ValueError, match="vocabulary"):
        DynamicTree(topk=t.vocab_size + 1, total=5).check(t, d, 16, rules.vanilla(), proc, 1)
    with pytest.raises(ValueError, match="room"):
        DynamicTree(total=200, depth=4, topk=10).check(t, d, 16, rules.vanilla(), proc, 1)

    class NoRowMasks:
        vocab_size = t.vocab_size
        row_masks = False
        extra_slots = None
    with pytest.raises(ValueError, match="per-row tree masks"):
        DynamicTree().check(t, NoRowMasks(), 16, rules.vanilla(), proc, 2)


# --------------------------------------------------------------------------- recorded dynamic rounds

def test_generate_record_stores_each_rounds_tree_and_t10_predicts_its_acceptance(tmp_path):
    """``coolsd generate --record`` with ``--tree dynamic`` stores every full round's own tree (parents) with its p, q
    rows; ``theory.likelihood.recorded.load_rows`` reads them back as ``DynamicRows`` and T10 on them (the walk's expected
    accepted drafts given the drafts) has the recorded vanilla acceptance as its mean: the difference per round
    has mean 0 (checked to 4 SE). Negative control: the same rows under wrong trees (every node re-hung as a chain,
    parent[a] = a - 1) must miss by more than 4 SE."""
    import json as _json

    from coolsd.cli import main
    from theory.likelihood.recorded import DynamicRows, load_rows

    f = tmp_path / "rec.npz"
    assert main(["generate", "--model", "mnist", "--draft", "eagle", "--tree", "dynamic", "--tree-total", "12",
                 "--tree-depth", "3", "--tree-topk", "3", "--method", "vanilla", "--num-images", "40",
                 "--batch-size", "20", "--seed", "0", "--json", "--record", str(f)]) == 0
    rows = load_rows(f)
    assert isinstance(rows, DynamicRows) and rows.q is not None and rows.p.shape[1] == 12
    assert (rows.parent[:, 0] == -1).all() and (rows.parent[:, 1:] < np.arange(1, 12)).all()
    assert len(np.unique(rows.parent, axis=0)) > 1                           # the trees differ between rounds
    acc = np.load(f)["accepted"].astype(np.float64)
    v = rules.vanilla()
    diff = acc - np.asarray(rows.predict(v).accepted)
    se = diff.std(ddof=1) / np.sqrt(len(diff))
    chain = DynamicRows(rows.p, rows.q, rows.tokens, np.broadcast_to(np.arange(-1, 11), rows.parent.shape).copy(),
                        rows.max_depth, 1, rows.image)
    wrong = acc - np.asarray(chain.predict(v).accepted)
    print(f"R = {len(acc)}: recorded {acc.mean():.3f}, T10 mean difference {diff.mean():+.3f} (SE {se:.3f}); "
          f"wrong trees {wrong.mean():+.3f}")
    assert abs(diff.mean()) < 4 * se and abs(wrong.mean()) > 4 * se
    assert _json.loads(str(np.load(f)["dynamic"]))["tree_total"] == 12


def test_ancestor_masks_numpy_torch_and_brute_force():
    """dt._ancestors (array API) on numpy and on torch == the ancestor sets walked one parent at a time."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        n1 = int(rng.integers(1, 12))
        parent = np.stack([np.concatenate([[-1], [rng.integers(0, a) for a in range(1, n1)]]) for _ in range(3)])
        want = np.zeros((3, n1, n1), bool)
        for b in range(3):
            for a in range(n1):
                c = a
                while c >= 0:
                    want[b, a, c] = True
                    c = parent[b, c]
        D = int(row_trees(parent, n1).node_depth.max())
        assert np.array_equal(dt._ancestors(parent, D), want)
        assert np.array_equal(dt._ancestors(torch.as_tensor(parent), D).numpy(), want)
        if D > 0:
            assert not np.array_equal(dt._ancestors(parent, D - 1), want)      # too few levels: detected


def test_top_m_ties_to_the_lower_index():
    """top_m: the m largest by value, ties to the lower index, with and without ties (the no-tie shortcut)."""
    from real.decode.tree import top_m
    rng = np.random.default_rng(4)
    for _ in range(200):
        x = torch.as_tensor(rng.integers(0, 6, size=(3, 12)).astype(np.float32) if rng.random() < 0.5
                            else rng.normal(size=(3, 12)).astype(np.float32))
        m = int(rng.integers(1, 12))
        want = torch.argsort(x, dim=-1, descending=True, stable=True)[..., :m]
        assert torch.equal(top_m(x, m), want)
