"""The transformers adapter: a tiny random LlamaForCausalLM as target and draft."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from real.decode import engine
from real.models.eagle import EagleConfig, EagleDrafter
from real.adapters.hf import HFCausalLM
from real.protocol import Prompt
from real.adapters.hf import hf_llama_pair
from real.decode.sampling import Processing
from theory import rules

torch.set_num_threads(1)  # tiny models: threads only contend (see test_real_engine)


@pytest.fixture(scope="module")
def models():
    return hf_llama_pair(seed=0)   # hidden 128, 4 layers, V = 256; draft: its first layer


def test_prefill_block_and_rollback_match_plain_forward(models):
    tgt, _ = models
    m = HFCausalLM(tgt)
    g = torch.Generator().manual_seed(0)
    prompt, toks = torch.randint(0, 256, (5,), generator=g), torch.randint(0, 256, (8,), generator=g)
    with torch.no_grad():
        ref = tgt(torch.cat([prompt, toks]).view(1, -1)).logits.float()[:, 4:]        # rows after prompt, tok_0..7
    a = m.prefill(Prompt(prompt), toks[:3].view(1, -1)).logits
    b = m.forward(toks[3:].view(1, -1)).logits
    got = torch.cat([a, b], 1)
    assert (got - ref).abs().max() < 1e-4
    m.rollback(3)
    assert m.cache_len == 5 + 5
    c = m.forward(toks[5:].view(1, -1)).logits
    assert (c - ref[:, 6:]).abs().max() < 1e-4


def test_cfg_pair_is_left_padded_consistently(models):
    """Rows of a CFG pair with prompts of different lengths equal separate unpadded runs."""
    tgt, _ = models
    m = HFCausalLM(tgt)
    g = torch.Generator().manual_seed(1)
    cond, unc, toks = (torch.randint(0, 256, (n,), generator=g) for n in (6, 2, 4))
    out = torch.cat([m.prefill(Prompt(cond, unc), toks[:2].view(1, -1).expand(2, -1), cfg=True).logits,
                     m.forward(toks[2:].view(1, -1).expand(2, -1)).logits], 1)
    with torch.no_grad():
        rc = tgt(torch.cat([cond, toks]).view(1, -1)).logits.float()[0, 5:]
        ru = tgt(torch.cat([unc, toks]).view(1, -1)).logits.float()[0, 1:]
    assert (out[0] - rc).abs().max() < 1e-4 and (out[1] - ru).abs().max() < 1e-4
    with pytest.raises(ValueError, match="uncond"):
        m.prefill(Prompt(cond), cfg=True)


def test_tree_mask_and_keep(models):
    tgt, _ = models
    m = HFCausalLM(tgt)
    p = torch.tensor([3, 4, 5])
    a, b, c, e = 7, 8, 9, 10
    with torch.no_grad():
        chain = tgt(torch.tensor([[3, 4, 5, a, c, e]])).logits.float()
    m.prefill(Prompt(p))
    n = m.cache_len
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    out = m.forward(torch.tensor([[a, b, c]]), position_ids=torch.tensor([n, n + 1, n + 1]), attn_mask=mask).logits
    assert (out[0, 0] - chain[0, 3]).abs().max() < 1e-4 and (out[0, 2] - chain[0, 4]).abs().max() < 1e-4
    m.keep(torch.tensor([0, 2]))
    assert (m.forward(torch.tensor([[e]])).logits[0, 0] - chain[0, 5]).abs().max() < 1e-4


@pytest.mark.parametrize("cfg_scale", [1.0, 2.0])
def test_greedy_speculative_equals_greedy_with_hf_models(models, cfg_scale):
    tgt, drf = models
    t, d = HFCausalLM(tgt), HFCausalLM(drf)
    cond = Prompt(torch.tensor([1, 2, 3, 4]), torch.tensor([5]))
    proc = Processing(temperature=0.0, cfg_scale=cfg_scale)
    ar = engine.ar_generate(t, cond, num_tokens=40, processing=proc)
    sd = engine.speculative_generate(t, d, cond, num_tokens=40, verifier=rules.greedy(), drafting=4, processing=proc)
    assert torch.equal(sd.tokens, ar.tokens) and sd.stats()["tokens_per_target_call"] > 1.2
    # the same through transformers' own greedy decoding (no cache tricks of ours involved)
    if cfg_scale == 1.0:
        with torch.no_grad():
            hf = tgt.generate(cond.ids.view(1, -1), max_new_tokens=40, do_sample=False)[0, 4:]
        assert torch.equal(hf, ar.tokens)


def test_image_token_slice_and_eagle_on_hf_target(models):
    """A multimodal-style target whose image tokens are ids 64..191: tokens 0..127 map there, logits are
    sliced; an EAGLE drafter drafts through the sliced LM head; greedy equals plain greedy."""
    tgt, drf = models
    ids = torch.arange(64, 192)
    t, d = HFCausalLM(tgt, image_token_ids=ids), HFCausalLM(drf, image_token_ids=ids)
    assert t.vocab_size == 128
    cond = Prompt(torch.tensor([1, 2, 3]))
    o = t.prefill(cond, torch.tensor([[0, 5]]))
    with torch.no_grad():
        ref = tgt(torch.tensor([[1, 2, 3, 64, 69]])).logits.float()[:, 2:, 64:192]
    assert (o.logits - ref).abs().max() < 1e-4
    proc = Processing(temperature=0.0)
    ar = engine.ar_generate(t, cond, num_tokens=24, processing=proc)
    c = tgt.config
    e = EagleDrafter(EagleConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                                 num_attention_heads=c.num_attention_heads, vocab_size=c.vocab_size, block_size=64),
                     tgt.get_output_embeddings(), head_index=ids)
    assert e.vocab_size == 128
    for s in (t, d):
        sd = engine.speculative_generate(t, s if s is d else e, cond, num_tokens=24, verifier=rules.greedy(), drafting=3,
                                         processing=proc)
        assert torch.equal(sd.tokens, ar.tokens)
    with pytest.raises(ValueError, match="vocabularies differ"):
        engine.speculative_generate(t, HFCausalLM(drf), cond, num_tokens=4, verifier=rules.greedy(), drafting=2)


def test_fast_llama_matches_transformers(models):
    """real.models.llama.FastLlama loaded from the same LlamaForCausalLM: same logits as the HF adapter (CFG
    pair with left padding included), same tree/keep behaviour, greedy speculative == greedy."""
    from real.models.llama import FastLlama

    tgt, drf = models
    h, f = HFCausalLM(tgt), FastLlama.from_hf(tgt)
    cond = Prompt(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([9, 8]))
    toks = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(2))
    for cfg in (False, True):
        B = 2 if cfg else 1
        a = torch.cat([h.prefill(cond, toks[:, :2].expand(B, -1), cfg=cfg).logits, h.forward(toks[:, 2:].expand(B, -1)).logits], 1)
        b = torch.cat([f.prefill(cond, toks[:, :2].expand(B, -1), cfg=cfg).logits, f.forward(toks[:, 2:].expand(B, -1)).logits], 1)
        assert (a - b).abs().max() < 1e-4
    f.rollback(2)
    assert (f.forward(toks[:, 4:].expand(2, -1)).logits - b[:, -2:]).abs().max() < 1e-4
    # tree block: siblings b, c after a at equal positions, then keep the branch [a, c]
    with torch.no_grad():
        chain = tgt(torch.tensor([[3, 4, 5, 7, 9, 10]])).logits.float()
    f.prefill(Prompt(torch.tensor([3, 4, 5])))
    n = f.cache_len
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    out = f.forward(torch.tensor([[7, 8, 9]]), position_ids=torch.tensor([n, n + 1, n + 1]), attn_mask=mask).logits
    assert (out[0, 2] - chain[0, 4]).abs().max() < 1e-4
    f.keep(torch.tensor([0, 2]))
    assert (f.forward(torch.tensor([[10]])).logits[0, 0] - chain[0, 5]).abs().max() < 1e-4
    proc = Processing(temperature=0.0, cfg_scale=2.0)
    t, d = FastLlama.from_hf(tgt), FastLlama.from_hf(drf)
    ar = engine.ar_generate(h, cond, num_tokens=40, processing=proc)
    sd = engine.speculative_generate(t, d, cond, num_tokens=40, verifier=rules.greedy(), drafting=4, processing=proc)
    assert torch.equal(sd.tokens, ar.tokens)


def test_fast_llama_batches_ragged_prompts(models):
    """FastLlama keeps per-row cache lengths (real.nn.kvcache.KVCache): three images with prompts of different lengths
    and their CFG rows in one batch. Greedy chain and tree SD at B = 3 give, image by image, the tokens of greedy AR
    through the HF adapter at batch 1 (transformers' own padding and positions); sampled tokens at B = 3 equal B = 1."""
    from real.models.llama import FastLlama
    from theory.tree import EAGLE_25, Tree

    tgt, drf = models
    t, d, h = FastLlama.from_hf(tgt), FastLlama.from_hf(drf), HFCausalLM(tgt)
    conds = [Prompt(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([9, 8])), Prompt(torch.tensor([7, 3]), torch.tensor([9])),
             Prompt(torch.tensor([4, 4, 4, 1]), torch.tensor([2, 9, 8, 7, 6, 5]))]
    greedy = Processing(temperature=0.0, cfg_scale=2.0)
    want = [engine.ar_generate(h, c, num_tokens=24, processing=greedy).tokens for c in conds]
    for drafting in (4, Tree(EAGLE_25)):
        got = engine.generate(t, d, conds, num_tokens=24, verifier=rules.greedy(), drafting=drafting, processing=greedy,
                              batch_size=3)
        assert all(torch.equal(g.tokens, w) for g, w in zip(got, want))
    sampled = dict(num_tokens=24, verifier=rules.cool_sd(2.0), drafting=4, processing=Processing(cfg_scale=2.0), seed=3)
    b3 = engine.generate(t, d, conds, batch_size=3, **sampled)
    b1 = engine.generate(t, d, conds, batch_size=1, **sampled)
    assert all(torch.equal(x.tokens, y.tokens) for x, y in zip(b3, b1))
