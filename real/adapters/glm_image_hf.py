"""GLM-Image (AR stage) on the transformers side: a tiny random ``GlmImageForConditionalGeneration`` for CPU tests, its
prompt builder, transformers' own greedy generation of the codes (the reference), and our stack
(``real.models.glm_image.GlmImageStack``) driven greedily token by token with the same positions.

The tiny config keeps GLM-Image's id layout, scaled down: codes 0..V-1 (LM id = code), image start V, image end V+1
(the LM head's ``vision_vocab_size`` = V + 2 rows), then the text ids: pad, the image placeholder, ``<sop>``,
``<eop>``, the digits 0-9, a space, and ``n_text`` word ids. Its decoder has partial rotary (factor 0.5) and an
uneven ``mrope_section`` so that both are exercised.

The reference suppresses the non-code rows of the head (``suppress_tokens``) while the codes are generated: the
engine scores the codes only (a tiny random model, unlike the checkpoint, has no reason to prefer codes), and greedy
over the codes is then the same choice on both sides. It stops after the h w + H W codes; the pipeline's extra
(+1) token is the image end, which the engine forces.
"""
from __future__ import annotations

import torch

from real.models.glm_image import (
    GlmImageStack,
    GlmLayout,
    glm_image_layout,
    glm_positions,
)

from .imagelm_loading import embedding_dominated_init

__all__ = ["glm_reference_greedy", "stack_greedy", "tiny_glm_ids", "tiny_glm_image", "tiny_glm_prompt"]


def tiny_glm_ids(V: int = 64, n_text: int = 40) -> dict:
    """The tiny config's special ids (module docstring) and its text vocabulary size."""
    ids = {"image_start": V, "image_end": V + 1, "pad": V + 2, "image_token": V + 3, "sop": V + 4, "eop": V + 5,
           "digit0": V + 6, "space": V + 16, "word0": V + 17}
    ids["vocab_size"] = ids["word0"] + n_text
    return ids


def tiny_glm_image(seed: int = 0, *, V: int = 64, layers: int = 3, hidden: int = 64, heads: int = 2,
                   kv_heads: int = 1, inter: int = 128, n_text: int = 40, branch_scale: float = 0.2,
                   dtype=torch.float32):
    """A seeded random ``GlmImageForConditionalGeneration`` small enough for CPU tests (a few ms per token), with an
    embedding-dominated init (``embedding_dominated_init``: a layer-skip draft agrees often). GLM's sandwich norms
    rescale every attention and MLP output to unit RMS, so the residual stream stays embedding-dominated only if
    their weights (``post_self_attn_layernorm``, ``post_mlp_layernorm``) are small: ``branch_scale``. Head dim
    hidden / heads must be a multiple of 8 (partial rotary 0.5, mrope_section over a quarter of it)."""
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration

    ids = tiny_glm_ids(V, n_text)
    hd = hidden // heads
    if hd % 8:
        raise ValueError(f"head dim {hd} must be a multiple of 8")
    q = hd // 4                                           # rotary frequencies: rotary dim hd / 2, halved
    section = [q - 2 * (q // 3), q // 3, q // 3]          # uneven, like the checkpoint's [8, 12, 12]
    cfg = GlmImageConfig(
        text_config=dict(vocab_size=ids["vocab_size"], hidden_size=hidden, intermediate_size=inter,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         vision_vocab_size=V + 2, pad_token_id=ids["pad"], eos_token_id=ids["image_end"],
                         max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "partial_rotary_factor": 0.5, "mrope_section": section}),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, image_size=32, patch_size=16),
        vq_config=dict(embed_dim=16, num_embeddings=V, latent_channels=32),
        image_token_id=ids["image_token"], image_start_token_id=ids["image_start"],
        image_end_token_id=ids["image_end"])
    torch.manual_seed(seed)
    m = GlmImageForConditionalGeneration(cfg).eval()
    embedding_dominated_init(m, seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("post_self_attn_layernorm.weight", "post_mlp_layernorm.weight")):
                p.fill_(branch_scale)
    return m.to(dtype)


