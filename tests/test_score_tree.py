"""Teacher-forced tree rows and exact likelihoods of tree-drafted images (real.decode.score_tree; docs/theory.md
sections 9, 9b, 11b).

* On every round the engine ran (``generate(..., record_rows=True)``), the teacher-forced rows and the regrown trees
  equal what the engine verified: static trees with sampled and top-k candidates, release-mode dynamic trees (the
  default 59-node configuration and a small one), EAGLE and independent drafts, CFG, ragged batches. Negative
  controls: EAGLE tree rows indexed by token instead of round start, and dynamic trees regrown without the image's
  own depth cap, are caught by the same comparison.
* Vanilla scores P^ = P on the engine's tree images (to float32 rounding of the rows); a relaxed rule does not.
* The law: a chi-square of 1,500 engine-generated images (V = 4, T = 4, Cool-SD) against exp(log P^) over all 256
  sequences, for static top-k, static sampled and release dynamic trees; the wrong candidate construction and the
  wrong tree are rejected at the same sample size.
* Sampled static candidates above the exact path's cost guard get the Monte Carlo estimate (T14); on engine rows
  where both apply it agrees with the exact value within its SE.
* Lossless dynamic trees get T15's estimate through ``coolsd generate --fidelity`` (vanilla: within 3 SEs of 0).
* Refusals, before any work: greedy trees (``coolsd generate --fidelity`` and the API), rows made for another tree
  or dynamic configuration.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import theory.rules.methods as tm
from real.decode import engine
from real.decode import score_tree as st
from real.decode.modes import DynamicTree, StaticTree
from real.decode.sampling import Processing
from real.decode.score import score
from real.decode.score_tree import TreeRows, score_trees, tree_likelihood, tree_rows
from real.decode.tree import top_m
from real.registry import build
from theory import rules
from theory.tree import EAGLE_25, Tree

from test_real_engine import _chi2, _law_models

torch.set_num_threads(1)

TOL = 2e-5          # float32 rows of different forward shapes (as tests/test_score.py)
SMALL = Tree(((0,), (1,), (0, 0), (1, 0), (0, 0, 0)))   # <= 2 children per node: "sampled" fits the cost guard at V = 512
MODES = {"sampled": StaticTree(SMALL, "sampled"), "topk": StaticTree(Tree(EAGLE_25), "topk"),
         "release": DynamicTree(total=20, depth=3, topk=4, sampling="release"),
         "release59": DynamicTree(sampling="release")}
PROC = Processing(cfg_scale=2.0)


@pytest.fixture(scope="module")
def mnist():
    return {k: build("mnist", draft=k, num_images=6, seed=1) for k in ("small", "eagle")}


@pytest.fixture(scope="module")
def runs(mnist):
    """(gens, tokens) of a Cool-SD run per (draft kind, mode), made on first use: 6 images at batch size 3."""
    cache = {}

    def get(kind, mode):
        if (kind, mode) not in cache:
            b, m = mnist[kind], MODES[mode]
            gens = engine.generate(b.target, b.draft, b.conds, num_tokens=b.num_tokens, verifier=rules.cool_sd(3.0),
                                   drafting=m, processing=PROC, seed=5, record_rows=True, batch_size=3)
            cache[kind, mode] = gens, torch.stack([g.tokens for g in gens])
        return cache[kind, mode]
    return get


def _node_depths(parent: np.ndarray) -> np.ndarray:
    d = np.zeros(len(parent), np.int64)
    for j in range(1, len(parent)):       # parents come first (test only)
        d[j] = d[parent[j]] + 1
    return d


def compare(gens, rows: TreeRows, mode):
    """Over every drafted round the engine ran: max |recorded - teacher-forced| of the target rows along the walked
    path (root and accepted nodes) and of the draft rows there (static trees), the rounds whose candidates or tree
    differ (static top-k: a path node's children are the top-m of the teacher-forced row; dynamic: the regrown tree
    restricted to the image's depth cap has the engine's nodes, parents and tokens), and the rounds compared."""
    P = rows.p.numpy()
    Q = None if rows.q is None else rows.q.numpy()
    ep = eq = 0.0
    bad = k = 0
    for b, g in enumerate(gens):                      # a loop over images and their rounds (test only)
        n = 0
        for r in g.rounds:
            if r.drafted > 0:
                k += 1
                if isinstance(mode, DynamicTree):
                    par, dep = rows.parent[b, n].numpy(), rows.trees.node_depth[b, n].numpy()
                    tok = rows.node_tokens[b, n].numpy()
                    m, keep = len(r.parent), rows.trees.node_depth[b, n].numpy() <= r.depth
                    ke = _node_depths(r.parent) <= r.depth
                    same = (keep.sum() == ke.sum() and np.array_equal(keep[:m], ke)
                            and np.array_equal(par[:m][ke], r.parent[ke]) and np.array_equal(tok[:m][ke], r.drafts[ke]))
                    bad += not same
                    path = [0] + list(r.nodes)
                    dep_of = _node_depths(r.parent)
                    for node in path:
                        ep = max(ep, float(np.abs(r.p[node] - P[b, n + dep_of[node]]).max()))
                else:
                    tree = mode.tree
                    for node in [0] + list(r.nodes):
                        d = int(tree.node_depth[node])
                        ep = max(ep, float(np.abs(r.p[node] - P[b, n + d]).max()))
                        kids = tree.children[node][tree.children[node] >= 0]
                        if d < r.depth and kids.size:
                            q = Q[b, n, d] if Q.ndim == 4 else Q[b, n + d]
                            eq = max(eq, float(np.abs(r.q[node] - q).max()))
                            if mode.candidates == "topk":
                                want = top_m(torch.as_tensor(q), kids.size).numpy()
                                bad += not np.array_equal(r.drafts[kids], want)
            assert np.array_equal(np.asarray(r.drafts)[list(r.nodes)], g.tokens[n:n + r.accepted].numpy())
            n += r.accepted + 1
        assert n == g.tokens.numel()
    return ep, eq, bad, k


@pytest.mark.parametrize("mode", ["sampled", "topk", "release"])
@pytest.mark.parametrize("kind", ["eagle", "small"])
def test_tree_rows_equal_the_engines_recorded_rows(mnist, runs, kind, mode):
    b = mnist[kind]
    gens, tok = runs(kind, mode)
    rows = tree_rows(b.target, b.draft, b.conds, tok, MODES[mode], processing=PROC)
    ep, eq, bad, k = compare(gens, rows, MODES[mode])
    assert k > 6 * 8 and bad == 0 and ep < TOL and eq < TOL, (ep, eq, bad, k)
    if mode != "release":
        assert rows.q.shape == ((6, 49, MODES[mode].tree.depth, 512) if kind == "eagle" else (6, 49, 512))


def test_default_dynamic_tree_rows_equal_recorded(mnist, runs):
    """The release's own configuration (59 nodes, depth 4, top 10): the one the comparison in docs/results uses."""
    b = mnist["eagle"]
    gens, tok = runs("eagle", "release59")
    rows = tree_rows(b.target, b.draft, b.conds, tok, MODES["release59"], processing=PROC, mask_budget=1 << 22)
    ep, _, bad, k = compare(gens, rows, MODES["release59"])
    assert k > 6 * 8 and bad == 0 and ep < TOL


