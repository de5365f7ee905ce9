"""GLM-Image's AR stage (real.models.glm_image, real.adapters.glm_image_hf) against transformers on a tiny random
config: the positions transformers computes, the stack's logits (prefill, one-token steps, a multi-token block) with
a perturbed-position negative control, transformers' own greedy generation vs our stack driven greedily, the grids
of the processor and the layout."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from real.adapters.glm_image_hf import (
    glm_reference_greedy,
    stack_greedy,
    tiny_glm_image,
    tiny_glm_prompt,
)
from real.adapters.image_layout import ImageLayout
from real.models.glm_image import (
    GLM_DIFFUSION_OPTIONS,
    GlmImageStack,
    glm_grids,
    glm_image_layout,
    glm_positions,
)

torch.set_num_threads(1)

V = 64
GRIDS = ((4, 4), (2, 2))          # as the processor lists them: target (H, W), then prior (h, w)


@pytest.fixture(scope="module")
def tiny():
    m = tiny_glm_image(0, V=V)
    return m, GlmImageStack.from_hf(m)


def _rope_index(model, prompts, grids, attention_mask=None):
    """transformers' prompt positions (3, B, P) and its decode table (B, 3, L) for text-to-image prompts (B, P)."""
    B = prompts.shape[0]
    thw = torch.tensor([[1, h, w] for h, w in grids] * B)
    pos, _ = model.model.get_rope_index(prompts, image_grid_thw=thw,
                                        images_per_sample=torch.tensor([len(grids)] * B),
                                        attention_mask=attention_mask)
    return pos, model.model._cached_decode_position_ids


def test_positions_match_transformers(tiny):
    model, _ = tiny
    for grids in (GRIDS, ((3, 5), (2, 3)), ((5, 2),)):
        p, lay = tiny_glm_prompt(grids)
        p2, _ = tiny_glm_prompt(grids, n_words=8, seed=1)
        P = p2.numel()
        rows = torch.full((2, P), 66, dtype=torch.long)          # row 0 left-padded by 3
        rows[0, P - p.numel():], rows[1] = p, p2
        am = torch.ones(2, P, dtype=torch.long)
        am[0, :P - p.numel()] = 0
        pos, table = _rope_index(model, rows, grids, am)
        assert torch.equal(pos[:, 1], torch.arange(P).expand(3, P))           # prompt: t = h = w = index
        assert torch.equal(pos[:, 0, P - p.numel():], torch.arange(p.numel()).expand(3, -1))
        L = table.shape[-1]
        assert L == lay.num_tokens + 1                                     # the codes, then the end marker
        ci = torch.arange(L + 3).expand(2, -1)                             # past the end: replicated end marker
        base = am.sum(1)
        ours = glm_positions(base, ci, torch.zeros_like(ci, dtype=torch.bool), grids=lay.grids)
        ref = torch.cat([table, table[..., -1:].expand(-1, -1, 3)], -1).permute(0, 2, 1)
        assert torch.equal(ours, ref)
        assert not torch.equal(glm_positions(base + 1, ci, grids=lay.grids), ref)   # control: the base matters
    with pytest.raises(ValueError, match="no structural token"):
        glm_positions(torch.tensor([5]), torch.tensor([[0, 1]]), torch.tensor([[False, True]]), grids=((2, 2),))


def _hf_logits(model, ids, pos):
    """transformers' code logits (B, L, V) of one full forward over ids (B, L) at positions (B, L, 3)."""
    out = model(input_ids=ids, position_ids=pos.permute(2, 0, 1))
    return out.logits[..., :V].float()


def _ours(stack, ids, pos, P, steps, block):
    """Our logits (B, P + steps + block, V): prefill P entries, ``steps`` one-token forwards, one block."""
    cache = stack.new_cache(ids.shape[0], ids.shape[1])
    outs, s = [], 0
    for n in [P] + [1] * steps + [block]:
        mask = cache.begin(n)
        h = stack.run(stack.embed(ids[:, s:s + n]), pos[:, s:s + n], mask, cache)
        cache.commit()
        outs.append(stack.head(h))
        s += n
    return torch.cat(outs, 1)


def _model(tiny, branch_scale):
    """The module's tiny model (draft-friendly, ``branch_scale`` 0.2) or one whose layers weigh as much as the
    embeddings (1.0), where positions move the logits by far more than the tolerance (the negative controls)."""
    if branch_scale == 0.2:
        return tiny
    model = tiny_glm_image(0, V=V, branch_scale=branch_scale)
    return model, GlmImageStack.from_hf(model)


@torch.no_grad()
@pytest.mark.parametrize("branch_scale", [0.2, 1.0])
def test_stack_logits_equal_transformers(tiny, branch_scale):
    model, stack = _model(tiny, branch_scale)
    p0, lay = tiny_glm_prompt(GRIDS)
    p1, _ = tiny_glm_prompt(GRIDS, seed=3)
    prompts = torch.stack([p0, p1])
    P = prompts.shape[1]
    ppos, table = _rope_index(model, prompts, GRIDS)
    steps, block = 3, 4                       # codes 0..2 one at a time, then 3..6 (across the prior/target seam)
    n = steps + block
    codes = torch.randint(0, V, (2, n), generator=torch.Generator().manual_seed(0))
    ids = torch.cat([prompts, codes], 1)
    pos = torch.cat([ppos.permute(1, 2, 0), table[:, :, :n].permute(0, 2, 1)], 1)      # (B, P + n, 3)
    assert torch.equal(pos[:, P:], glm_positions(torch.full((2,), P), torch.arange(n).expand(2, -1),
                                                 grids=lay.grids))
    ref = _hf_logits(model, ids, pos)
    ours = _ours(stack, ids, pos, P, steps, block)
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    err = (ours - ref).abs().max().item()
    assert err < 1e-4, err
    if branch_scale != 1.0:
        return
    # negative control: one code's height position off by one changes the logits from there on
    bad = pos.clone()
    bad[:, P + 1, 1] += 1
    worse = _ours(stack, ids, bad, P, steps, block)
    assert (worse[:, :P + 1] - ref[:, :P + 1]).abs().max() < 1e-4
    assert (worse[:, P + 1:] - ref[:, P + 1:]).abs().max() > 1e-3
    # and 1-D positions (the cache slot on every axis) are not GLM's
    flat = torch.arange(P + n).expand(2, -1)[..., None].expand(-1, -1, 3)
    assert (_ours(stack, ids, flat, P, steps, block) - ref).abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("branch_scale", [0.2, 1.0])
