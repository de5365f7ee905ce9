"""The batched engine: B images per round, each row with its own committed length (real.decode.engine.generate,
real.decode.steps, real.nn.kvcache). Tiny random LlamaGen models on CPU, single-threaded (see test_real_engine)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from real.decode import engine
from real.models import llamagen as lg
from real.nn.kvcache import KVCache
from real.protocol import Caption, Prompt
from real.adapters.hf import hf_llama_pair
from real.registry import tiny_llamagen_pair
from real.decode.sampling import Processing
from theory import rules
from theory.tree import EAGLE_25, Tree

from test_real_engine import _chi2, _exact_law, _law_models

torch.set_num_threads(1)

GREEDY = Processing(temperature=0.0)


def _t2i_conds(t, n):
    P, C = t.config.cls_token_num, t.config.caption_dim
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):   # captions of different lengths: different padding per row
        mask = torch.arange(P) >= (i % 4)
        out.append(Caption(torch.randn(P, C, generator=g) * mask[:, None], mask))
    return out


CASES = [  # (draft kind, mode, cfg scale)
    ("layerskip", "chain", 3.0), ("small", "chain", 1.0), ("eagle", "chain", 3.0), ("zoo", "chain", 1.0),
    ("layerskip", "tree", 1.0), ("small", "tree", 3.0), ("eagle", "tree", 3.0), ("eagle", "tree", 1.0),
    ("t2i", "chain", 2.0), ("t2i", "tree", 2.0),
]


@pytest.mark.parametrize("kind,mode,cfg", CASES, ids=[f"{k}-{m}-cfg{c}" for k, m, c in CASES])
def test_batched_greedy_equals_plain_greedy(kind, mode, cfg):
    """Greedy batched generation (B = 5 images of different classes / captions, rows accepting different
    numbers of drafts) equals plain greedy decoding of each image, token for token, and the batch-1 engine."""
    if kind == "t2i":
        t, d = tiny_llamagen_pair(seed=1, model_type="t2i")
        conds = _t2i_conds(t, 5)
    elif kind in ("eagle", "zoo"):        # trained pairs (a random EAGLE head never agrees with the target)
        from real.zoo import gpt

        t = gpt.load_target()
        d = gpt.load_eagle(t) if kind == "eagle" else gpt.load_draft()
        conds = [0, 3, 7, 3, 9]
    else:
        t, d = tiny_llamagen_pair(seed=0, draft=kind)
        conds = [0, 3, 7, 3, 9]
    proc = Processing(temperature=0.0, cfg_scale=cfg)
    T = 40 if kind not in ("eagle", "zoo") else 49
    kw = dict(drafting=Tree(EAGLE_25)) if mode == "tree" else dict(drafting=4)
    got = engine.generate(t, d, conds, num_tokens=T, verifier=rules.greedy(), processing=proc, batch_size=5, **kw)
    ar = engine.generate(t, None, conds, num_tokens=T, processing=proc, batch_size=5)
    for c, g, a in zip(conds, got, ar):
        plain = engine.ar_generate(t, c, num_tokens=T, processing=proc)
        assert torch.equal(a.tokens, plain.tokens)                 # batched AR == batch-1 AR
        assert torch.equal(g.tokens, plain.tokens)                 # batched SD == plain greedy
        one = engine.speculative_generate(t, d, c, num_tokens=T, verifier=rules.greedy(), processing=proc, **kw)
        assert torch.equal(one.tokens, plain.tokens)
    taus = {tuple(r.accepted for r in g.rounds) for g in got}
    assert len(taus) > 1                                           # the rows really were ragged


def test_batched_records_follow_the_whole_image_convention():
    """Per image, the rounds of a batched run follow the batch-1 convention (L' = min(L, T - n - 1), round 0
    of an independent draft drafts from the prefill) and carry rows that theory.likelihood.recorded can stack."""
    t, d = tiny_llamagen_pair(seed=0)
    L, T = 3, 30
    gens = engine.generate(t, d, [1, 2, 3, 4], num_tokens=T, verifier=rules.cool_sd(2.0), drafting=L,
                           processing=Processing(cfg_scale=2.0), batch_size=4, record_rows=True, seed=5)
    for g in gens:
        n = 0
        for r in g.rounds:
            assert r.drafted == min(L, T - n - 1) and 0 <= r.accepted <= r.drafted
            assert r.p.shape == (r.drafted + 1, 256) and r.q.shape == (r.drafted, 256)
            assert np.allclose(r.p.sum(-1), 1, atol=1e-5)
            n += r.accepted + 1
        assert n == T and g.target_forwards == len(g.rounds)
        p, q, dr, nd = engine.records_to_arrays(g.rounds, L)
        assert p.shape[1:] == (L + 1, 256) and (nd >= 1).all()
    s = engine.summarize(gens)
    assert s["images"] == 4 and s["tokens"] == 4 * T
    assert s["seconds"] == pytest.approx(gens[0].info["batch_seconds"])   # per-image shares add up to the batch


def test_batched_law_equals_plain_sampling_and_batch1():
    """Per-image law of batched runs (B = 40, T = 3, L = 2: rows accept 0-2 drafts, so they are ragged).
    Vanilla: chi-square against the exact law of plain sampling (as test_real_engine's batch-1 test;
    N = 800: a cell of probability 0.04 has SE 5.7 on 32 expected). Cool-SD (a relaxed rule): the
    batched law equals the batch-1 law, by a chi-square homogeneity test of 800 + 800 images. Negative
    controls: a wrong resampler (biased by ~0.2 TV per token: rejected at p < 1e-3 against the exact
    law), and Cool-SD delta = 3 against batch-1 delta = 1.5 (it accepts far more: rejected)."""
    t, d = _law_models()
    proc = Processing(temperature=0.9, top_k=3, cfg_scale=1.5)
    T, N, L, B = 3, 800, 2, 40
    law = _exact_law(t, 2, T, proc)

    def batched(verifier, seed):
        gens = engine.generate(t, d, [2] * N, num_tokens=T, verifier=verifier, drafting=L, processing=proc,
                               batch_size=B, seed=seed)
        out: dict = {}
        for g in gens:
            s = tuple(g.tokens.tolist())
            out[s] = out.get(s, 0) + 1
        return out, gens

    van, gens = batched(rules.vanilla(), 1)
    assert len({tuple(r.accepted for r in g.rounds) for g in gens}) > 3
    p_van, _ = _chi2(van, law, N)
    bad = rules.Verifier(rules.Vanilla(), rules.Target(), "wrong-resampler")
    p_bad, _ = _chi2(batched(bad, 2)[0], law, N)

    def homogeneity(a: dict, b: dict) -> float:
        cells = sorted(set(a) | set(b))
        table = np.array([[a.get(c, 0) for c in cells], [b.get(c, 0) for c in cells]], float)
        keep = table.sum(0) >= 10                 # pool sparse cells
        table = np.concatenate([table[:, keep], table[:, ~keep].sum(1, keepdims=True)], 1)
        table = table[:, table.sum(0) > 0]
        return float(stats.chi2_contingency(table)[1])

    g1 = torch.Generator().manual_seed(3)
    one: dict = {}
    for _ in range(N):
        s = tuple(engine.speculative_generate(t, d, 2, num_tokens=T, verifier=rules.cool_sd(1.5), drafting=L,
                                              processing=proc, generator=g1).tokens.tolist())
        one[s] = one.get(s, 0) + 1
    p_cool = homogeneity(batched(rules.cool_sd(1.5), 4)[0], one)
    p_ctl = homogeneity(batched(rules.uniform_rsd(3.0), 5)[0], one)
    print(f"vanilla vs exact p={p_van:.3g}; wrong resampler p={p_bad:.3g}; cool-sd batched vs batch-1 p={p_cool:.3g}; "
          f"control p={p_ctl:.3g}")
    assert p_van > 1e-3 and p_cool > 1e-3
    assert p_bad < 1e-3 and p_ctl < 1e-3


def test_seeded_batched_runs_are_reproducible():
    t, d = tiny_llamagen_pair(seed=0, draft="eagle")
    kw = dict(num_tokens=20, verifier=rules.cool_sd(2.0), drafting=Tree(EAGLE_25), processing=Processing(cfg_scale=2.0))
    a = engine.generate(t, d, [1, 2, 3], batch_size=3, seed=7, **kw)
    b = engine.generate(t, d, [1, 2, 3], batch_size=3, seed=7, **kw)
    c = engine.generate(t, d, [1, 2, 3], batch_size=3, seed=8, **kw)
    assert all(torch.equal(x.tokens, y.tokens) for x, y in zip(a, b))
    assert not all(torch.equal(x.tokens, y.tokens) for x, y in zip(a, c))


# --------------------------------------------------------------------------- the cache, row by row

def test_per_row_rollback_and_keep_match_fresh_sequences():
    """Rows with different lengths (per-row rollback) take a tree block at their own positions, keep
    different paths of it (per-row keep with different counts), and then continue exactly as fresh
    single-image prefills of the sequences they now hold."""
    t, _ = tiny_llamagen_pair(seed=0)
    ref = lg.LlamaGen(t.config).eval()
    ref.load_state_dict(t.state_dict())
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(0, 256, (3, 6), generator=g)
    conds = [1, 4, 6]
    t.prefill(conds, seqs)
    t.rollback(np.array([0, 2, 5]))                        # rows hold 6, 4, 1 tokens
    assert t.cache_lens.tolist() == [7, 5, 2]
    with pytest.raises(ValueError, match="different numbers"):
        _ = t.cache_len
    # a tree block: node 0 the root, 1 and 2 its children, 3 the child of 2
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    depth = np.array([0, 1, 1, 2])
    blk = torch.randint(0, 256, (3, 4), generator=g)
    t.forward(blk, position_ids=t.cache_lens[:, None] + depth, attn_mask=mask)
    keep, counts = np.array([[0, 2, 3], [0, 1, 0], [0, 0, 0]]), np.array([3, 2, 1])
    t.keep(keep, counts)
    assert t.cache_lens.tolist() == [10, 7, 3]
    x = torch.randint(0, 256, (3, 1), generator=g)
    got = t.forward(x).logits[:, -1]
    for r, n in enumerate([6, 4, 1]):
        seq = seqs[r, :n].tolist() + blk[r, keep[r, :counts[r]]].tolist() + [int(x[r, 0])]
        want = ref.prefill(conds[r], torch.tensor(seq).view(1, -1)).logits[0, -1]
        assert torch.allclose(got[r], want, atol=1e-4), (r, (got[r] - want).abs().max())


def test_kvcache_slots_rollback_keep_unit():
    """KVCache on hand-made values: per-row writes land at each row's own slots, rollback and keep move
    only the rows asked, the mask hides everything past a row's entries."""
    c = KVCache(1, 2, 1, 8, 1, dtype=torch.float32, device="cpu")
    val = lambda *xs: torch.tensor(xs, dtype=torch.float32).view(2, 1, -1, 1)  # noqa: E731
    c.begin(3)
    c.update(0, val(1, 2, 3, 4, 5, 6), val(1, 2, 3, 4, 5, 6))
    c.commit()
    c.rollback(np.array([1, 0]))                           # row 0 holds 2, row 1 holds 3
    m = c.begin(2)
    assert m.shape == (2, 1, 2, 5)
    assert m[0, 0].tolist() == [[True, True, True, False, False], [True, True, True, True, False]]
    assert m[1, 0].tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    k, _ = c.update(0, val(7, 8, 9, 10), val(7, 8, 9, 10))
    c.commit()
    assert c.k[0][0, 0, :4, 0].tolist() == [1, 2, 7, 8] and c.k[0][1, 0, :5, 0].tolist() == [4, 5, 6, 9, 10]
    c.keep(np.array([[1, 0], [0, 1]]), np.array([1, 2]))  # row 0 keeps its 8, row 1 both
    assert c.lens.tolist() == [3, 5]
    assert c.k[0][0, 0, :3, 0].tolist() == [1, 2, 8] and c.k[0][1, 0, :5, 0].tolist() == [4, 5, 6, 9, 10]
    with pytest.raises(ValueError, match="removable"):
        c.rollback(np.array([4, 0]))
    with pytest.raises(ValueError, match="block length"):
        c.keep(np.array([[5], [0]]))
    # a tree level: (S, K) mask over the last K - S cached entries of every row
    m = c.begin(1, torch.tensor([[False, True]]))
    assert m[0, 0, 0].tolist() == [True, True, False, True, False, False]    # K = max(lens) + S columns
    assert m[1, 0, 0].tolist() == [True, True, True, True, False, True]


