"""The transformers image families at B > 1 (real.adapters.batched_imagelm.BatchedImageLM over real.models.llama.LlamaStack):
ragged rows (different prompt lengths, per-row rollback, tree blocks across row ends, per-row keep) against the
single-row transformers adapter; greedy speculative decoding at B = 1, 3 and 8 against each family's own
transformers greedy generation (test_real_hf_models' references); sampled tokens independent of the batch size;
the vanilla law at B = 50 (chi-square with a negative control); the memory guard; the model table."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from real.adapters.batched_imagelm import BatchedImageLM
from real.adapters.chameleon import tiny_chameleon_pair
from real.adapters.emu3 import tiny_emu3_pair
from real.adapters.imagelm_eagle import eagle_for
from real.adapters.janus import tiny_janus_pair
from real.decode import engine
from real.decode.modes import DynamicTree
from real.decode.sampling import Processing
from theory import rules
from theory.tree import EAGLE_25, Tree

from test_real_engine import _chi2
from test_real_hf_models import (_counts, _emu3_hf_greedy, _exact_law, _janus_hf_greedy, _law_pair,
                                 _lumina_greedy_reference, _prompt)

torch.set_num_threads(1)

SIDE = 4
T = SIDE * SIDE
FAMILIES = ["chameleon", "janus", "emu3"]
PAIRS = {"chameleon": tiny_chameleon_pair, "janus": tiny_janus_pair, "emu3": tiny_emu3_pair}
REFS = {"chameleon": _lumina_greedy_reference, "janus": _janus_hf_greedy, "emu3": _emu3_hf_greedy}


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request):
    t, d, text = PAIRS[request.param](0, side=SIDE)
    return request.param, t, d, text


def _conds(name, text, n):
    """n prompts of different lengths (rows are left-padded differently); Emu3 with negative prompts."""
    return [_prompt(text, n=2 + (i % 5), seed=11 + i, neg=name == "emu3") for i in range(n)]


# --------------------------------------------------------------------------- the cache, row by row

def test_ragged_rows_tree_blocks_and_keep_match_the_single_row_adapter(fam):
    """Three images with CFG (six rows), prompts of different lengths; per-row rollback leaves the rows at code counts
    6, 4 and 1 (row ends fall at different block positions); a 4-node tree block (two siblings at depth 0, a chain of
    two under the first) at each row's own positions; per-row keep of the chain with 3, 1 and 2 nodes; one more code.
    Every logit row equals the transformers adapter's prefill of that image's path (its own DynamicCache)."""
    name, t, _, text = fam
    bt = BatchedImageLM(t)
    conds = _conds(name, text, 3)
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, t.vocab_size, (3, 12), generator=g)
    rows = lambda x: torch.cat([x, x])                                     # noqa: E731  (cond rows; uncond rows)

    def ref(b, seq):                  # (2, 1 + len(seq), V): the adapter's logits after each prefix of seq
        s = torch.as_tensor(seq, dtype=torch.long).view(1, -1)
        return t.prefill(conds[b], s.expand(2, -1) if s.numel() else None, cfg=True).logits

    o = bt.prefill(conds, cfg=True)
    for b in range(3):
        assert torch.allclose(o.logits[[b, b + 3], 0], ref(b, [])[:, 0], atol=1e-4)
    bt.forward(rows(codes[:, :6]))
    back = np.array([0, 2, 5])
    bt.rollback(np.concatenate([back, back]))
    n = 6 - back
    assert (bt.cache_lens - bt.prefix_len).tolist() == np.concatenate([n, n]).tolist()
    P = bt.prefix_len
    pos = np.concatenate([n, n])[:, None] + P + np.array([0, 0, 1, 2])        # siblings share a position
    sib = (codes[torch.arange(3), n] + 1) % t.vocab_size                          # a sibling code unlike node 0's
    blk = torch.stack([torch.stack([codes[b, n[b]], sib[b], codes[b, n[b] + 1], codes[b, n[b] + 2]]) for b in range(3)])
    mask = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    out = bt.forward(rows(blk), position_ids=pos, attn_mask=mask).logits
    for b in range(3):
        path = ref(b, codes[b, :n[b] + 3].tolist())[:, n[b]:]                  # after codes n, n + 1, n + 2
        assert torch.allclose(out[[b, b + 3]][:, [0, 2, 3]], path[:, 1:], atol=1e-4)
        alt = ref(b, codes[b, :n[b]].tolist() + [int(sib[b])])[:, -1]
        assert torch.allclose(out[[b, b + 3], 1], alt, atol=1e-4)
        assert not torch.allclose(out[[b, b + 3], 1], out[[b, b + 3], 0], atol=1e-3)   # the control: siblings differ
    keep = np.array([3, 1, 2])
    bt.keep(np.array([0, 2, 3]), np.concatenate([keep, keep]))
    n2 = n + keep
    nxt = torch.stack([codes[b, n2[b]] for b in range(3)]).view(3, 1)
    last = bt.forward(rows(nxt)).logits
    for b in range(3):
        assert torch.allclose(last[[b, b + 3], 0], ref(b, codes[b, :n2[b] + 1].tolist())[:, -1], atol=1e-4)


def test_keep_refuses_a_non_path_and_rollback_past_the_prompt(fam):
    name, t, _, text = fam
    bt = BatchedImageLM(t)
    bt.prefill(_conds(name, text, 2))
    bt.forward(torch.zeros(2, 3, dtype=torch.long), position_ids=bt.prefix_len + np.array([0, 0, 1]),
               attn_mask=torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool))
    with pytest.raises(ValueError, match="root path"):
        bt.keep(np.array([0, 1]))                          # siblings, not a path
    with pytest.raises(ValueError, match="image codes"):
        bt.rollback(4)


# --------------------------------------------------------------------------- greedy == transformers' own greedy

@pytest.mark.parametrize("B", [1, 3, 8])
def test_greedy_sd_equals_the_familys_transformers_greedy(fam, B):
    """8 images (prompts of 2-6 tokens, CFG 3) by greedy speculative decoding in batches of B: chain (layer-skip draft,
    L = 3), static EAGLE-25 tree, dynamic tree, and an EAGLE-1 head on a chain: image by image, the tokens of the
    family's own transformers greedy generation. The rows are ragged (acceptance differs per image)."""
    name, t, d, text = fam
    bt, bd = BatchedImageLM(t), BatchedImageLM(d)
    conds = _conds(name, text, 8)
    ref = [REFS[name](t, c, 3.0, T).tolist() for c in conds]
    proc = Processing(temperature=0.0, cfg_scale=3.0)
    taus = set()
    for draft, drafting in ((bd, 3), (bd, Tree(EAGLE_25)), (bd, DynamicTree(total=20, depth=3, topk=4)),
                            (eagle_for(t, seed=1), 3)):
        gens = engine.generate(bt, draft, conds, num_tokens=T, verifier=rules.greedy(), drafting=drafting,
                               processing=proc, batch_size=B)
        assert [g.tokens.tolist() for g in gens] == ref
        taus |= {tuple(r.accepted for r in g.rounds) for g in gens}
    assert len(taus) > 4