def test_negative_controls_are_caught_by_the_comparison(mnist, runs, monkeypatch):
    """EAGLE static-tree rows indexed by token (the chain rows' q[:, t, d] used as q[:, n, d]) and dynamic trees regrown
    without the image's own depth cap (deep nodes outrank shallow ones near the image's end) differ from the engine's."""
    b = mnist["eagle"]
    gens, tok = runs("eagle", "topk")
    rows = tree_rows(b.target, b.draft, b.conds, tok, MODES["topk"], processing=PROC)
    from real.decode.score import teacher_forced_rows

    chain = teacher_forced_rows(b.target, b.draft, b.conds, tok, L=5, processing=PROC)
    wrong = TreeRows(rows.p, chain.q, rows.mode)
    assert compare(gens, rows, MODES["topk"])[1] < TOL
    assert compare(gens, wrong, MODES["topk"])[1] > 100 * TOL
    gens, tok = runs("eagle", "release")
    from real.decode import regrow

    monkeypatch.setattr(regrow, "_depth_caps", lambda spec, ns, T: np.full(len(ns), spec.max_depth))
    uncapped = tree_rows(b.target, b.draft, b.conds, tok, MODES["release"], processing=PROC)
    assert compare(gens, uncapped, MODES["release"])[2] > 0