# --------------------------------------------------------------------------- bad input

def test_bad_batches_are_refused_before_any_work():
    t, d = tiny_llamagen_pair(seed=0)
    kw = dict(num_tokens=8, verifier=rules.vanilla(), drafting=2)
    with pytest.raises(ValueError, match="^batch_size must be an integer >= 1, got 0"):
        engine.generate(t, d, [1, 2], batch_size=0, **kw)
    with pytest.raises(ValueError, match="larger than the 2 images"):
        engine.generate(t, d, [1, 2], batch_size=3, **kw)
    with pytest.raises(ValueError, match="mixes condition types"):
        engine.generate(t, d, [1, Caption(torch.zeros(8, 32))], batch_size=2, **kw)
    with pytest.raises(ValueError, match="GiB"):
        engine.generate(t, d, list(range(10)) * 10**5, batch_size=10**6, **kw)
    from real.adapters.hf import HFCausalLM

    ht, hd = hf_llama_pair()
    with pytest.raises(ValueError, match="one image at a time"):
        engine.generate(HFCausalLM(ht), HFCausalLM(hd), [Prompt([1, 2])] * 2, batch_size=2, **kw)
    assert engine.default_batch_size(t, d, 1000) == engine.MAX_BATCH
    assert engine.default_batch_size(t, d, 3) == 3