def test_sampled_tokens_do_not_depend_on_the_batch_size(fam):
    """Cool-SD at temperature 1 with CFG: image k's tokens depend only on (seed, k), at B = 1, 3 and 8, chain and
    static tree; another seed gives other images (the control)."""
    name, t, d, text = fam
    bt, bd = BatchedImageLM(t), BatchedImageLM(d)
    conds = _conds(name, text, 8)
    proc = Processing(temperature=1.0, cfg_scale=3.0)
    for drafting in (3, Tree(EAGLE_25)):
        runs = [[g.tokens.tolist() for g in engine.generate(bt, bd, conds, num_tokens=T, verifier=rules.cool_sd(2.0),
                                                            drafting=drafting, processing=proc, batch_size=B, seed=5)]
                for B in (1, 3, 8)]
        assert runs[0] == runs[1] == runs[2]
        other = [g.tokens.tolist() for g in engine.generate(bt, bd, conds, num_tokens=T, verifier=rules.cool_sd(2.0),
                                                            drafting=drafting, processing=proc, batch_size=8, seed=6)]
        assert other != runs[0]


# --------------------------------------------------------------------------- the law at B = 50

@pytest.mark.parametrize("family", FAMILIES)
def test_vanilla_law_at_batch_50(family):
    """Theorem 1 through the batched adapter: 800 images (T = 3 on a 2 x 2 grid, V = 4: the third code follows a row
    end) in batches of 50, vanilla verification, CFG 1.5 + temperature 0.9 + top-k 3: chi-square against the exact
    law of plain sampling (enumerated through the transformers adapter; N = 800: a cell of probability 0.05 expects
    40, SE 6.2). The control (the target row as resampler) is rejected (test_real_hf_models' sizing)."""
    t, d, text = _law_pair(family)
    bt, bd = BatchedImageLM(t), BatchedImageLM(d)
    cond = _prompt(text, n=3, seed=9)
    proc = Processing(temperature=0.9, top_k=3, cfg_scale=1.5)
    N = 800
    law = _exact_law(t, cond, 3, proc)

    def counts(verifier, seed):
        gens = engine.generate(bt, bd, [cond] * N, num_tokens=3, verifier=verifier, drafting=2, processing=proc,
                               batch_size=50, seed=seed)
        it = iter(gens)
        return _counts(lambda: next(it).tokens, N), gens

    c, gens = counts(rules.vanilla(), 1)
    assert len({tuple(r.accepted for r in g.rounds) for g in gens}) > 2          # ragged rows
    p_sd, _ = _chi2(c, law, N)
    p_ctl, _ = _chi2(counts(rules.Verifier(rules.Vanilla(), rules.Target(), "wrong-resampler"), 2)[0], law, N)
    print(f"{family} batched: chi2 p vanilla {p_sd:.3g}, control {p_ctl:.3g}")
    assert p_sd > 1e-3
    assert p_ctl < 1e-3