@pytest.mark.parametrize("mode", ["sampled", "topk", "release"])
def test_vanilla_scores_the_target_on_tree_images(mnist, runs, mode):
    """Vanilla multi-candidate verification is lossless (sections 9, 9b): log P^ = log P on the engine's tree images to
    float32 rounding of the rows (49 tokens); Cool-SD is not (its own images: nats apart). Sampled candidates sum over
    the rejected siblings (V^2 per row at the root): 2 images."""
    b = mnist["eagle"]
    _, tok = runs("eagle", mode)
    n = 2 if mode == "sampled" else 6
    conds, tok = b.conds[:n], tok[:n]
    L = MODES[mode].max_depth
    van = score(b.target, b.draft, conds, tok, verifier=tm.build("vanilla", L), processing=PROC, batch_size=4,
                drafting=MODES[mode])
    cool = score_trees(b.target, b.draft, conds, tok, verifier=rules.cool_sd(3.0), drafting=MODES[mode],
                       processing=PROC)
    assert np.all(np.isfinite(van["log_p"])) and np.abs(van["log_p_hat"] - van["log_p"]).max() < 1e-4
    assert np.abs(cool["log_p"] - van["log_p"]).max() < 1e-6
    assert np.abs(cool["log_p_hat"] - cool["log_p"]).max() > 1.0


# --------------------------------------------------------------------------- the law (chi-square)

LAW_TREE = Tree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0)))


def _law(t, d, mode, verifier, proc, T):
    """exp(log P^) of every sequence of V^T (teacher-forced rows of all of them in one batch)."""
    seqs = torch.tensor(list(itertools.product(range(t.vocab_size), repeat=T)))
    s = score_trees(t, d, [2] * len(seqs), seqs, verifier=verifier, drafting=mode, processing=proc,
                    batch_size=len(seqs))
    return {tuple(x): float(np.exp(lp)) for x, lp in zip(seqs.tolist(), s["log_p_hat"])}


