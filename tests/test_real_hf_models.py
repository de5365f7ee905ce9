"""Chameleon / Lumina-mGPT, Janus and Emu3 through transformers (real.adapters.imagelm adapters) on tiny random
configs: the facts the adapters rely on, logits against no-cache references written here, cache
rollback and tree blocks, greedy speculative == greedy (and == transformers' own image generation where
it exists), the sampling law (chi-square with a negative control), the layout constraints, the
Chameleon VQGAN decoder against a functional reference, loaders that refuse wrong checkpoints, the CLI.
"""
from __future__ import annotations

import inspect
import itertools
import sys
import json

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from real.decode import engine
from real.adapters.chameleon import ChameleonImageLM, tiny_chameleon, tiny_chameleon_pair
from real.adapters.emu3 import emu3_decoder, tiny_emu3_pair
from real.adapters.imagelm_eagle import eagle_for, load_adapter_eagle
from real.adapters.imagelm_loading import truncated_hf
from real.adapters.janus import janus_decoder, tiny_janus_pair
from real.protocol import Prompt
from real.decode.sampling import Processing
from theory import rules
from theory.rules import Target, Vanilla, Verifier

from test_real_engine import _chi2  # Pearson chi-square against an exact law, small cells pooled

torch.set_num_threads(1)  # tiny models: threads only contend (see test_real_engine)

SIDE, V = 4, 64


@pytest.fixture(scope="module")
def cham():
    return tiny_chameleon_pair(0, side=SIDE)


@pytest.fixture(scope="module")
def janus():
    return tiny_janus_pair(0, side=SIDE)


@pytest.fixture(scope="module")
def emu3():
    return tiny_emu3_pair(0, side=SIDE)


def _prompt(text, n=5, seed=0, neg=False):
    a, b = text
    g = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.tensor([1]), torch.randint(a, b, (n,), generator=g)])
    return Prompt(ids, torch.cat([torch.tensor([1]), torch.randint(a, b, (2,), generator=g)]) if neg else None)


def _codes(T, seed=0, V=V):
    return torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- facts (transformers 5.24)

def test_facts_chameleon_masks_image_logits_has_no_vq_decoder_and_maps_codes(cham):
    t, _, _ = cham
    m = t.model
    vm = m.model.vocabulary_mapping
    with torch.no_grad():
        logits = m(torch.tensor([[1, 70, 80]])).logits
        hid = m.model(input_ids=torch.tensor([[1, 70, 80]])).last_hidden_state
    img = torch.tensor(vm.image_tokens)
    assert (logits[..., img] == torch.finfo(logits.dtype).min).all()             # forward: image tokens impossible
    direct = m.lm_head(hid)[..., img]
    assert torch.isfinite(direct).all() and direct.std() > 0                     # ... but the head rows are fine
    assert not hasattr(m.model.vqmodel, "decoder") and hasattr(m.model.vqmodel, "encoder")
    # VQ code k is the IMGIMG token whose letters spell k; the id order differs from the code order
    assert t.code_ids.tolist() == [vm.img2bpe[k] for k in range(V)]
    assert t.code_ids.tolist() != sorted(t.code_ids.tolist())
    assert vm.val2name[int(t.code_ids[12])] == "IMGIMGBCZ"                        # 1 -> B, 2 -> C


def test_facts_emu3_does_not_mask_and_janus_uses_generation_head(emu3, janus):
    te, _, _ = emu3
    with torch.no_grad():
        lg = te.model(torch.tensor([[1, 100, 101]])).logits[..., te.code_ids]
    assert torch.isfinite(lg).all() and lg.std() > 0
    tj, _, _ = janus
    mj = tj.model
    assert mj.lm_head.weight.shape[0] == mj.config.text_config.vocab_size        # the LM head has no image rows
    assert mj.model.generation_head.vision_head.weight.shape[0] == V
    for mdl in (te.model, tj.model, cham_model()):
        assert "cache" in inspect.signature(mdl.forward).parameters               # 5.x keyword
    from transformers import DynamicCache

    assert "tokens_to_remove" in inspect.signature(DynamicCache.crop).parameters


def cham_model():
    return tiny_chameleon(0, side=SIDE, layers=1)[0]