def test_greedy_codes_equal_transformers_generate(tiny, branch_scale):
    model, stack = _model(tiny, branch_scale)
    for seed, grids in ((0, GRIDS), (1, ((6, 4), (3, 2)))):
        p, lay = tiny_glm_prompt(grids, seed=seed)
        ref = glm_reference_greedy(model, p, grids)
        assert ref.shape == (lay.num_tokens,) and len(set(ref.tolist())) >= 3      # not one repeated code
        ours = stack_greedy(stack, p, lay)
        assert torch.equal(ours, ref), (ours.tolist(), ref.tolist())
        if branch_scale == 1.0:          # negative control: 1-D positions change the greedy codes
            flat = stack_greedy(stack, p, lay, position_fn=lambda b, ci: (b[:, None] + ci)[..., None].expand(-1, -1, 3))
            assert not torch.equal(flat, ref)
    p0, lay = tiny_glm_prompt(GRIDS)
    two = stack_greedy(stack, torch.stack([p0, tiny_glm_prompt(GRIDS, seed=2)[0]]), lay)
    assert torch.equal(two[0], stack_greedy(stack, p0, lay))                          # rows independent


def test_layer_skip_shares_weights(tiny):
    _, stack = tiny
    d = stack.layer_skip(1)
    assert d.n_layers == 1 and stack.n_layers == 3 and len(stack.layers) == 3
    assert d.layers[0] is stack.layers[0] and d.embed_tokens is stack.embed_tokens and d.head_weight is stack.head_weight
    p, lay = tiny_glm_prompt(GRIDS)
    a, b = stack_greedy(stack, p, lay), stack_greedy(d, p, lay)
    assert not torch.equal(a, b)          # a shallower stack is a different model...
    with pytest.raises(ValueError):
        stack.layer_skip(4)


def test_grids_match_processor():
    from transformers import GlmImageProcessor
    for h, w in ((1152, 768), (1024, 1024), (768, 1344), (2048, 1024), (33, 700)):
        th, tw, ph, pw = GlmImageProcessor._get_target_shape(None, height=h, width=w)
        assert glm_grids(h, w) == ((ph, pw), (th, tw))
    assert glm_grids(1152, 768) == ((19, 13), (36, 24))
    with pytest.raises(ValueError):
        glm_grids(16, 768)


def test_layout():
    lay = glm_image_layout(((3, 5), (2, 3)), size_ids=(7, 8), image_start=64, image_end=65)
    assert lay.grids == ((2, 3), (3, 5)) and lay.header == (7, 8, 64) and lay.trailer == (65,)
    assert lay.num_tokens == 6 + 15
    codes = torch.arange(21)
    assert torch.equal(lay.target_codes(codes), torch.arange(6, 21).view(3, 5))
    il = ImageLayout(**lay.image_layout_args())
    seq = il.sequence(codes)
    assert seq.tolist() == [7, 8, 64, *range(21), 65]
    il.check(seq, torch.arange(V))
    with pytest.raises(ValueError):
        il.check(seq[:-1], torch.arange(V))
    assert "guidance_scale" in GLM_DIFFUSION_OPTIONS and "height" not in GLM_DIFFUSION_OPTIONS


@torch.no_grad()
def test_ragged_rows_equal_solo_rows(tiny):
    """Rows at different cache lengths (a per-row rollback) score a block as each row alone does."""
    _, stack = tiny
    p0, lay = tiny_glm_prompt(GRIDS)
    p1, _ = tiny_glm_prompt(GRIDS, seed=4)
    P = p0.numel()
    codes = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(1))

    def pos(ci, r):
        return glm_positions(torch.tensor([P] * r), ci, grids=lay.grids)

    def feed(cache, x, ps):
        mask = cache.begin(x.shape[1])
        h = stack.run(stack.embed(x), ps, mask, cache)
        cache.commit()
        return stack.head(h)
    ppos = torch.arange(P)[None, :, None].expand(2, P, 3)
    cache = stack.new_cache(2, P + 8)
    feed(cache, torch.stack([p0, p1]), ppos)
    feed(cache, codes[:, :3], pos(torch.arange(3).expand(2, -1), 2))
    cache.rollback([0, 2])                                     # row 0 holds codes 0..2, row 1 code 0
    ci = torch.stack([torch.arange(3, 5), torch.arange(1, 3)])
    block = torch.stack([codes[0, 3:5], codes[1, 1:3]])
    got = feed(cache, block, pos(ci, 2))
    for r, (p, n) in enumerate(((p0, 5), (p1, 3))):            # each row alone, in one pass
        solo = stack.new_cache(1, P + 8)
        ids = torch.cat([p, codes[r, :n]])[None]
        ps = torch.cat([ppos[:1], pos(torch.arange(n)[None], 1)], 1)
        want = feed(solo, ids, ps)[:, -2:]
        assert (got[r] - want[0]).abs().max() < 1e-5
    assert (got[0] - got[1]).abs().max() > 1e-3                 # control: the rows differ