def test_engine_tree_images_follow_the_exact_likelihood():
    """Cool-SD (delta 2) tree images of the engine (V = 4, T = 4, CFG 1.5, temperature 0.9, top-k 3; N = 1500 at batch
    size 50) against exp(tree_log_likelihood) of every sequence, which sums to 1: static 6-node tree with top-k and
    with sampled candidates, release dynamic tree (6 nodes, depth 2, top 3). Negative controls rejected at p < 1e-3:
    the other candidate construction, a smaller tree, the target's own law (the rule is relaxed); when written, the
    good fits gave p = 0.42, 0.35, 0.37 and the controls p < 1e-7."""
    t, d = _law_models()
    proc = Processing(temperature=0.9, top_k=3, cfg_scale=1.5)
    T, N, B = 4, 1500, 50
    v = rules.cool_sd(2.0)
    modes = {"topk": StaticTree(LAW_TREE, "topk"), "sampled": StaticTree(LAW_TREE, "sampled"),
             "release": DynamicTree(total=6, depth=2, topk=3, sampling="release"),
             "release4": DynamicTree(total=4, depth=2, topk=3, sampling="release")}
    laws = {k: _law(t, d, m, v, proc, T) for k, m in modes.items()}
    target = _law(t, d, modes["topk"], rules.vanilla(), proc, T)
    assert all(abs(sum(law.values()) - 1) < 1e-9 for law in laws.values())
    wrong = {"topk": ("sampled",), "sampled": ("topk",), "release": ("release4", "sampled")}
    for gen, controls in wrong.items():   # a loop over the three constructions
        gens = engine.generate(t, d, [2] * N, num_tokens=T, verifier=v, drafting=modes[gen], processing=proc, seed=1,
                               batch_size=B)
        c: dict = {}
        for g in gens:
            c[tuple(g.tokens.tolist())] = c.get(tuple(g.tokens.tolist()), 0) + 1
        p_ok, s_ok = _chi2(c, laws[gen], N)
        bad = {k: _chi2(c, laws[k], N)[0] for k in controls} | {"target": _chi2(c, target, N)[0]}
        print(f"{gen}: chi2 p = {p_ok:.3g} ({s_ok:.1f}); controls {bad}")
        assert p_ok > 1e-3
        assert all(p < 1e-3 for p in bad.values())


# --------------------------------------------------------------------------- refusals

def test_refusals_before_any_work(mnist, runs, monkeypatch):
    b = mnist["eagle"]
    v = tm.build("vanilla", 5)
    tok = torch.zeros(6, 49, dtype=torch.long)
    calls = []
    monkeypatch.setattr(st, "tree_rows", lambda *a, **k: calls.append(1))
    with pytest.raises(NotImplementedError, match="greedy"):
        score(b.target, b.draft, b.conds, tok, verifier=rules.greedy(), drafting=DynamicTree(),
              processing=Processing(temperature=0.0, cfg_scale=2.0))
    with pytest.raises(NotImplementedError, match="greedy"):
        score(b.target, b.draft, b.conds, tok, verifier=rules.greedy(), drafting=MODES["topk"],
              processing=Processing(temperature=0.0, cfg_scale=2.0))
    with pytest.raises(ValueError, match="chain rule"):
        score(b.target, b.draft, b.conds, tok, verifier=object(), drafting=MODES["topk"])
    assert not calls
    monkeypatch.undo()
    _, tok = runs("eagle", "release")
    rows = tree_rows(b.target, b.draft, b.conds[:2], tok[:2], MODES["release"], processing=PROC)
    with pytest.raises(ValueError, match="rows' trees have 20 nodes .* total = 59"):
        tree_likelihood(rows, tok[:2], v, DynamicTree(sampling="release"))
    with pytest.raises(ValueError, match="regrown with dynamic configuration"):
        tree_likelihood(rows, tok[:2], v, DynamicTree(total=20, depth=3, topk=5, sampling="release"))
    with pytest.raises(ValueError, match="no draft rows"):
        tree_likelihood(rows, tok[:2], v, MODES["topk"])
    static = tree_rows(b.target, b.draft, b.conds[:2], tok[:2], MODES["sampled"], processing=PROC)
    with pytest.raises(ValueError, match="depths but the tree has depth 5"):
        tree_likelihood(static, tok[:2], v, MODES["topk"])