def test_facts_cfg_pair_needs_the_two_d_mask_on_every_call(cham):
    """Lumina-mGPT's CFG pair (prompt + header, header alone) is left-padded; without the 2-D mask of
    length past + new the uncond row attends to padding (negative control), with it (the adapter) each
    row equals its own unpadded run."""
    t, _, text = cham
    m = t.model
    cond = _prompt(text)
    codes = _codes(6, 1)
    o = t.prefill(cond, codes[:3].view(1, -1).expand(2, -1), cfg=True)
    o2 = t.forward(codes[3:].view(1, -1).expand(2, -1))
    got = torch.cat([o.logits, o2.logits], 1)
    hdr = torch.tensor(t.layout.header)
    seq_u = torch.cat([hdr, t.image_sequence(torch.cat([codes, torch.zeros(10, dtype=torch.long)]))[len(hdr):]])[:3 + 7]
    with torch.no_grad():
        hu = m.model(input_ids=seq_u[None]).last_hidden_state
    pos = [2 + j + j // SIDE for j in range(7)]                  # the id before code j in the uncond row
    want_u = t.head(hu[0, pos])
    assert (got[1] - want_u).abs().max() < 1e-4
    # negative control: the same padded batch without a mask
    P = cond.ids.numel() + 3
    ids = torch.full((2, P), 3)
    ids[0] = torch.cat([cond.ids, hdr])
    ids[1, P - 3:] = hdr
    with torch.no_grad():
        bad = t.head(m.model(input_ids=ids).last_hidden_state[1, -1])
    assert (bad - want_u[0]).abs().max() > 1e-2


# --------------------------------------------------------------------------- no-cache references

def _ref_rows(t, family, cond_ids, codes, uncond_ids=None):
    """Logits (T, V) predicting each of ``codes`` from ONE no-cache forward over the whole sequence,
    built here from the layout: prompt, header, rows (+ row end)."""
    m = t.model
    hdr = list(t.layout.header)
    W = t.layout.width
    T = codes.numel()
    ids = uncond_ids if uncond_ids is not None else cond_ids
    if family == "janus":
        e_txt = m.get_input_embeddings()(torch.cat([ids, torch.tensor(hdr)]).view(1, -1))
        e_img = m.prepare_embeddings_for_image_generation(codes.view(1, -1))
        with torch.no_grad():
            h = m.model.language_model(inputs_embeds=torch.cat([e_txt, e_img], 1)).last_hidden_state[0]
            P = e_txt.shape[1]
            return m.model.generation_head(h[P - 1:P - 1 + T]).float()
    body = []
    for j, c in enumerate(codes.tolist()):
        body.append(int(t.code_ids[c]))
        if (j + 1) % W == 0:
            body.append(t.layout.row_end)
    seq = torch.cat([ids, torch.tensor(hdr + body)]).view(1, -1)
    P = ids.numel() + len(hdr)
    pos = [P - 1 + j + j // W for j in range(T)]
    with torch.no_grad():
        if family == "emu3":     # Emu3's own forward does not mask: use its logits directly
            return m(input_ids=seq).logits[0, pos][:, t.code_ids].float()
        return t.head(m.model(input_ids=seq).last_hidden_state[0, pos])


@pytest.mark.parametrize("family", ["chameleon", "janus", "emu3"])
def test_prefill_forward_rollback_match_no_cache_reference(family, cham, janus, emu3):
    t, _, text = {"chameleon": cham, "janus": janus, "emu3": emu3}[family]
    cond = _prompt(text, seed=2, neg=True)
    codes = _codes(12, 3)
    ref = _ref_rows(t, family, cond.ids, codes)
    a = t.prefill(cond, codes[:5].view(1, -1))                       # crosses the first row end (W = 4)
    b = t.forward(codes[5:9].view(1, -1))
    got = torch.cat([a.logits[0], b.logits[0]])
    assert got.shape == (10, V) and (got - ref[:10]).abs().max() < 1e-4
    P = t.cache_len - 9
    t.rollback(3)                                                     # drops codes 6..8 (and the row end after 7)
    assert t.cache_len == P + 6
    c = t.forward(codes[6:12].view(1, -1))
    assert (c.logits[0, :5] - ref[7:12]).abs().max() < 1e-4
    # CFG pair: row 1 is the family's unconditional row
    o = t.prefill(cond, codes[:6].view(1, -1).expand(2, -1), cfg=True)
    un = t._prompt(cond, True).uncond_ids
    un = un[: un.numel() - len(t.layout.header)]
    ref_u = _ref_rows(t, family, cond.ids, codes[:6], uncond_ids=un)
    assert (o.logits[1, :6] - ref_u[:6]).abs().max() < 1e-4
    assert (o.logits[0, :6] - ref[:6]).abs().max() < 1e-4
    with pytest.raises(ValueError, match="codes"):
        t.forward(torch.zeros(2, SIDE * SIDE, dtype=torch.long))      # more codes than the image holds


def test_janus_uncond_row_is_janus_own_and_lumina_uncond_is_the_header(janus, cham):
    tj, _, text = janus
    p = tj._prompt(_prompt(text), True)
    assert p.uncond_ids.numel() == p.ids.numel() and p.uncond_ids[0] == 1 and p.uncond_ids[-1] == 3
    assert (p.uncond_ids[1:-1] == 0).all()                              # everything else -> pad
    tc, _, text = cham
    assert tc._prompt(_prompt(text), True).uncond_ids.tolist() == list(tc.layout.header)


@pytest.mark.parametrize("family", ["chameleon", "emu3"])
def test_tree_block_across_a_row_end_and_keep(family, cham, emu3):
    """Siblings at the code that ends a row (each gets its own forced row end): a tree block scores a
    branch as the chain does, ``keep`` compacts the branch with its row end, decoding continues exactly."""
    t, _, text = {"chameleon": cham, "emu3": emu3}[family]
    cond = _prompt(text, seed=4)
    codes = _codes(8, 5)
    ref = _ref_rows(t, family, cond.ids, codes)
    t.prefill(cond, codes[:2].view(1, -1))
    n = t.cache_len
    # block: codes[2] (depth 0), then two children at depth 1 (code index 3 = row end): x, codes[3]; then codes[4]
    x = (int(codes[3]) + 1) % V
    blk = torch.tensor([[codes[2], x, codes[3], codes[4]]])
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    out = t.forward(blk, position_ids=torch.tensor([n, n + 1, n + 1, n + 2]), attn_mask=mask).logits[0]
    assert (out[0] - ref[3]).abs().max() < 1e-4 and (out[2] - ref[4]).abs().max() < 1e-4
    assert (out[3] - ref[5]).abs().max() < 1e-4
    with pytest.raises(ValueError, match="root path"):
        t.keep(torch.tensor([0, 3]))
    t.keep(torch.tensor([0, 2, 3]))
    assert t.cache_len == n + 3 and t.stream().tolist() == t.image_sequence(codes[:8].repeat(2))[
        len(t.layout.header):len(t.layout.header) + 6].tolist()
    assert (t.forward(codes[5:7].view(1, -1)).logits[0] - ref[6:8]).abs().max() < 1e-4


# --------------------------------------------------------------------------- greedy exactness

@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("family", ["chameleon", "janus", "emu3"])
def test_greedy_speculative_equals_greedy(family, cfg_scale, cham, janus, emu3):
    t, d, text = {"chameleon": cham, "janus": janus, "emu3": emu3}[family]
    cond = _prompt(text, seed=6, neg=family == "emu3")
    proc = Processing(temperature=0.0, cfg_scale=cfg_scale)
    T = SIDE * SIDE
    ar = engine.ar_generate(t, cond, num_tokens=T, processing=proc)
    sd = engine.speculative_generate(t, d, cond, num_tokens=T, verifier=rules.greedy(), drafting=3, processing=proc)
    assert torch.equal(sd.tokens, ar.tokens) and any(r.accepted > 0 for r in sd.rounds)
    e = eagle_for(t, seed=1)
    se = engine.speculative_generate(t, e, cond, num_tokens=T, verifier=rules.greedy(), drafting=3, processing=proc)
    assert torch.equal(se.tokens, ar.tokens)
    if cfg_scale == 1.0:
        return
    ref = {"chameleon": _lumina_greedy_reference, "janus": _janus_hf_greedy, "emu3": _emu3_hf_greedy}[family]
    assert ref(t, cond, cfg_scale, T).tolist() == ar.tokens.tolist()


def _lumina_greedy_reference(t, cond, s, T):
    """Lumina-mGPT's sampler at temperature 0 without any cache: each step runs the whole cond and
    uncond (from boi) sequences, combines the code logits with CFG, takes the argmax, appends the code
    and, at a row end, the forced newline."""
    m = t.model
    hdr = list(t.layout.header)
    body, out = [], []
    for j in range(T):
        rows = []
        for pre in (cond.ids.tolist() + hdr, hdr):
            with torch.no_grad():
                h = m.model(input_ids=torch.tensor([pre + body])).last_hidden_state[0, -1]
            rows.append(m.lm_head(h)[t.code_ids])
        k = int((rows[1] + s * (rows[0] - rows[1])).argmax())
        out.append(k)
        body.append(int(t.code_ids[k]))
        if (j + 1) % t.layout.width == 0:
            body.append(t.layout.row_end)
    return torch.tensor(out)


def _janus_hf_greedy(t, cond, s, T):
    from transformers import GenerationConfig

    ids = torch.cat([cond.ids, torch.tensor(t.layout.header)]).view(1, -1)
    gc = GenerationConfig(do_sample=False, guidance_scale=s, bos_token_id=1, pad_token_id=0,
                          generation_kwargs={"boi_token_id": t.layout.header[0]})
    return t.model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image", generation_config=gc)[0]


def _emu3_hf_greedy(t, cond, s, T):
    """transformers' Emu3 recipe: prefix_allowed_tokens_fn for the layout, negative prompt CFG."""
    lay = t.layout
    H, W = lay.height, lay.width
    vis = t.model.vocabulary_mapping.image_tokens
    wrap = lay.header[-1]

    def allowed(batch_id, input_ids):
        off = input_ids.shape[0] - int(torch.nonzero(input_ids == wrap)[0, 0])
        if off % (W + 1) == 0:
            return [lay.row_end]
        if off > (W + 1) * H:
            return [lay.trailer[min(off - (W + 1) * H - 1, len(lay.trailer) - 1)]]
        return vis

    hdr = torch.tensor(lay.header)
    full = torch.cat([cond.ids, hdr]).view(1, -1)
    out = t.model.generate(full, max_new_tokens=H * (W + 1), do_sample=False, prefix_allowed_tokens_fn=allowed,
                           pad_token_id=0, eos_token_id=None, guidance_scale=s,
                           negative_prompt_ids=torch.cat([cond.uncond_ids, hdr]).view(1, -1))[0, full.shape[1]:]
    codes = out.view(H, W + 1)[:, :W].reshape(-1)
    assert (out.view(H, W + 1)[:, W] == lay.row_end).all()
    return torch.tensor([t.model.vocabulary_mapping.bpe2img[int(c)] for c in codes])


# --------------------------------------------------------------------------- constraints

@pytest.mark.parametrize("family", ["chameleon", "emu3"])
def test_layout_constraints_hold_along_sampled_speculative_runs(family, cham, emu3):
    """After sampled runs with rejections and rollbacks, the ids the target and the draft hold in their
    caches are exactly the layout: a code at every code position, the row end exactly after every row;
    the complete sequence ends with the trailer (eoi ...). ``ImageLayout.check`` catches violations."""
    t, d, text = {"chameleon": cham, "emu3": emu3}[family]
    T = SIDE * SIDE
    hl = len(t.layout.header)
    rejected = 0
    for seed in range(8):                                # enough runs that rollbacks happen (checked below)
        g = engine.speculative_generate(t, d, _prompt(text, seed=seed), num_tokens=T, verifier=rules.vanilla(), drafting=4,
                                        processing=Processing(temperature=1.5, cfg_scale=2.0), seed=seed)
        rejected += sum(r.accepted < r.drafted for r in g.rounds)
        full = t.image_sequence(g.tokens)
        t.layout.check(full, t.code_ids)
        s = t.stream().tolist()                      # the target holds codes 0..T-2 and their row ends
        assert s == full[hl:hl + T - 1 + (T - 1) // SIDE].tolist()
        s = d.stream().tolist()                      # the draft lags by the tokens it has not been fed
        assert s == full[hl:hl + len(s)].tolist() and len(s) >= T - 1 - 4
        assert full[-len(t.layout.trailer):].tolist() == list(t.layout.trailer)
    assert rejected >= 2                                                     # rollbacks happened
    bad = full.clone()
    bad[hl + SIDE] = t.code_ids[0]                                           # a code where the row end belongs
    with pytest.raises(ValueError, match="row 0 ends"):
        t.layout.check(bad, t.code_ids)
    with pytest.raises(ValueError, match="trailer"):
        t.layout.check(torch.cat([full[:-1], full[-2:-1]]), t.code_ids)


# --------------------------------------------------------------------------- sampling law

def _law_pair(family, seed=0):
    """V = 4 codes on a 2 x 2 grid (T = 3 crosses the row end): target (code head rows x3) and a layer-skip
    draft whose code head rows are perturbed. Chameleon: processed rows differ by TV 0.49 on average over
    the 21 prefixes of length <= 2 (measured when choosing seed and scales); the control is rejected at
    p < 1e-18 for all three families at N = 800 (measured), the engine passes at p > 0.1."""
    kw = dict(V=4, side=2, hidden=32, layers=2, heads=2)
    if family == "chameleon":
        m, lay, text = tiny_chameleon(seed, **kw)
        build = lambda mm: ChameleonImageLM(mm, lay)
        key, setn = "model.layers", lambda c, n: setattr(c, "num_hidden_layers", n)
        head = lambda mm: mm.lm_head.weight
    elif family == "emu3":
        from real.adapters.emu3 import Emu3ImageLM, tiny_emu3

        m, lay, text = tiny_emu3(seed, **kw)
        build = lambda mm: Emu3ImageLM(mm, lay)
        key, setn = "text_model.layers", lambda c, n: setattr(c.text_config, "num_hidden_layers", n)
        head = lambda mm: mm.lm_head.weight
    else:
        from real.adapters.janus import JanusImageLM, tiny_janus

        m, text = tiny_janus(seed, **kw)
        build = JanusImageLM
        key, setn = "language_model.layers", lambda c, n: setattr(c.text_config, "num_hidden_layers", n)
        head = lambda mm: mm.model.generation_head.vision_head.weight
    ids = torch.arange(4) if family == "janus" else build(m).code_ids
    with torch.no_grad():
        head(m)[ids] *= 3
    d = truncated_hf(m, 1, key, setn)
    with torch.no_grad():
        head(d)[ids] += torch.randn(4, head(d).shape[1], generator=torch.Generator().manual_seed(seed + 7)) * 0.5
    return build(m), build(d), text


def _exact_law(model, cond, T, proc):
    """P(x_1..x_T) of plain sampling by enumerating all V^T sequences (products of processed rows)."""
    law = {}
    for seq in itertools.product(range(model.vocab_size), repeat=T):
        prob = 1.0
        for j in range(T):
            pre = torch.tensor(seq[:j]).view(1, -1).expand(proc.batch, -1)
            prob *= float(proc(model.prefill(cond, pre if j else None, cfg=proc.cfg).logits[:, -1])[seq[j]])
        law[seq] = prob
    return law


def _counts(fn, N):
    c: dict = {}
    for _ in range(N):
        s = tuple(fn().tolist())
        c[s] = c.get(s, 0) + 1
    return c


def _law_check(family):
    """Theorem 1 through a family adapter: vanilla SD's output law equals plain sampling's exact law
    (enumerated), with CFG (the family's uncond row) + temperature + top-k on draft and target alike.
    N = 800: a cell of probability 0.05 has expected count 40, SE 6.2; the control (target row as
    resampler, ignoring the residual) shifts mass by TV ~0.2 at prefixes where draft and target differ
    by ~0.5, several SE per affected cell, far above the 99.9% chi-square quantile. Engine must pass
    at p > 1e-3, the control must fail at p < 1e-3 (fixed seeds)."""
    t, d, text = _law_pair(family)
    cond = _prompt(text, n=3, seed=9)
    proc = Processing(temperature=0.9, top_k=3, cfg_scale=1.5)
    T, N, L = 3, 800, 2
    law = _exact_law(t, cond, T, proc)
    assert abs(sum(law.values()) - 1) < 1e-5
    g = torch.Generator().manual_seed(1)
    p_sd, _ = _chi2(_counts(lambda: engine.speculative_generate(t, d, cond, num_tokens=T, verifier=rules.vanilla(), drafting=L,
                                                             processing=proc, generator=g).tokens, N), law, N)
    bad = Verifier(Vanilla(), Target(), "wrong-resampler")
    g = torch.Generator().manual_seed(3)
    p_ctl, _ = _chi2(_counts(lambda: engine.speculative_generate(t, d, cond, num_tokens=T, verifier=bad, drafting=L,
                                                              processing=proc, generator=g).tokens, N), law, N)
    print(f"{family}: chi2 p speculative {p_sd:.3g}, wrong-resampler control {p_ctl:.3g}")
    assert p_sd > 1e-3
    assert p_ctl < 1e-3


def test_sampling_law_lumina_layout():
    _law_check("chameleon")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["janus", "emu3"])
def test_sampling_law_janus_emu3(family):
    _law_check(family)


# --------------------------------------------------------------------------- Chameleon VQGAN

def _vqgan_cfg():
    from real.models.chameleon_vqgan import VQGANConfig

    return VQGANConfig(n_embed=40, embed_dim=8, ch=32, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(8,),
                       z_channels=32, resolution=16)


def _functional_decode(sd, codes, c):
    """The VQGAN decoder of the published description, written with torch.nn.functional over the state
    dict (independent of the module code)."""
    def gn(x, p):
        return F.group_norm(x, 32, sd[p + ".weight"], sd[p + ".bias"], eps=1e-6)

    def conv(x, p, pad=1):
        return F.conv2d(x, sd[p + ".weight"], sd[p + ".bias"], padding=pad)

    def res(x, p):
        h = conv(F.silu(gn(x, p + ".norm1")), p + ".conv1")
        h = conv(F.silu(gn(h, p + ".norm2")), p + ".conv2")
        return (conv(x, p + ".nin_shortcut", 0) if p + ".nin_shortcut.weight" in sd else x) + h

    def attn(x, p):
        b, ch, hh, ww = x.shape
        y = gn(x, p + ".norm")
        q, k, v = (conv(y, p + "." + n, 0).reshape(b, ch, -1) for n in "qkv")
        w = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / ch ** 0.5, -1)
        return x + conv(torch.einsum("bij,bcj->bci", w, v).reshape(b, ch, hh, ww), p + ".proj_out", 0)

    B, h, w = codes.shape
    z = sd["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)
    x = conv(z, "post_quant_conv", 0)
    x = conv(x, "decoder.conv_in")
    x = res(attn(res(x, "decoder.mid.block_1"), "decoder.mid.attn_1"), "decoder.mid.block_2")
    res_now = c.resolution // 2 ** (len(c.ch_mult) - 1)
    for i in reversed(range(len(c.ch_mult))):
        for j in range(c.num_res_blocks + 1):
            x = res(x, f"decoder.up.{i}.block.{j}")
            if res_now in c.attn_resolutions:
                x = attn(x, f"decoder.up.{i}.attn.{j}")
        if i:
            x = conv(F.interpolate(x, scale_factor=2.0, mode="nearest"), f"decoder.up.{i}.upsample.conv")
            res_now *= 2
    return conv(F.silu(gn(x, "decoder.norm_out")), "decoder.conv_out")


def test_vqgan_decoder_matches_description_loads_checkpoint_and_round_trips_shapes(tmp_path):
    from transformers.models.chameleon.modeling_chameleon import ChameleonVQVAE

    from real.models.chameleon_vqgan import ChameleonVQGAN, load_chameleon_vqgan

    c = _vqgan_cfg()
    src = ChameleonVQGAN(c).random_init(3)
    enc = ChameleonVQVAE(c.to_hf())                                    # encoder half, same key names
    sd = {**{k: v for k, v in enc.state_dict().items() if k.startswith(("encoder.", "quant_conv."))},
          **src.state_dict(), "loss.discriminator.main.0.weight": torch.zeros(2)}
    torch.save({"state_dict": sd, "epoch": 3}, tmp_path / "vqgan.ckpt")
    (tmp_path / "vqgan.yaml").write_text(
        "model:\n  target: taming.models.vqgan.VQModel\n  params:\n    embed_dim: 8\n    n_embed: 40\n"
        "    ddconfig:\n      double_z: false\n      z_channels: 32\n      resolution: 16\n      in_channels: 3\n"
        "      out_ch: 3\n      ch: 32\n      ch_mult: [1, 2]\n      num_res_blocks: 1\n      attn_resolutions: [8]\n"
        "      dropout: 0.0\n    lossconfig:\n      target: x\n")
    m = load_chameleon_vqgan(str(tmp_path / "vqgan.ckpt"), str(tmp_path / "vqgan.yaml"), with_encoder=True)
    assert m.config == c
    codes = torch.randint(0, 40, (2, 3, 5), generator=torch.Generator().manual_seed(0))
    got = m.decode_code(codes, clamp=False)
    assert got.shape == (2, 3, 6, 10)                                  # ds 2 here (ds 16 for ch_mult of length 5)
    want = _functional_decode({k: v.float() for k, v in sd.items()}, codes, c)
    assert (got - want).abs().max() < 1e-4
    assert m.decode_code(codes.flatten(1), grid=(3, 5)).abs().max() <= 1.0
    sq = m.decode_code(torch.randint(0, 40, (1, 16)))                   # square grid inferred: 4 x 4
    assert sq.shape == (1, 3, 8, 8)
    back = m.encode(sq)                                                 # pixels -> codes through transformers' encoder
    assert back.shape == (1, 16) and 0 <= int(back.min()) and int(back.max()) < 40
    u8 = ChameleonVQGAN.to_uint8(sq)
    assert u8.shape == (1, 8, 8, 3) and u8.dtype == torch.uint8
    with pytest.raises(ValueError, match="square"):
        m.decode_code(torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 40\)"):
        m.decode_code(torch.full((1, 4), 40))


def test_vqgan_wrong_checkpoint_names_keys_and_shapes(tmp_path):
    from real.models.chameleon_vqgan import ChameleonVQGAN, load_chameleon_vqgan, read_vqgan_yaml

    c = _vqgan_cfg()
    sd = ChameleonVQGAN(c).state_dict()
    broken = dict(sd)
    del broken["decoder.conv_out.bias"]
    broken["decoder.extra.weight"] = torch.zeros(1)
    broken["quantize.embedding.weight"] = torch.zeros(41, 8)
    with pytest.raises(ValueError) as e:
        load_chameleon_vqgan({"state_dict": broken}, c)
    msg = str(e.value)
    assert "missing keys (1): decoder.conv_out.bias" in msg and "decoder.extra.weight" in msg
    assert "quantize.embedding.weight: checkpoint (41, 8) vs model (40, 8)" in msg
    with pytest.raises(ValueError, match="missing keys"):
        load_chameleon_vqgan({"state_dict": sd})                        # Chameleon's full-size config
    (tmp_path / "bad.yaml").write_text("model:\n  params:\n    embed_dim: 8\n")
    with pytest.raises(ValueError, match="not a taming VQGAN config"):
        read_vqgan_yaml(str(tmp_path / "bad.yaml"))
    with pytest.raises(ValueError, match="not found"):
        load_chameleon_vqgan(str(tmp_path / "none.ckpt"), c)


# --------------------------------------------------------------------------- checkpoints, drafters, CLI

def test_loaders_accept_saved_checkpoints_and_refuse_wrong_ones(tmp_path, janus, cham):
    from safetensors.torch import load_file, save_file

    from real.adapters.chameleon import load_lumina_mgpt
    from real.adapters.emu3 import load_emu3
    from real.adapters.janus import load_janus

    tj, _, text = janus
    tj.model.save_pretrained(tmp_path / "janus")
    lj, proc = load_janus(str(tmp_path / "janus"), dtype=torch.float32)
    assert proc is None
    cond, codes = _prompt(text), _codes(5, 1)
    assert (lj.prefill(cond, codes.view(1, -1)).logits - tj.prefill(cond, codes.view(1, -1)).logits).abs().max() < 1e-5
    with pytest.raises(ValueError, match="expected 'emu3'"):
        load_emu3(str(tmp_path / "janus"))
    f = tmp_path / "janus" / "model.safetensors"
    sd = load_file(f)
    sd["model.generation_head.vision_head.weight"] = torch.zeros(V + 1, sd["model.generation_head.vision_head.weight"].shape[1])
    del sd["model.language_model.norm.weight"]
    save_file(sd, f, metadata={"format": "pt"})
    with pytest.raises(ValueError) as e:
        load_janus(str(tmp_path / "janus"), dtype=torch.float32)
    assert "model.language_model.norm.weight" in str(e.value)
    assert "model.generation_head.vision_head.weight: checkpoint (65, 64)" in str(e.value)
    # Lumina-mGPT path: a Chameleon checkpoint without VQ encoder weights loads (generation does not use them)
    tc, _, _ = cham
    tc.model.save_pretrained(tmp_path / "cham")
    f = tmp_path / "cham" / "model.safetensors"
    save_file({k: v for k, v in load_file(f).items() if "vqmodel" not in k}, f, metadata={"format": "pt"})

    class Tok:   # the tiny vocabulary stands in for the tokenizer (only get_vocab is used)
        def get_vocab(self):
            return dict(tc.model.config.vocabulary_map)

    lc, _ = load_lumina_mgpt(str(tmp_path / "cham"), pixels=4 * 32, dtype=torch.float32, tokenizer=Tok())
    assert lc.layout.height == 8          # 128 px: 4 grid units of 32 px, 8 codes of 16 px
    with pytest.raises(ValueError, match="expected a Chameleon"):
        load_lumina_mgpt(str(tmp_path / "janus"), tokenizer=Tok())


def test_eagle_drafter_trains_saves_and_loads(tmp_path, emu3):
    from real.models.eagle import record_features, save_lantern_drafter, train_eagle

    t, _, text = emu3
    e = eagle_for(t, seed=2)
    assert e.vocab_size == V and e.config.hidden_size == t.hidden_size
    proc = Processing(temperature=1.0)
    conds = [_prompt(text, seed=s) for s in range(4)]
    toks = torch.stack([engine.ar_generate(t, c, num_tokens=SIDE * SIDE, processing=proc, seed=s).tokens
                        for s, c in enumerate(conds)])
    feats = [record_features(t, c, toks[i]) for i, c in enumerate(conds)]
    P = conds[0].ids.numel() + len(t.layout.header)
    assert all(f.shape == (1, P + SIDE * SIDE - 1, t.hidden_size) for f in feats)
    log = train_eagle(e, toks, torch.cat(feats), P, steps=30, batch_size=4, lr=3e-3)
    assert log[-1]["loss"] < log[0]["loss"]
    save_lantern_drafter(e, str(tmp_path / "d"))
    e2 = load_adapter_eagle(str(tmp_path / "d"), t)
    g = Processing(temperature=0.0)
    a = engine.speculative_generate(t, e, conds[0], num_tokens=SIDE * SIDE, verifier=rules.greedy(), drafting=3, processing=g)
    b = engine.speculative_generate(t, e2, conds[0], num_tokens=SIDE * SIDE, verifier=rules.greedy(), drafting=3, processing=g)
    assert torch.equal(a.tokens, b.tokens) and [r.accepted for r in a.rounds] == [r.accepted for r in b.rounds]
    with pytest.raises(ValueError, match="does not fit"):
        load_adapter_eagle(str(tmp_path / "d"), tiny_janus_pair(0, side=SIDE, hidden=32, heads=2)[0])


def test_decoders_give_images(janus, emu3):
    for t, dec in ((janus[0], janus_decoder(janus[0].model)), (emu3[0], emu3_decoder(emu3[0].model, emu3[0].layout))):
        img = dec.decode_code(_codes(SIDE * SIDE, 2).view(1, -1))
        assert img.shape == (1, 3, 2 * SIDE, 2 * SIDE) and img.abs().max() <= 1 and torch.isfinite(img).all()
        with pytest.raises(ValueError, match="grid"):
            dec.decode_code(torch.zeros(1, 5, dtype=torch.long))


@pytest.mark.parametrize("model", ["chameleon-tiny", "janus-tiny", "emu3-tiny"])
def test_cli_generate_tiny_families(capsys, model):
    from coolsd.cli import main

    assert main(["generate", "--model", model, "--method", "cool-sd", "--num-tokens", "24", "--json"]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert d["tokens"] == 24 and d["image_tokens"] == 24 and d["rounds"] == d["target_forwards"]
    assert 1.0 <= d["tokens_per_target_call"] <= 5 and d["seconds"] > 0 and d["time_target_s"] > 0
    assert d["accepted_mean"] == pytest.approx(d["tokens_per_target_call"] - 1)
    assert d["processing"]["cfg_scale"] > 1
    assert main(["generate", "--model", model, "--method", "lantern", "--num-tokens", "8"]) == 0
    assert "tokens per target call" in capsys.readouterr().out


def test_gpu_check_lumina_cpu_smoke():
    import os
    import pathlib
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[1]
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_check.sh"), "--lumina", "--cpu-smoke", "--json"],
                       capture_output=True, text=True, cwd=root,
                       env=dict(os.environ, PYTHONPATH=str(root), PYTHON=sys.executable), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "adapter 1 token" in r.stdout and "per-round overhead" in r.stdout
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["grid"] == [8, 8] and d["hf_step_ms"] > 0 and d["vanilla"]["tokens_per_target_call"] >= 1


def test_registry_draft_choices_for_published_models(cham, emu3):
    """The draft options of --model lumina-mgpt / janus-pro / emu3, exercised on tiny adapters (the
    published weights are never needed by tests)."""
    from real.registry import BuildOptions, _build_mm_real, _mm_draft

    for family, (t, _, text) in (("chameleon", cham), ("emu3", emu3)):
        d, name = _mm_draft(BuildOptions(draft="layerskip", draft_layers=1), family, t, None)
        assert type(d) is type(t) and d.layout == t.layout and name == "layerskip 1"
        assert len(d.backbone.layers) == 1
        proc = Processing(temperature=0.0, cfg_scale=2.0)
        cond = _prompt(text, seed=11)
        a = engine.ar_generate(t, cond, num_tokens=10, processing=proc)
        s = engine.speculative_generate(t, d, cond, num_tokens=10, verifier=rules.greedy(), drafting=3, processing=proc)
        assert torch.equal(a.tokens, s.tokens)
        e, name = _mm_draft(BuildOptions(draft="eagle"), family, t, None)
        assert e.needs_features and "untrained" in name
        with pytest.raises(ValueError, match="no smaller sibling"):
            _mm_draft(BuildOptions(draft="small"), family, t, None)
    with pytest.raises(ValueError, match="--prompts"):
        _build_mm_real(BuildOptions(prompts=None), "janus")


@pytest.mark.parametrize("family", ["chameleon", "janus", "emu3"])
def test_tree_levels_with_sk_masks_as_the_tree_engine_drafts(family, cham, janus, emu3):
    """A draft extends a tree level by level: level 1 = two siblings at the code that ends a row (each
    with its own forced row end), level 2 = one child each, with an (S, K) mask over the previous level.
    Every node scores as the chain through its path does; rollback drops both levels."""
    t, _, text = {"chameleon": cham, "janus": janus, "emu3": emu3}[family]
    cond = _prompt(text, seed=12)
    base = _codes(3, 13)
    x1 = torch.tensor([7, 21])
    x2 = torch.tensor([33, 48])
    refs = [_ref_rows(t, family, cond.ids, torch.cat([base, x1[i:i + 1], x2[i:i + 1], torch.tensor([0])]))
            for i in range(2)]
    t.prefill(cond, base.view(1, -1))
    n = t.cache_len
    o1 = t.forward(x1.view(1, -1), position_ids=torch.tensor([n, n]), attn_mask=torch.eye(2, dtype=torch.bool))
    m2 = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.bool)        # (S=2, K=4): previous level + own
    o2 = t.forward(x2.view(1, -1), position_ids=torch.tensor([n + 1, n + 1]), attn_mask=m2)
    for i in range(2):
        assert (o1.logits[0, i] - refs[i][4]).abs().max() < 1e-4
        assert (o2.logits[0, i] - refs[i][5]).abs().max() < 1e-4
    with pytest.raises(ValueError, match=r"\(S, K\)"):
        t.forward(x2.view(1, -1), position_ids=torch.tensor([n + 1, n + 1]), attn_mask=torch.ones(2, 99, dtype=torch.bool))
    t.rollback(4)
    assert t.cache_len == n
    assert (t.forward(torch.cat([x1[1:], x2[1:]]).view(1, -1)).logits[0] - refs[1][4:6]).abs().max() < 1e-4


@pytest.mark.parametrize("family", ["chameleon", "janus", "emu3"])
def test_greedy_tree_engine_equals_greedy(family, cham, janus, emu3):
    from theory.tree import EAGLE_25, Tree

    t, d, text = {"chameleon": cham, "janus": janus, "emu3": emu3}[family]
    cond = _prompt(text, seed=14, neg=family == "emu3")
    proc = Processing(temperature=0.0, cfg_scale=3.0)
    ar = engine.ar_generate(t, cond, num_tokens=SIDE * SIDE, processing=proc)
    for dr in (d, eagle_for(t, seed=3)):
        g = engine.speculative_generate(t, dr, cond, num_tokens=SIDE * SIDE, verifier=rules.greedy(), drafting=Tree(EAGLE_25),
                                 processing=proc)
        assert torch.equal(g.tokens, ar.tokens)