def test_greedy_tree_children_are_the_drafts_top_m_tokens():
    """At temperature 0 a node's children are the draft's top-m tokens by guided logits (as EAGLE drafts),
    not the argmax followed by arbitrary zero-probability tokens (the without-replacement draw from a
    one-hot row, which this test would catch: its 2nd..m-th children are the lowest token ids)."""
    from real.decode import tree as tree_steps
    from real.decode.round import Run
    from real.decode.rng import Streams

    t, d = tiny_llamagen_pair(seed=0, draft="small")
    proc = Processing(temperature=0.0, cfg_scale=3.0)
    tree = Tree(EAGLE_25)
    plan = tree_steps.tree_plan(tree, torch.device("cpu"))
    seq = torch.tensor([[5, 9, 17], [2, 40, 33]])
    out = torch.zeros(2, 80, dtype=torch.long)
    out[:, :3] = seq
    run = Run(t, d, proc, Streams(0, np.arange(2), "cpu"), 64, np.array([3, 3]), out)
    d.prefill([1, 4], cfg=True)
    run.d_off = d.cache_len
    tokens, q, _ = tree_steps.draft_tree(run, plan)
    ref = d.__class__(d.config).eval()
    ref.load_state_dict(d.state_dict())
    for b, c in enumerate([1, 4]):
        logits = ref.prefill(c, seq[b:b + 1].expand(2, -1), cfg=True).logits[:, -1]
        guided = proc.combined(logits)
        kids = tree.children[0][tree.children[0] >= 0]
        top = torch.topk(guided, len(kids)).indices
        assert tokens[b, kids].tolist() == top.tolist()
        assert torch.allclose(q[b, 0, top], torch.full((len(kids),), 1.0 / len(kids)))   # q marks the candidates


def test_top_m_is_the_stable_descending_argsort():
    """real.decode.tree.top_m (topk + tie order) == argsort(descending, stable)[..., :m] on rows with ties inside
    the top m, ties straddling the m-th place (the fallback) and distinct values."""
    from real.decode.tree import top_m

    g = torch.Generator().manual_seed(0)
    inside = torch.tensor([[1.0, 5.0, 3.0, 5.0, 5.0, 0.0]])            # three 5s inside the top 3, then a 3
    assert top_m(inside, 3).tolist() == [[1, 3, 4]] and top_m(inside, 4).tolist() == [[1, 3, 4, 2]]
    for _ in range(200):
        V = int(torch.randint(2, 40, (1,), generator=g))
        m = int(torch.randint(1, V + 1, (1,), generator=g))
        for x in (torch.randint(0, 5, (3, 2, V), generator=g).float(), torch.randn(3, 2, V, generator=g)):
            assert torch.equal(top_m(x, m), torch.argsort(x, dim=-1, descending=True, stable=True)[..., :m])