def test_monte_carlo_agrees_with_the_exact_path_on_engine_rows(mnist, runs):
    """T14 on the engine's own sampled-tree images (V = 512, <= 2 children: the exact path fits): the jackknife
    estimate is within 5 of its Monte Carlo SEs (plus 1e-9) of the exact log P^, and its SE is small; negative
    control: the exact value under the other candidate construction (top-k) is outside that band. Above the guard
    ``tree_likelihood`` switches to the estimate and says so (``method``)."""
    from theory.likelihood.tree_mc import tree_log_likelihood_mc

    b, v = mnist["eagle"], rules.cool_sd(3.0)
    _, tok = runs("eagle", "sampled")
    rows = tree_rows(b.target, b.draft, b.conds[:3], tok[:3], MODES["sampled"], processing=PROC)
    p, q, x = rows.p.numpy(), rows.q.numpy(), tok[:3].numpy()
    exact = tree_likelihood(rows, x, v, MODES["sampled"])
    mc = tree_log_likelihood_mc(p, q, x, v, SMALL, seed=3)
    band = 5 * mc["se"] + 1e-9
    assert np.all(np.abs(mc["log_p_hat"] - exact) <= band) and np.all(mc["se"] < 0.05), (mc, exact)
    other = tree_likelihood(rows, x, v, StaticTree(SMALL, "topk"))
    assert np.all(np.abs(other - exact) > band)
    assert st.method(MODES["sampled"], v, 512) == "exact" and st.method(StaticTree(Tree(EAGLE_25)), v, 512) == "mc"
    assert st.method(MODES["topk"], v, 512) == "exact"


def test_cli_fidelity_refusals_are_one_line_before_generating(capsys, monkeypatch):
    from coolsd.cli import main

    called = []
    monkeypatch.setattr(engine, "generate", lambda *a, **k: called.append(1))
    base = ["generate", "--model", "mnist", "--draft", "eagle", "--num-images", "2", "--fidelity"]
    for extra, match in [(["--tree", "eagle25", "--tree-candidates", "topk", "--method", "greedy"],
                          "exact likelihood of greedy tree drafting"),
                         (["--mode", "dynamic", "--method", "greedy"], "exact likelihood of greedy tree drafting")]:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("coolsd: error:") and match in err and "\n" not in err
    assert not called


def test_cli_fidelity_scores_tree_runs(capsys):
    """``coolsd generate --fidelity --tree eagle25 --tree-candidates topk`` and ``--tree dynamic --tree-sampling
    release``: vanilla measures TV ~ 0 and KL ~ 0 with intervals; lossless ``--tree dynamic``: the Monte Carlo
    estimate ("mc"), within 3 SEs of 0."""
    import json

    from coolsd.cli import main

    for extra in (["--tree", "eagle25", "--tree-candidates", "topk"],
                  ["--tree", "dynamic", "--tree-sampling", "release", "--tree-total", "12", "--tree-depth", "2",
                   "--tree-topk", "4"]):
        assert main(["generate", "--model", "mnist", "--draft", "eagle", "--num-images", "4", "--fidelity", "--json",
                     "--method", "vanilla", *extra]) == 0
        f = json.loads(capsys.readouterr().out)["fidelity"]
        assert f["images"] == 4 and abs(f["kl_to_target"]["measured"]) < 1e-4 and f["tv_to_target"]["measured"] < 1e-4
    # lossless dynamic trees: T15's estimate, within 3 of its SEs (Monte Carlo error included) of vanilla's KL = 0
    assert main(["generate", "--model", "mnist", "--draft", "eagle", "--num-images", "4", "--fidelity", "--json",
                 "--method", "vanilla", "--tree", "dynamic", "--tree-total", "12", "--tree-depth", "2",
                 "--tree-topk", "4"]) == 0
    f = json.loads(capsys.readouterr().out)["fidelity"]
    kl = f["kl_to_target"]
    assert f["kl_method"] == "mc" and f["mc"]["samples"] * f["mc"]["groups"] == 16
    assert abs(kl["measured"]) <= 3 * kl["se"] and 0 < kl["se"] < 5, kl