def tiny_glm_prompt(grids=((4, 4), (2, 2)), *, n_words: int = 5, seed: int = 0, V: int = 64,
                    n_text: int = 40) -> tuple[torch.Tensor, GlmLayout]:
    """A tiny text-to-image prompt: ``n_words`` seeded word ids, then the processor's size tag
    ``<sop>H W<eop><sop>h w<eop>`` (digits one id each) and the image start. ``grids`` as the processor lists them
    (target (H, W), then prior (h, w)). Returns (prompt ids (P,), the ``GlmLayout``)."""
    ids = tiny_glm_ids(V, n_text)
    g = torch.Generator().manual_seed(seed)
    words = (ids["word0"] + torch.randint(0, n_text, (n_words,), generator=g)).tolist()

    def num(n):
        return [ids["digit0"] + int(d) for d in str(int(n))]
    tag = []
    for h, w in grids:
        tag += [ids["sop"], *num(h), ids["space"], *num(w), ids["eop"]]
    lay = glm_image_layout(grids, size_ids=tuple(tag), image_start=ids["image_start"], image_end=ids["image_end"])
    return torch.tensor(words + list(lay.header)), lay


@torch.no_grad()
def glm_reference_greedy(model, prompt_ids: torch.Tensor, grids, *, codes_only: bool = True) -> torch.Tensor:
    """The codes (T,) that transformers' own ``model.generate`` writes greedily (do_sample=False) for one prompt
    (``prompt_ids`` (P,), ending with the image start), ``grids`` as the processor's ``image_grid_thw`` lists them
    ((H, W) then (h, w)): T = the sum of h w. With ``codes_only`` the non-code rows of the head are suppressed
    (module docstring). ValueError if generation stops early or writes a non-code id."""
    V = int(model.config.vq_config.num_embeddings)
    nv = int(model.lm_head.weight.shape[0])
    ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(1, -1).to(model.device)
    thw = torch.tensor([[1, int(h), int(w)] for h, w in grids], device=model.device)
    T = sum(int(h) * int(w) for h, w in grids)
    kw = {"suppress_tokens": list(range(V, nv))} if codes_only and nv > V else {}
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), image_grid_thw=thw,
                         images_per_sample=torch.tensor([len(grids)], device=model.device),
                         max_new_tokens=T, do_sample=False, **kw)
    codes = out[0, ids.shape[1]:].cpu()
    if codes.numel() != T or bool((codes >= V).any()):
        raise ValueError(f"generate wrote {codes.numel()} ids (expected {T} codes < {V}): {codes.tolist()}")
    return codes


@torch.no_grad()
def stack_greedy(stack: GlmImageStack, prompt_ids: torch.Tensor, layout: GlmLayout, *,
                 position_fn=None) -> torch.Tensor:
    """Our stack driven greedily: prefill the prompts ``prompt_ids`` (R, P) (or (P,)) at positions 0..P-1 on every
    axis, then feed each argmax code (one token per step) at ``glm_positions`` (``position_fn(base, ci)`` overrides
    them: a negative control). Returns the codes (R, T) ((T,) for a 1-D prompt)."""
    ids = torch.as_tensor(prompt_ids, dtype=torch.long)
    one = ids.ndim == 1
    ids = ids.reshape(-1, ids.shape[-1]).to(stack.device)
    R, P = ids.shape
    T = layout.num_tokens
    pos_of = position_fn or (lambda b, ci: glm_positions(b, ci, grids=layout.grids))
    cache = stack.new_cache(R, P + T)
    base = torch.full((R,), P, dtype=torch.long, device=stack.device)

    def step(x, pos):
        mask = cache.begin(x.shape[1])
        h = stack.run(stack.embed(x), pos, mask, cache)
        cache.commit()
        return stack.head(h[:, -1]).argmax(-1)
    code = step(ids, torch.arange(P, device=stack.device)[None, :, None].expand(R, P, 3))
    codes = [code]
    for k in range(T - 1):          # a loop over the image's codes
        ci = torch.full((R, 1), k, dtype=torch.long, device=stack.device)
        code = step(code[:, None], pos_of(base, ci).to(stack.device))
        codes.append(code)
    out = torch.stack(codes, 1).cpu()
    return out[0] if one else out
