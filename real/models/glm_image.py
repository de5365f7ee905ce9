"""GLM-Image's autoregressive stage (transformers ``GlmImageForConditionalGeneration``) as a decoder stack over our
static per-row ``KVCache``, with the index arithmetic of its image token stream.

Facts, read from transformers 5.24 (``models/glm_image``: modeling, processing, configuration) and from the
diffusers ``GlmImagePipeline`` that drives its ``generate``; checked on a tiny random config by
tests/test_glm_image.py (stack logits vs transformers', greedy codes vs ``model.generate``):

Decoder (``GlmImageTextModel``, GLM-4 style). Per layer: x + post_self_attn_norm(attn(input_norm(x))), then
x + post_mlp_norm(mlp(post_attention_norm(x))) (four RMSNorms, float32 statistics); q/k/v projections with biases
(``attention_bias``, default True), o projection without; grouped-query attention scaled by head_dim^-0.5; MLP one
fused ``gate_up_proj`` (gate first, then up), SiLU, ``down_proj``, no biases; final RMSNorm. RoPE: default type
only, ``partial_rotary_factor`` (rotary dim rd = head_dim x factor; the last head_dim - rd channels pass through),
half-split pairs (``rotate_half``), and M-RoPE: the rd/2 frequencies are cut into ``mrope_section`` chunks (default
[8, 12, 12]); chunk i turns with position axis i % 3 (temporal, height, width).

Vocabulary. The LM head has ``vision_vocab_size`` rows (16512) only: ids 0..16383 are the VQ codes (code k IS LM
id k, embedded through the ordinary ``embed_tokens``; V = ``vq_config.num_embeddings``), 16384 =
``image_start_token_id``, 16385 = ``image_end_token_id`` (also the text config's eos). Text ids live above 16512
(the embedding has ``vocab_size`` = 168064 rows). The image vocabulary is the slice [0, V) of the head.

Prompt and header (``GlmImageProcessor``, text-to-image). The processor appends to the chat-templated text
``<sop>{H} {W}<eop><sop>{h} {w}<eop>`` and the tokenizer's bos token, which ``get_rope_index`` documents as the
image start token that opens generation. (H, W) = (target_h // 32, target_w // 32) is the target grid (default
1152 x 768 px -> 36 x 24); (h, w) = (int(sqrt(H / W) * 16), int(sqrt(W / H) * 16)) is a small prior grid of about
256 codes (``glm_grids``). The processor's ``image_grid_thw`` lists [1, H, W] then [1, h, w]; image-to-image lists
the source images' grids then only [1, H, W] (no prior grid) and puts the size tag once.

Two-stage token budget (``get_rope_index``: the decode grids are taken from the last one backwards; the pipeline's
``_compute_generation_params``). Generation produces h * w codes of the prior grid FIRST, then H * W codes of the
target grid, then one more token (``max_new_tokens`` = h w + H W + 1, "the +1 is for EOS"); the pipeline keeps
the H * W target codes only (offset h * w) and upsamples them 2x (nearest) as the DiT's prior tokens. No
structural token lies inside the code stream (no row ends, nothing between the two grids): the engine's code
stream is the h w + H W codes; the end token follows the last code.

Positions (3 axes). Prompt tokens (text-to-image: no complete image in the prompt) get t = h = w = their index
0..P-1 (left padding excluded: positions count the row's real tokens). With base = P (the real prompt length),
code k < h w of the prior grid (row r = k // w, column c = k % w) sits at (base, base + r, base + c); the target
grid starts at base2 = base + max(h, w) and its code j = k - h w sits at (base2, base2 + j // W, base2 + j % W);
the end marker (the entry after the last code) at (e, e, e), e = base2 + max(H, W). transformers pads the table by
repeating its last column, so any entry past the end also sits at (e, e, e) (``glm_positions``).

CFG. The AR stage has none: the pipeline calls ``generate(**inputs, max_new_tokens=..., do_sample=True)`` (its
comment: greedy decoding may repeat), no ``guidance_scale`` and no unconditional row; the pipeline's
``guidance_scale`` (default 1.5) is the DiT's classifier-free guidance with an empty glyph prompt. An engine that
adds CFG to the AR stage departs from GLM-Image's own generation.

End of image. ``image_end_token_id`` (16385) is the eos of the generation config; generation stops there or after
``max_new_tokens``. The engine forces it after code h w + H w - 1 (``GlmLayout.trailer``) and never scores it.

Options of the diffusion stage (``GlmImagePipeline.__call__`` arguments that never reach the AR ``generate``):
``GLM_DIFFUSION_OPTIONS``. ``height`` / ``width`` (the grids), ``image`` (image-to-image) and the prompt do reach it.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from real.nn.devpath import to_device
from real.nn.kvcache import KVCache
from real.nn.layers import RMSNorm, gqa_heads, linear, rms_norm, rope_qkv
from real.models.llama import rope_parameters
from real.protocol import Placed

__all__ = ["GLM_DIFFUSION_OPTIONS", "GlmImageStack", "GlmLayout", "glm_grids", "glm_image_layout", "glm_positions"]

# GlmImagePipeline arguments that belong to the diffusion decoder (DiT, VAE, glyph encoder) alone
GLM_DIFFUSION_OPTIONS = ("guidance_scale", "num_inference_steps", "timesteps", "sigmas", "latents",
                         "prompt_embeds", "negative_prompt_embeds", "prior_token_ids", "prior_image_token_ids",
                         "crops_coords_top_left", "output_type", "max_sequence_length", "attention_kwargs",
                         "callback_on_step_end", "callback_on_step_end_tensor_inputs", "num_images_per_prompt")


def glm_grids(height: int = 1152, width: int = 768, factor: int = 32) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (prior, target) code grids ((h, w), (H, W)) of a ``height`` x ``width`` px text-to-image request, with
    GlmImageProcessor's arithmetic: H, W = the pixel sizes floored to ``factor`` over ``factor``; the prior grid keeps
    the aspect ratio at about (factor / 2)^2 codes."""
    H, W = height // factor, width // factor
    if H < 1 or W < 1:
        raise ValueError(f"an image of {height} x {width} px has no {factor}-px code grid")
    r = H / W
    return (int(math.sqrt(r) * (factor // 2)), int(math.sqrt(1 / r) * (factor // 2))), (H, W)


@dataclass(frozen=True)
class GlmLayout:
    """One GLM-Image generation in the LM's id space: ``header`` ids close the prompt (size tags, image start);
    ``grids`` the code grids in generation order ((h, w) prior, (H, W) target; image-to-image: the target alone);
    ``trailer`` follows the last code (the image end). ``real.adapters.image_layout.ImageLayout`` holds one grid with
    optional row ends; GLM needs two grids of different widths, but neither has row ends, so the stream the engine
    feeds is one run of ``num_tokens`` codes (``image_layout_args``: 1 x num_tokens) and only the RoPE positions
    (``positions``) and the split into grids (``target_codes``) know the grids."""
    grids: tuple[tuple[int, int], ...]
    header: tuple[int, ...] = ()
    trailer: tuple[int, ...] = ()

    def __post_init__(self):
        if not self.grids or any(h < 1 or w < 1 for h, w in self.grids):
            raise ValueError(f"GLM-Image needs one or two grids of at least 1 x 1, got {self.grids}")

    @property
    def num_tokens(self) -> int:
        """Codes per image: the sum of the grids' h * w."""
        return sum(h * w for h, w in self.grids)

    def image_layout_args(self) -> dict:
        """Keyword arguments of the engine's view as a ``real.adapters.image_layout.ImageLayout``: 1 x num_tokens,
        no row ends, this header and trailer."""
        return dict(height=1, width=self.num_tokens, row_end=None, header=self.header, trailer=self.trailer)

    def target_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (..., num_tokens) -> the last grid's codes (..., H, W), what the pipeline hands to its DiT."""
        H, W = self.grids[-1]
        return codes[..., self.num_tokens - H * W:].reshape(*codes.shape[:-1], H, W)


def glm_image_layout(grids, *, size_ids: tuple[int, ...] = (), image_start: int = 16384,
                     image_end: int = 16385) -> GlmLayout:
    """The layout of one generation: ``size_ids`` the tokenized ``<sop>H W<eop>[<sop>h w<eop>]`` tag (tokenizer
    specific: the caller tokenizes it), then ``image_start``; ``grids`` as the processor's ``image_grid_thw`` lists
    them ((H, W), (h, w): reversed here into generation order, prior first); ``image_end`` the trailer."""
    g = tuple((int(h), int(w)) for h, w in grids)
    return GlmLayout(g[::-1], tuple(int(x) for x in size_ids) + (int(image_start),), (int(image_end),))


def glm_positions(base, ci, forced=None, *, grids) -> torch.Tensor:
    """RoPE positions (R, S, 3) (temporal, height, width) of image-stream entries: ``base`` (R,) int64 the first
    position after each row's prompt (text-to-image: its real prompt length; image-to-image: where transformers'
    ``get_rope_index`` ends, the source images there counting max(h, w) positions each), ``ci`` (R, S) int64 the index of each entry's code in the flattened code stream (the
    grids of ``grids`` in generation order, (h, w) tuples), ``forced`` (R, S) bool or None. GLM-Image has no forced
    structural token inside its code stream, so ``forced`` must be all False (ValueError otherwise); an index past the
    last code (the image end, or anything after it) gets the end marker's position, as transformers' padded table."""
    ci = torch.as_tensor(ci, dtype=torch.long)
    base = torch.as_tensor(base, dtype=torch.long, device=ci.device).reshape(-1, 1)
    if forced is not None and bool(torch.as_tensor(forced).any()):
        raise ValueError("GLM-Image forces no structural token inside its code stream (no row ends)")
    if (ci < 0).any():
        raise ValueError("code indices must be >= 0")
    t = torch.empty_like(ci)
    hh, ww = torch.empty_like(ci), torch.empty_like(ci)
    start, off = 0, torch.zeros_like(ci)                       # first code of the grid, its position offset
    for h, w in grids:                                         # a loop over the (at most two) grids
        inside = (ci >= start) & (ci < start + h * w)
        j = (ci - start).clamp(min=0)
        t = torch.where(inside, off, t)
        hh = torch.where(inside, off + j // w, hh)
        ww = torch.where(inside, off + j % w, ww)
        start, off = start + h * w, off + max(h, w)
    past = ci >= start                                         # the end marker (and the padding after it)
    t, hh, ww = (torch.where(past, off, x) for x in (t, hh, ww))
    return torch.stack([t, hh, ww], -1) + base[..., None]


def _interleave_rotary(w: torch.Tensor, heads: int, hd: int, rd: int) -> torch.Tensor:
    """q or k projection rows (heads hd, ...) reordered within each head: the first ``rd`` rows from half-split
    RoPE pairs (j, j + rd/2) to interleaved pairs (2j, 2j + 1) (``real.nn.layers.apply_rope``'s complex product); the
    pass-through rows [rd, hd) stay. q and k get the same permutation, so q . k is unchanged."""
    perm = torch.cat([torch.arange(rd).view(2, rd // 2).t().reshape(-1), torch.arange(rd, hd)])
    return w.view(heads, hd, *w.shape[1:])[:, perm].reshape(w.shape)


class _GlmLayer(nn.Module):
    """One GLM-Image decoder layer: fused qkv (q and k rotary rows interleaved), o, fused gate_up, down, and the four
    RMSNorms of the sandwich (``ln_in`` before attention, ``ln_attn`` after it, ``ln_mlp_in`` / ``ln_mlp_out``)."""

    def __init__(self, D, inter, nh, nkv, hd, eps, attn_bias):
        super().__init__()
        self.nh, self.nkv = nh, nkv
        self.qkv = nn.Linear(D, (nh + 2 * nkv) * hd, bias=attn_bias)
        self.o = nn.Linear(nh * hd, D, bias=False)
        self.gate_up = nn.Linear(D, 2 * inter, bias=False)
        self.down = nn.Linear(inter, D, bias=False)
        self.ln_in, self.ln_attn, self.ln_mlp_in, self.ln_mlp_out = (RMSNorm(D, eps) for _ in range(4))

    def forward(self, x, rot, mask, cache: KVCache, i: int):
        """x (R, S, D), rot (R, S, hd/2) complex, mask (R or 1, 1, S, K) bool or None, ``cache`` layer i -> (R, S, D)."""
        q, k, v = rope_qkv(linear(rms_norm(x, self.ln_in.weight, self.ln_in.eps), self.qkv.weight, self.qkv.bias),
                           rot, self.nh, self.nkv)
        k, v = cache.update(i, k, v)
        a = linear(gqa_heads(q, k, v, mask), self.o.weight)
        x = x + rms_norm(a, self.ln_attn.weight, self.ln_attn.eps)
        g, u = linear(rms_norm(x, self.ln_mlp_in.weight, self.ln_mlp_in.eps), self.gate_up.weight).chunk(2, -1)
        return x + rms_norm(linear(F.silu(g) * u, self.down.weight), self.ln_mlp_out.weight, self.ln_mlp_out.eps)


class GlmImageStack(Placed, nn.Module):
    """GLM-Image's text decoder over our ``KVCache`` (module docstring): ``embed`` LM ids, ``run`` a block at 3-axis
    positions, ``head`` to the V code logits. ``code_ids`` (V,) = 0..V-1 (code k is LM id k)."""
    rope_axes = 3
    _placed_by = "embed_tokens.weight"

    def __init__(self, text_config, n_codes: int):
        """``text_config``: a transformers ``GlmImageTextConfig`` (default RoPE type and SiLU only, others raise
        NotImplementedError); ``n_codes``: V, the VQ codebook size. Weights are default-initialised (``from_hf``)."""
        super().__init__()
        c = text_config
        rp = dict(rope_parameters(c, "GlmImageStack"))     # the ports' one config check (default RoPE, SiLU)
        self.hidden_size = c.hidden_size
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.n_kv = c.num_key_value_heads or c.num_attention_heads
        self.n_heads = c.num_attention_heads
        self.n_layers = c.num_hidden_layers
        self.rotary_dim = int(self.head_dim * rp.get("partial_rotary_factor", 1.0))
        sec = list(rp.get("mrope_section", [8, 12, 12]))       # transformers' default when the config has none
        if sum(sec) != self.rotary_dim // 2:
            raise ValueError(f"mrope_section {sec} must sum to rotary_dim / 2 = {self.rotary_dim // 2}")
        # the position axis (0 temporal, 1 height, 2 width) of each rotary frequency
        self.freq_axis = torch.cat([torch.full((n,), i % 3, dtype=torch.long) for i, n in enumerate(sec)])
        self.inv_freq = 1.0 / (rp.get("rope_theta", 10000.0)
                               ** (torch.arange(0, self.rotary_dim, 2).float() / self.rotary_dim))
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(_GlmLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, self.n_kv,
                                              self.head_dim, c.rms_norm_eps, bool(getattr(c, "attention_bias", True)))
                                    for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.head_weight = nn.Parameter(torch.zeros(n_codes, c.hidden_size))    # the code rows of the LM head
        self.code_ids = torch.arange(n_codes)

    @classmethod
    def from_hf(cls, model) -> GlmImageStack:
        """Copy the AR-stage weights of a transformers ``GlmImageForConditionalGeneration`` (same device and dtype)."""
        lm = model.model.language_model
        V = int(model.config.vq_config.num_embeddings)
        if model.lm_head.weight.shape[0] < V:
            raise ValueError(f"LM head has {model.lm_head.weight.shape[0]} rows, fewer than the {V} codes")
        m = cls(lm.config, V)
        src = lm.state_dict()
        hd, rd = m.head_dim, m.rotary_dim
        sd = {"embed_tokens.weight": src["embed_tokens.weight"], "norm.weight": src["norm.weight"],
              "head_weight": model.lm_head.weight[:V]}
        norms = {"ln_in": "input_layernorm", "ln_attn": "post_self_attn_layernorm",
                 "ln_mlp_in": "post_attention_layernorm", "ln_mlp_out": "post_mlp_layernorm"}
        for i in range(m.n_layers):
            p = f"layers.{i}."
            for kind in ("weight", "bias"):
                if p + f"self_attn.q_proj.{kind}" not in src:
                    continue
                q = _interleave_rotary(src[p + f"self_attn.q_proj.{kind}"], m.n_heads, hd, rd)
                k = _interleave_rotary(src[p + f"self_attn.k_proj.{kind}"], m.n_kv, hd, rd)
                sd[p + f"qkv.{kind}"] = torch.cat([q, k, src[p + f"self_attn.v_proj.{kind}"]])
            sd[p + "o.weight"] = src[p + "self_attn.o_proj.weight"]
            sd[p + "gate_up.weight"] = src[p + "mlp.gate_up_proj.weight"]
            sd[p + "down.weight"] = src[p + "mlp.down_proj.weight"]
            for ours, theirs in norms.items():
                sd[p + ours + ".weight"] = src[p + theirs + ".weight"]
        m.load_state_dict(sd, strict=True)
        w = model.lm_head.weight
        m = m.to(device=w.device, dtype=w.dtype).eval()
        m.inv_freq = lm.rotary_emb.inv_freq.detach().float().to(w.device)   # the model's own frequencies
        m.freq_axis, m.code_ids = m.freq_axis.to(w.device), m.code_ids.to(w.device)
        return m

    def layer_skip(self, n: int) -> GlmImageStack:
        """A layer-skip draft: a shallow copy running only the first ``n`` decoder layers; every weight (embeddings,
        layers, final norm, head) is shared with this stack, not copied."""
        if not 1 <= n <= self.n_layers:
            raise ValueError(f"layer_skip needs 1 <= n <= {self.n_layers}, got {n}")
        d = copy.copy(self)
        d._modules = dict(self._modules)
        d.layers = nn.ModuleList(list(self.layers)[:n])
        d.n_layers = n
        return d

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """LM ids (R, S) int64 -> input embeddings (R, S, D) (codes are LM ids 0..V-1)."""
        return F.embedding(ids, self.embed_tokens.weight)

    def rotations(self, pos: torch.Tensor) -> torch.Tensor:
        """pos (R, S, 3) int64 -> (R, S, head_dim/2) complex rotations: pair j < rotary_dim/2 turns by
        pos[freq_axis[j]] x inv_freq[j] (float32, transformers' arithmetic), the pass-through pairs by 1."""
        dev = pos.device
        if self.inv_freq.device != dev:
            self.inv_freq, self.freq_axis = self.inv_freq.to(dev), self.freq_axis.to(dev)
        ang = pos.float()[..., self.freq_axis] * self.inv_freq
        rot = torch.polar(torch.ones_like(ang), ang)
        extra = self.head_dim // 2 - ang.shape[-1]
        if extra:
            rot = torch.cat([rot, torch.ones(*ang.shape[:-1], extra, dtype=rot.dtype, device=dev)], -1)
        return rot

    def run(self, h: torch.Tensor, pos, mask: torch.Tensor | None, cache: KVCache) -> torch.Tensor:
        """A block h (R, S, D) at positions pos (R, S, 3) under ``mask`` ((R or 1, 1, S, K) bool over the keys
        ``cache.update`` returns, or None: all visible) -> post-final-norm hidden states (R, S, D). The caller has
        called ``cache.begin(S, ...)`` and calls ``cache.commit()`` after."""
        if tuple(pos.shape) != (*h.shape[:2], 3):
            raise ValueError(f"pos must be {(*h.shape[:2], 3)}, got {tuple(pos.shape)}")
        rot = self.rotations(to_device(pos, self.device) if isinstance(pos, np.ndarray) else pos.to(self.device))
        for i, layer in enumerate(self.layers):   # a loop over decoder layers
            h = layer.forward(h, rot, mask, cache, i)
        return rms_norm(h, self.norm.weight, self.norm.eps)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Post-norm hidden states (..., D) -> float32 logits (..., V) over the image codes."""
        return linear(hidden, self.head_weight).float()

    def new_cache(self, rows: int, max_len: int) -> KVCache:
        """An empty ``KVCache`` of ``rows`` rows and ``max_len`` entries for this stack."""
        return KVCache(self.n_layers, rows, self.n_kv, max_len, self.head_dim, dtype=self.dtype, device=self.device)