def test_sweep_scores_tree_settings_both_ways(tmp_path):
    """``coolsd sweep --tree eagle25 --tree-candidates topk``: every setting gets KL(P^||P), KL(P||P^) (per token
    too) and TV with intervals, as chains do; vanilla ~ 0; greedy trees carry the reason instead, and a dynamic tree's
    settings have a likelihood, lossless or release (``_reason``, checked on the mode alone); the store refuses another drafting (here a
    dynamic tree) before any work."""
    import json
    import types

    from coolsd.cli import main
    from coolsd.studies.sweep import fidelity as sf

    out = tmp_path / "s"
    assert main(["sweep", "--model", "mnist", "--draft", "eagle", "--tree", "eagle25", "--tree-candidates", "topk",
                 "--grid", "vanilla", "cool-sd:delta=3", "greedy", "--images", "4", "--unit-images", "4",
                 "--record-images", "0", "--no-progress", "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["tree_candidates"] == "topk" and rep["config"]["num_tokens"] == 49
    m = {e["key"]: e for e in rep["methods"]}
    for key in ("vanilla", "cool-sd:delta=3"):
        e = m[key]
        assert e["images"] == 4 and e["tv_to_target"]["from_ar"] is not None
        kl = e["kl_to_target"]
        assert kl["ci"][0] <= kl["measured"] <= kl["ci"][1] and "per_token" in kl
        assert "kl_from_ar" in e and e.get("tv_bound_image") is None
    van = m["vanilla"]
    assert abs(van["kl_to_target"]["measured"]) < 1e-4 and abs(van["kl_from_ar"]["measured"]) < 1e-4
    assert van["tv_to_target"]["measured"] < 1e-4 and van["tv_to_target"]["from_ar"] < 1e-4
    assert m["cool-sd:delta=3"]["kl_to_target"]["measured"] > 1.0
    assert m["greedy"]["tv_to_target"] is None and "greedy" in m["greedy"]["fidelity_reason"]
    before = sorted(out.rglob("*"))              # another tree on the same store: refused in one line, nothing written
    assert main(["sweep", "--model", "mnist", "--draft", "eagle", "--tree", "dynamic", "--tree-sampling", "release",
                 "--grid", "vanilla", "cool-sd:delta=3", "greedy", "--images", "4", "--unit-images", "4",
                 "--record-images", "0", "--no-progress", "--out", str(out)]) == 2
    assert sorted(out.rglob("*")) == before
    from coolsd.options import DraftingSpec

    ctx = types.SimpleNamespace(tree=None, dynamic=DynamicTree(), mode=DynamicTree(), proc=PROC,
                                cfg=types.SimpleNamespace(drafting=DraftingSpec("dynamic")),
                                bundle=types.SimpleNamespace(target=types.SimpleNamespace(vocab_size=512)))
    s = types.SimpleNamespace(method="vanilla")
    assert sf.reason(ctx, s, tm.build("vanilla", 5)) is None                 # lossless: estimated (T15)
    ctx.mode = ctx.dynamic = DynamicTree(sampling="release")
    assert sf.reason(ctx, s, tm.build("vanilla", 5)) is None
    ctx.proc = Processing(temperature=0.0)
    assert "greedy" in sf.reason(ctx, s, tm.build("vanilla", 5))             # control: greedy has none


def test_regrow_sizes_the_model_it_is_given_not_a_model_it_wraps():
    """``regrow._room`` (the drafter's spare cache entries while a dynamic tree is regrown): the model scoring holds
    (``Forced.draft``) is sized for the duration and restored; a model it wraps (BatchedImageLM's ``model``, issue 50)
    is left alone, and so are unbounded caches (None) and models with room enough. Control: a need within the room
    changes nothing."""
    from types import SimpleNamespace

    from real.decode.regrow import _room

    inner = SimpleNamespace(extra_slots=3)
    m = SimpleNamespace(extra_slots=8, model=inner)
    with _room(m, 20):
        assert m.extra_slots == 20 and inner.extra_slots == 3
    assert m.extra_slots == 8
    with _room(m, 5):                                   # control: room enough
        assert m.extra_slots == 8
    free = SimpleNamespace(extra_slots=None, model=inner)
    with _room(free, 20):
        assert free.extra_slots is None and inner.extra_slots == 3