# --------------------------------------------------------------------------- bad input, the table

def test_a_batch_that_does_not_fit_is_refused_before_any_work(fam, monkeypatch):
    name, t, d, text = fam
    bt, bd = BatchedImageLM(t), BatchedImageLM(d)
    need = bt.cache_bytes(2 * 8)
    assert need > 2 * bt.cache_bytes(2 * 4) - 1           # the estimate grows with the rows
    import real.decode.memory as memory

    monkeypatch.setattr(memory, "_available_bytes", lambda dev: need // 2)
    calls = []
    monkeypatch.setattr(bt, "prefill", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError, match="lower the batch size"):
        engine.generate(bt, bd, _conds(name, text, 8), num_tokens=T, verifier=rules.vanilla(), drafting=3,
                        processing=Processing(cfg_scale=3.0), batch_size=8)
    assert not calls


def test_model_table_shows_every_image_family_batched():
    from real.specs import markdown_table

    rows = {r.split("|")[1].strip(" `"): r for r in markdown_table().splitlines()[2:]}
    for m in ("chameleon-tiny", "janus-tiny", "emu3-tiny", "lumina-mgpt", "janus-pro", "emu3"):
        assert rows[m].split("|")[4].strip() == "yes", rows[m]


# --------------------------------------------------------------------------- GLM-Image (AR stage), batched from the start

GLM_GRIDS = ((4, 4), (2, 2))     # as the processor lists them: target (H, W), then prior (h, w): 20 codes


@pytest.fixture(scope="module")
def glm():
    from real.adapters.glm_image import tiny_glm_image_pair

    t, d, text = tiny_glm_image_pair(0, "layerskip", grids=GLM_GRIDS)
    return t, d, text


def _glm_conds(text, n):
    g = torch.Generator().manual_seed(4)
    from real.protocol import Prompt

    return [Prompt(torch.randint(text[0], text[1], (2 + i % 5,), generator=g)) for i in range(n)]


@pytest.mark.parametrize("B", [1, 3, 8])
def test_glm_greedy_sd_equals_transformers_generate(glm, B):
    """8 GLM-Image prompts of 2-6 words: greedy speculative decoding (layer-skip chain L = 3, EAGLE-25 tree, dynamic
    tree) in batches of B gives, image by image, the codes of transformers' own ``generate`` (do_sample=False, the
    two grids, 3-D positions; real.adapters.glm_image_hf.glm_reference_greedy)."""
    from real.adapters.glm_image_hf import glm_reference_greedy

    t, d, text = glm
    bt, bd = BatchedImageLM(t), BatchedImageLM(d)
    conds = _glm_conds(text, 8)
    ref = [glm_reference_greedy(t.model, t.prompt(c, False).ids, GLM_GRIDS).tolist() for c in conds]
    T = t.layout.num_tokens
    taus = set()
    for drafting in (3, Tree(EAGLE_25), DynamicTree(total=20, depth=3, topk=4)):
        gens = engine.generate(bt, bd, conds, num_tokens=T, verifier=rules.greedy(), drafting=drafting,
                               processing=Processing(temperature=0.0), batch_size=B)
        assert [g.tokens.tolist() for g in gens] == ref
        taus |= {tuple(r.accepted for r in g.rounds) for g in gens}
    assert len(taus) > 2


def test_glm_sampled_tokens_do_not_depend_on_the_batch_size(glm):
    t, d, text = glm
    bt, bd = BatchedImageLM(t), BatchedImageLM(d)
    conds = _glm_conds(text, 8)
    kw = dict(num_tokens=t.layout.num_tokens, verifier=rules.cool_sd(2.0), drafting=3, processing=Processing())
    runs = [[g.tokens.tolist() for g in engine.generate(bt, bd, conds, batch_size=B, seed=5, **kw)] for B in (1, 3, 8)]
    assert runs[0] == runs[1] == runs[2]
    assert [g.tokens.tolist() for g in engine.generate(bt, bd, conds, batch_size=8, seed=6, **kw)] != runs[0]


def test_glm_vanilla_law_at_batch_50():
    """V = 4 codes, a 1 x 1 prior grid then a 1 x 2 target grid (T = 3, the third code in the second grid at its own
    3-D position); an independent random 1-layer model with negated, doubled code rows as the draft (many rejections:
    the control has mass to bias; p = 5e-20 measured). 800 images in batches of 50: chi-square against
    the exact law of plain sampling (enumerated: each prefix scored by a fresh prefill); the wrong-resampler control
    is rejected. Sizes as test_vanilla_law_at_batch_50."""
    from real.adapters.glm_image import GlmImageLM
    from real.adapters.glm_image_hf import tiny_glm_image, tiny_glm_prompt
    from real.protocol import Prompt

    grids = ((1, 2), (1, 1))
    kw = dict(V=4, layers=2, hidden=32, heads=2, kv_heads=1, inter=64, branch_scale=1.0)
    m, md = tiny_glm_image(0, **kw), tiny_glm_image(1, **{**kw, "layers": 1})
    with torch.no_grad():
        m.lm_head.weight[:4] *= 3                       # peaked target rows
        md.lm_head.weight[:4] *= -2                     # a draft that disagrees: many rejections for the control to bias
    ids, lay = tiny_glm_prompt(grids, n_words=3, V=4)
    t, dft = GlmImageLM(m, lay), GlmImageLM(md, lay)
    bt, bd = BatchedImageLM(t), BatchedImageLM(dft)
    cond = Prompt(ids)
    proc = Processing(temperature=0.9, top_k=3)
    N = 800
    law = _exact_law(bt, cond, 3, proc)
    assert abs(sum(law.values()) - 1) < 1e-5

    def counts(verifier, seed):
        gens = engine.generate(bt, bd, [cond] * N, num_tokens=3, verifier=verifier, drafting=2, processing=proc,
                               batch_size=50, seed=seed)
        it = iter(gens)
        return _counts(lambda: next(it).tokens, N)

    p_sd, _ = _chi2(counts(rules.vanilla(), 1), law, N)
    p_ctl, _ = _chi2(counts(rules.Verifier(rules.Vanilla(), rules.Target(), "wrong-resampler"), 2), law, N)
    print(f"glm batched: chi2 p vanilla {p_sd:.3g}, control {p_ctl:.3g}")
    assert p_sd > 1e-3
    assert p_ctl < 1e-3


def test_glm_refuses_cfg_and_diffusion_options(glm, capsys):
    from coolsd.cli import main
    from real.adapters.glm_image import check_ar_options, load_glm_image

    t, _, text = glm
    with pytest.raises(ValueError, match="no classifier-free guidance"):
        BatchedImageLM(t).prefill(_glm_conds(text, 2), cfg=True)
    with pytest.raises(ValueError, match="guidance_scale.*diffusion stage"):
        check_ar_options({"guidance_scale": 1.5, "height": 1024})
    with pytest.raises(ValueError, match="num_inference_steps.*diffusion stage"):
        load_glm_image("/nonexistent", num_inference_steps=50)      # refused before anything is read
    assert main(["generate", "--model", "glm-image-tiny", "--cfg-scale", "3", "--json"]) == 2
    assert "no classifier-free guidance" in capsys.readouterr().err


def test_sweep_janus_tiny_with_exact_fidelity(tmp_path):
    """coolsd sweep on a batched transformers family (janus-tiny, two settings, units of 4 images): the exact
    likelihood of chain SD applies, so each setting gets KL per token: vanilla's is 0 up to rounding (lossless),
    Cool-SD's is positive with a CI excluding 0 (the control a lossless reading would miss)."""
    import json

    from coolsd.cli import main

    out = tmp_path / "sw"
    assert main(["sweep", "--model", "janus-tiny", "--grid", "cool-sd:delta=2", "vanilla", "--images", "8",
                 "--unit-images", "4", "--no-progress", "--out", str(out)]) == 0
    rep = {m["name"]: m for m in json.loads((out / "report.json").read_text())["methods"]}
    van, cool = rep["vanilla"]["kl_to_target"]["per_token"], rep["cool-sd"]["kl_to_target"]["per_token"]
    assert abs(van["measured"]) < 1e-6
    assert cool["ci"][0] > 0.005
    assert rep["cool-sd"]["accepted_length"]["measured"] > rep["vanilla"]["accepted_length"]["measured"] > 1.2
