"""Static-tree speculative decoding in the real engine (``real.decode.engine.tree_generate``) on tiny random models:
tree-masked forwards against separate path forwards, level-by-level drafting against chain drafting,
cache compaction, greedy exactness, the end-of-image truncation, and losslessness of vanilla
multi-candidate verification (chi-square against the exact law, with a negative control)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from theory.tree import truncate_tree
from real.decode import engine
from real.decode import tree as tree_steps
from real.decode.round import Run
from real.decode.rng import Streams
from real.models.eagle import EagleDrafter
from real.protocol import Caption, OneRow, Prompt
from real.adapters.hf import hf_llama_pair
from real.registry import tiny_llamagen_pair
from real.decode.sampling import Processing
from theory import rules
from theory.rules import Target, Vanilla, Verifier
from theory.tree import EAGLE_25, EAGLE_57, Tree, chain_tree

from test_real_engine import _chi2, _exact_law, _law_models, _sample_counts

torch.set_num_threads(1)  # tiny models: threads only contend (see test_real_engine)

TREE = Tree(EAGLE_25)
SMALL = Tree(((0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))


@pytest.fixture(scope="module")
def llamagen():
    return tiny_llamagen_pair(seed=0)


@pytest.fixture(scope="module")
def hf_models():
    pytest.importorskip("transformers")
    return hf_llama_pair(seed=0)


def _t2i_cond(t):
    P, C = t.config.cls_token_num, t.config.caption_dim
    mask = torch.arange(P) >= 3
    return Caption(torch.randn(P, C, generator=torch.Generator().manual_seed(0)) * mask[:, None], mask)


def _target(kind, llamagen, hf_models):
    """(model, condition, cfg) for each kind of target the engine supports."""
    if kind == "llamagen":
        return llamagen[0], 3, True
    if kind == "llamagen-t2i":
        t = tiny_llamagen_pair(seed=1, model_type="t2i")[0]
        return t, _t2i_cond(t), True
    from real.adapters.hf import HFCausalLM
    from real.models.llama import FastLlama

    wrap = HFCausalLM if kind == "hf" else FastLlama.from_hf
    return wrap(hf_models[0]), Prompt(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([9, 8])), True


def _expand(x, B):
    return torch.as_tensor(x, dtype=torch.long).view(1, -1).expand(B, -1)


# --------------------------------------------------------------------------- tree-masked target forward + keep

@pytest.mark.parametrize("kind", ["llamagen", "llamagen-t2i", "hf", "fast"])
def test_tree_forward_scores_every_path_and_keep_compacts(kind, llamagen, hf_models):
    """One forward over [root; 25 nodes] with the tree mask and positions root + depth gives, at every
    node, the logits of a fresh prefill of [prefix; root; path to the node] (CFG pair, t2i caption
    padding and HF left padding included). After keep([0] + path) to a path with non-first ranks, a
    next-token forward equals a fresh prefill of the accepted sequence."""
    m, cond, cfg = _target(kind, llamagen, hf_models)
    B = 2 if cfg else 1
    g = torch.Generator().manual_seed(5)
    V = m.vocab_size
    pre = torch.randint(0, V, (4,), generator=g)
    toks = torch.randint(0, V, (TREE.n_nodes + 1,), generator=g)      # toks[0]: the root
    nxt = torch.randint(0, V, (1,), generator=g)
    refs = []
    for node in range(TREE.n_nodes + 1):   # reference: every root-to-node path run on its own (26 prefills)
        seq = torch.cat([pre, toks[:1], toks[TREE.path_to(node)]])
        refs.append(m.prefill(cond, _expand(seq, B), cfg=cfg).logits[:, -1])
    refs = torch.stack(refs, 1)                                         # (B, N+1, V)
    m.prefill(cond, _expand(pre, B), cfg=cfg)
    C = m.cache_len
    out = m.forward(_expand(toks, B), position_ids=torch.as_tensor(TREE.position_ids(C)),
                    attn_mask=torch.as_tensor(TREE.attention_mask)).logits
    diff = (out - refs).abs().max().item()
    # keep the path to node (0, 1, 1) (ranks 0, 1, 1), then score one more token
    node = TREE.paths.index((0, 1, 1)) + 1
    path = TREE.path_to(node)
    m.keep(torch.tensor([0] + path))
    assert m.cache_len == C + 1 + len(path)
    after = m.forward(_expand(nxt, B)).logits[:, -1]
    fresh = m.prefill(cond, _expand(torch.cat([pre, toks[:1], toks[path], nxt]), B), cfg=cfg).logits[:, -1]
    diff_keep = (after - fresh).abs().max().item()
    spread = (refs[:, 1:] - refs[:, 1:2]).abs().max().item()
    print(f"{kind}: max |tree forward - separate paths| = {diff:.2e}, after keep {diff_keep:.2e} "
          f"(rows differ across nodes by up to {spread:.2f})")
    assert diff < 1e-4 and diff_keep < 1e-4
    assert spread > 1e-2                      # the nodes' rows really differ: the comparison can fail


# --------------------------------------------------------------------------- level-by-level drafting

def _drafter(kind, llamagen, hf_models):
    t, d = llamagen
    if kind == "layerskip":
        return t, d, 3
    if kind == "eagle":
        return t, EagleDrafter.from_target(t, seed=3), 3
    from real.adapters.hf import HFCausalLM

    return HFCausalLM(hf_models[0]), HFCausalLM(hf_models[1]), Prompt(torch.tensor([1, 2, 3]), torch.tensor([7]))


@pytest.mark.parametrize("kind", ["layerskip", "eagle", "hf"])
def test_level_by_level_drafting_equals_chain_drafting(kind, llamagen, hf_models):
    """``real.decode.tree.draft_tree`` (one forward per level with the (S, K) tree mask over the tree entries
    already in the draft cache) gives at every inner node the draft row that chain drafting along the
    node's path gives; the children of a node are distinct tokens of positive probability under that row;
    after rolling the tree entries back, the draft continues as if the tree had never been drafted."""
    t, d, cond = _drafter(kind, llamagen, hf_models)
    feat = kind == "eagle"
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    B = 2
    g = torch.Generator().manual_seed(2)
    seq = torch.randint(0, d.vocab_size, (5,), generator=g)             # committed tokens, seq[-1] = the root
    plan = tree_steps.tree_plan(TREE, torch.device("cpu"))
    D = t.config.dim if feat else None

    def level0():
        if not feat:
            return d.prefill(cond, _expand(seq, B), cfg=True)
        h = t.prefill(cond, _expand(seq[:-1], B), cfg=True, return_hidden=True).hidden   # (B, P + 4, D)
        P = h.shape[1] - (len(seq) - 1)
        d.start(P, B)
        ids = torch.cat([torch.zeros(P - 1, dtype=torch.long), seq])
        return d.forward(_expand(ids, B), features=h)

    # the engine's state after round(s) that committed seq: the draft has seen none of it yet
    dm = d if getattr(d, "batched", False) else OneRow(d)
    out = torch.zeros(1, 80, dtype=torch.long)
    out[0, :len(seq)] = seq
    run = Run(t, dm, proc, Streams(0, np.arange(1), "cpu"), 64, np.array([len(seq)]), out,
                    feat=feat)
    if feat:
        h = t.prefill(cond, _expand(seq[:-1], B), cfg=True, return_hidden=True).hidden
        run.P = h.shape[1] - (len(seq) - 1)
        run.hist = h.new_zeros((B, run.P + 80, D))
        run.hist[:, :h.shape[1]] = h
        dm.start(run.P, B)
        run.d_off = run.P - 1
    else:
        dm.prefill(cond, cfg=True)
        run.d_off = d.cache_len
    L0 = run.d_off + len(seq)
    tokens, q, fwd = tree_steps.draft_tree(run, plan)
    tokens, q = tokens[0], q[0]
    assert fwd == TREE.depth and d.cache_len == L0 + plan.n_fed        # the feed, then one forward per level
    # rolled back, the draft continues from the committed tokens exactly
    d.rollback(plan.n_fed)
    x = torch.randint(0, d.vocab_size, (1,), generator=g)
    f = {"features": torch.randn(B, 1, D, generator=g)} if feat else {}
    cont = d.forward(_expand(x, B), **f).logits[:, -1]
    inner = [n for n in range(TREE.n_nodes + 1) if (TREE.children[n] >= 0).any()]
    worst = 0.0
    for n in inner:                        # reference: chain drafting along the path (fresh state each time)
        o = level0()
        for a in TREE.path_to(n):
            kw = {"features": o.hidden[:, -1:]} if feat else {}
            o = d.forward(_expand(tokens[a:a + 1], B), **kw)
        worst = max(worst, (proc(o.logits[:, -1:])[0] - q[n]).abs().max().item())
        kids = TREE.children[n][TREE.children[n] >= 0]
        assert len(set(tokens[kids].tolist())) == len(kids)
        assert bool((q[n, tokens[kids]] > 0).all())
    level0()
    ref = d.forward(_expand(x, B), **f).logits[:, -1]
    print(f"{kind}: max |tree draft row - chain draft row| = {worst:.2e} over {len(inner)} inner nodes; "
          f"after rollback {(cont - ref).abs().max():.2e}")
    assert worst < 1e-5 and (cont - ref).abs().max() < 1e-4


# --------------------------------------------------------------------------- greedy exactness, truncation

GREEDY_CASES = [("layerskip", 1.0, EAGLE_25), ("layerskip", 3.0, EAGLE_57), ("small", 3.0, EAGLE_25),
                ("eagle", 3.0, EAGLE_25), ("t2i", 2.0, EAGLE_25), ("hf", 2.0, EAGLE_25), ("fast", 1.0, EAGLE_57)]


@pytest.mark.parametrize("kind,cfg_scale,paths", GREEDY_CASES, ids=[f"{k}-cfg{c}-{len(p)}" for k, c, p in GREEDY_CASES])
def test_greedy_tree_decoding_equals_greedy_decoding(kind, cfg_scale, paths, llamagen, hf_models):
    """Temperature 0 with the greedy verifier: tree decoding equals plain greedy decoding token for token
    (LlamaGen with layer-skip / independent small / EAGLE drafts, t2i, the HF adapter and FastLlama), and
    rounds follow the whole-image convention."""
    tree = Tree(paths)
    T = 40
    if kind in ("hf", "fast"):
        from real.adapters.hf import HFCausalLM
        from real.models.llama import FastLlama

        wrap = HFCausalLM if kind == "hf" else FastLlama.from_hf
        t, d = wrap(hf_models[0]), wrap(hf_models[1])
        cond = Prompt(torch.tensor([1, 2, 3, 4]), torch.tensor([5]))
    elif kind == "t2i":
        t, d = tiny_llamagen_pair(seed=1, model_type="t2i")
        cond = _t2i_cond(t)
    elif kind == "eagle":
        t, d, cond = llamagen[0], EagleDrafter.from_target(llamagen[0], seed=3), 7
    else:
        t, d = tiny_llamagen_pair(seed=0, draft=kind) if kind == "small" else llamagen
        cond, T = 7, 64
    proc = Processing(temperature=0.0, cfg_scale=cfg_scale)
    ar = engine.ar_generate(t, cond, num_tokens=T, processing=proc)
    g = engine.speculative_generate(t, d, cond, num_tokens=T, verifier=rules.greedy(), drafting=tree, processing=proc)
    assert torch.equal(g.tokens, ar.tokens)
    n = 0
    for r in g.rounds:
        D = 0 if n == 0 else min(tree.depth, T - n - 1)
        assert r.depth == D and r.drafted == (truncate_tree(tree, D).n_nodes if D else 0)
        assert 0 <= r.accepted <= D and len(r.nodes) == r.accepted
        n += r.accepted + 1
    assert n == T and g.target_forwards == len(g.rounds)
    if kind in ("layerskip", "hf", "fast"):   # drafts that agree with the target often enough to show it
        assert g.stats()["tokens_per_target_call"] > 1.3


def test_truncation_at_the_end_of_an_image(llamagen):
    """A round never produces more than the T - n tokens left: the tree is cut at depth T - n - 1, and a
    single target step is taken when one token is left (T = 1: the prefill alone)."""
    t, d = llamagen
    for depth in range(0, 7):
        cut = truncate_tree(TREE, depth)
        if depth == 0:
            assert cut is None
            continue
        want = {p for p in EAGLE_25 if len(p) <= depth}
        assert set(cut.paths) == want and cut.depth == min(depth, 5)
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    for T in (1, 2, 3, 7):
        for seed in range(3):
            g = engine.speculative_generate(t, d, 1, num_tokens=T, verifier=rules.uniform_rsd(3.0), drafting=TREE,
                                     processing=proc, seed=seed)
            assert g.tokens.shape == (T,)
            n = 0
            for r in g.rounds:
                assert r.depth == (0 if n == 0 else min(5, T - n - 1)) and r.accepted + 1 <= T - n
                n += r.accepted + 1
            assert n == T
    assert len(engine.speculative_generate(t, d, 1, num_tokens=1, verifier=rules.vanilla(), drafting=TREE).rounds) == 1


# --------------------------------------------------------------------------- compaction inside the engine

@pytest.mark.parametrize("kind", ["llamagen", "eagle", "hf"])
def test_engine_cache_after_sampled_tree_rounds_equals_fresh_prefill(kind, llamagen, hf_models):
    """After a sampled run (vanilla, temperature 1, CFG) with rounds that accept non-first-rank nodes, the
    target's cache holds exactly [prefix; x_0 .. x_{T-2}]: forwarding x_{T-1} gives the logits of a fresh
    prefill of the whole output."""
    if kind == "hf":
        from real.adapters.hf import HFCausalLM

        t, d = HFCausalLM(hf_models[0]), HFCausalLM(hf_models[1])
        cond = Prompt(torch.tensor([1, 2, 3, 4]), torch.tensor([5]))
    else:
        t = llamagen[0]
        d = EagleDrafter.from_target(t, seed=3) if kind == "eagle" else llamagen[1]
        cond = 4
    proc = Processing(temperature=1.0, cfg_scale=2.0)
    T = 48
    g = engine.speculative_generate(t, d, cond, num_tokens=T, verifier=rules.vanilla(), drafting=TREE, processing=proc, seed=2)
    ranks = [TREE.paths[n - 1][-1] for r in g.rounds for n in r.nodes]
    assert any(k > 0 for k in ranks), "no round accepted a non-first-rank candidate: the test would be vacuous"
    toks = g.tokens
    g = engine.speculative_generate(t, d, cond, num_tokens=T, verifier=rules.vanilla(), drafting=TREE, processing=proc, seed=2)
    assert torch.equal(g.tokens, toks)                       # seeded: reproducible
    after = t.forward(_expand(toks[-1:], 2)).logits[:, -1]
    fresh = t.prefill(cond, _expand(toks, 2), cfg=True).logits[:, -1]
    diff = (after - fresh).abs().max().item()
    print(f"{kind}: {sum(k > 0 for k in ranks)} accepted non-first-rank nodes; max |cached - fresh| = {diff:.2e}")
    assert diff < 1e-4


# --------------------------------------------------------------------------- losslessness (chi-square)

def test_vanilla_tree_decoding_is_lossless():
    """Vanilla multi-candidate verification in the engine outputs exactly the law of plain sampling.

    V = 4, T = 4 tokens, CFG 1.5 + temperature 0.9 + top-k 3 on both models (81 support sequences, exact
    law by enumeration). Tree: 4 first-level candidates (one more than the draft's support of 3, so the
    4th has q = 0 and must be skipped), two at the second level, depth 3 (cut to 2 and then 1 by the
    end-of-image rule). N = 1000 images: a cell of probability 0.02 has expected count 20, SE 4.5; the
    negative control (vanilla acceptance, the target row as resampler: biased wherever a candidate is
    rejected) scored a chi-square of 135 on ~25 degrees of freedom at this N (p ~ 1e-18) when this test
    was written. Engine and control must give p > 1e-3 and p < 1e-3 (fixed seeds)."""
    t, d = _law_models()
    proc = Processing(temperature=0.9, top_k=3, cfg_scale=1.5)
    T, N = 4, 1000
    law = _exact_law(t, 2, T, proc)
    assert sum(v > 0 for v in law.values()) == 81

    def run(verifier, seed):
        g = torch.Generator().manual_seed(seed)
        return _sample_counts(lambda: engine.speculative_generate(t, d, 2, num_tokens=T, verifier=verifier, drafting=SMALL,
                                                           processing=proc, generator=g).tokens, N)

    p_tree, stat_tree = _chi2(run(rules.vanilla(), 1), law, N)
    p_ctl, stat_ctl = _chi2(run(Verifier(Vanilla(), Target(), "wrong-resampler"), 3), law, N)
    print(f"chi2: tree vanilla p = {p_tree:.3g} (stat {stat_tree:.1f}); control p = {p_ctl:.3g} (stat {stat_ctl:.1f})")
    assert p_tree > 1e-3
    assert p_ctl < 1e-3


# --------------------------------------------------------------------------- API, records, bad input

def test_api_records_and_bad_input(llamagen):
    t, d = llamagen
    proc = Processing(cfg_scale=2.0)
    a = engine.speculative_generate(t, d, 1, num_tokens=20, verifier=rules.cool_sd(2.0), drafting=SMALL, processing=proc,
                                    seed=3, record_rows=True)
    b = engine.speculative_generate(t, d, 1, num_tokens=20, verifier=rules.cool_sd(2.0), drafting=SMALL, processing=proc, seed=3)
    assert torch.equal(a.tokens, b.tokens)
    for r in a.rounds:
        N = truncate_tree(SMALL, r.depth).n_nodes if r.depth else 0
        if N == 0:                                           # single target steps: one row, no draft row
            assert r.p.shape == (1, 256) and r.q.shape == (0, 256) and r.drafts.shape == (1,)
            continue
        assert r.p.shape == (N + 1, 256) and r.q.shape == (N + 1, 256) and r.drafts.shape == (N + 1,)
        assert np.allclose(r.p.sum(-1), 1, atol=1e-5) and np.allclose(r.q.sum(-1), 1, atol=1e-5)
    s = a.stats()
    assert s["depth_mean"] <= 3 and s["acceptance_rate"] == pytest.approx(
        sum(r.accepted for r in a.rounds) / sum(r.depth for r in a.rounds))
    with pytest.raises(ValueError, match="chain rounds"):
        engine.records_to_arrays(a.rounds, 3)
    with pytest.raises(ValueError, match="no drafting"):
        engine.speculative_generate(t, d, 1, num_tokens=4, verifier=rules.vanilla())
    with pytest.raises(TypeError, match="drafting must be"):
        engine.speculative_generate(t, d, 1, num_tokens=4, verifier=rules.vanilla(), drafting=EAGLE_25)
    wide = Tree(tuple((r,) for r in range(300)))
    with pytest.raises(ValueError, match="300 candidates but V = 256"):
        engine.speculative_generate(t, d, 1, num_tokens=4, verifier=rules.vanilla(), drafting=wide)
    # the chain as a tree: same acceptance law as chain decoding (statistically), through the tree engine
    c = engine.speculative_generate(t, d, 1, num_tokens=20, verifier=rules.greedy(), drafting=chain_tree(3),
                             processing=Processing(temperature=0.0))
    assert torch.equal(c.tokens, engine.ar_generate(t, 1, num_tokens=20, processing=Processing(temperature=0.0)).tokens)


def test_cli_tree(capsys, tmp_path):
    import json

    from coolsd.cli import main

    def run(*argv):
        assert main(["generate", "--model", "llamagen-tiny", *argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    d = run("--method", "vanilla", "--tree", "eagle25")
    assert d["tree"] == {"name": "eagle25", "nodes": 25, "depth": 5, "candidates": "sampled"} and d["L"] == 5
    assert d["tokens"] == 64 and d["rounds"] == d["target_forwards"]
    assert d["tokens_per_target_call"] == pytest.approx(64 / d["rounds"]) and 1 <= d["tokens_per_target_call"] <= 6
    c = run("--method", "cool-sd", "--tree", "chain", "--L", "3", "--num-tokens", "20")
    assert c["tree"]["nodes"] == 3 and c["drafted_mean"] <= 3 and c["tokens"] == 20
    j = run("--method", "linear-rsd", "--tree", "[[0],[1],[0,0]]", "--num-tokens", "12")
    assert j["params"]["L"] == 2 and j["tree"]["depth"] == 2
    assert main(["generate", "--tree", "nope", "--json"]) == 2
    assert main(["generate", "--tree", "[[1]]", "--json"]) == 2
    err = capsys.readouterr().err
    assert "--tree must be" in err and "rank 1 without rank 0" in err
    # --record with --tree saves the rounds that drafted the whole tree, for theory.likelihood.tune.TreeRows
    from theory.likelihood import tune
    from theory.tree import Tree

    rec = tmp_path / "tree_rows.npz"
    run("--method", "vanilla", "--tree", "[[0],[1],[0,0]]", "--num-tokens", "24", "--num-images", "2", "--record", str(rec))
    rows = tune.load_rows(rec)
    assert isinstance(rows, tune.TreeRows) and rows.tree == Tree(((0,), (1,), (0, 0))) and rows.R >= 2
    assert rows.p.shape[:2] == (rows.R, 4) and set(np.unique(rows.image)) <= {0, 1}
