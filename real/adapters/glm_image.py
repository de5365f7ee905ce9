"""GLM-Image's autoregressive stage (transformers ``GlmImageForConditionalGeneration``) as a family of
``real.adapters.batched_imagelm.BatchedImageLM``: batched from the start, on ``real.models.glm_image.GlmImageStack``.

The engine sees the image codes: the h w codes of the small prior grid, then the H W codes of the target grid (the
two-stage budget of transformers' generation; ``real.models.glm_image`` for the facts); no structural token lies
inside that stream, the prompt ends with the size tags and the image start (the header), the image end follows the
last code. Positions are GLM's 3-axis M-RoPE (``glm_positions``). The AR stage has no classifier-free guidance: a
CFG request is refused (GLM-Image's ``guidance_scale`` belongs to its diffusion decoder, out of scope: ``--save``
writes the codes; ``GlmLayout.target_codes`` cuts the H x W grid the diffusion stage takes).

Drafts: ``layerskip`` (the target's first layers, weights shared), ``eagle`` (an EAGLE-1 head on a virtual square grid
over the code stream, ``real.adapters.imagelm_eagle.eagle_for``); GLM-Image has no smaller sibling (``small`` is
refused with that reason).
"""
from __future__ import annotations

import numpy as np
import torch

from real.models.glm_image import GLM_DIFFUSION_OPTIONS, GlmImageStack, GlmLayout, glm_grids, glm_image_layout, \
    glm_positions
from real.protocol import Prompt, make_draft

from .image_layout import ImageLayout

__all__ = ["GlmImageLM", "NO_CFG", "tiny_glm_image_pair", "load_glm_image", "glm_prompt", "check_ar_options",
           "GLM_IMAGE_ID", "build_glm"]

GLM_IMAGE_ID = "zai-org/GLM-Image"
NO_CFG = ("GLM-Image's autoregressive stage has no classifier-free guidance (its guidance_scale belongs to the "
          "diffusion decoder, out of scope here): use --cfg-scale 1")


def check_ar_options(options: dict) -> None:
    """ValueError naming the options that belong to GLM-Image's diffusion stage (``GLM_DIFFUSION_OPTIONS``)."""
    bad = sorted(k for k in options if k in GLM_DIFFUSION_OPTIONS)
    if bad:
        raise ValueError(f"{', '.join(bad)} belong(s) to GLM-Image's diffusion stage, which this toolkit does not run "
                         "(it generates the AR stage's codes)")


class GlmImageLM:
    """GLM-Image's AR stage over its V codes (module docstring): ``prompt``, ``embed``, ``head``, ``code_ids``,
    ``layout`` (the engine's 1 x T view), ``rope_positions`` (3 axes), for ``BatchedImageLM``."""

    def __init__(self, model, layout: GlmLayout, *, stack: GlmImageStack | None = None):
        """``model``: a transformers ``GlmImageForConditionalGeneration`` (kept for EAGLE sizing; None with ``stack``);
        ``layout``: the ``GlmLayout`` (grids, header, trailer); ``stack``: the port (default ``from_hf(model)``)."""
        self.model = model
        self.stack = stack if stack is not None else GlmImageStack.from_hf(model)
        self.glm_layout = layout
        self.layout = ImageLayout(**layout.image_layout_args())
        self.code_ids = self.stack.code_ids
        self.vocab_size = int(self.code_ids.numel())

    device = property(lambda self: self.stack.device, doc="The weights' device.")
    dtype = property(lambda self: self.stack.dtype, doc="The weights' dtype.")
    hidden_size = property(lambda self: self.stack.hidden_size, doc="D, the decoder's hidden size.")

    @property
    def backbone(self):
        """The transformers text decoder (its config sizes EAGLE drafters)."""
        if self.model is None:
            raise ValueError("this GLM-Image family was built from a stack alone: no transformers decoder")
        return self.model.model.language_model

    def prompt(self, cond, cfg: bool) -> Prompt:
        """The model row of one condition: its ids with the layout header (size tags, image start) unless they already
        end with the image start (a processor's prompt); ``cfg`` is refused (``NO_CFG``)."""
        if cfg:
            raise ValueError(NO_CFG)
        p = cond if isinstance(cond, Prompt) else Prompt(cond)
        h = list(self.layout.header)                   # ends with the image start, which closes every GLM prompt
        return Prompt(p.ids if p.ids[-1:].tolist() == h[-1:] else torch.cat([p.ids, torch.tensor(h)]))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """LM ids (R, S) -> input embeddings (R, S, D)."""
        return self.stack.embed(ids)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits (..., V) over the codes."""
        return self.stack.head(hidden)

    def code_embeddings(self) -> torch.Tensor:
        """(V, D) input embedding of every code (EAGLE drafters)."""
        return self.stack.embed(self.code_ids.view(1, -1))[0].detach()

    def rope_positions(self, base: np.ndarray, ci: np.ndarray, forced: np.ndarray) -> np.ndarray:
        """(R, S, 3) M-RoPE positions of block entries (``glm_positions``; GLM forces no token inside its codes)."""
        return glm_positions(torch.as_tensor(base), torch.as_tensor(ci), torch.as_tensor(forced),
                             grids=self.glm_layout.grids).numpy()

    def image_sequence(self, codes: torch.Tensor) -> torch.Tensor:
        """The AR stage's whole output for one image: header, the T codes (LM id = code), the image end."""
        c = torch.as_tensor(codes, dtype=torch.long).reshape(-1).cpu()
        if c.numel() != self.layout.num_tokens or (c.numel() and (int(c.min()) < 0 or int(c.max()) >= self.vocab_size)):
            raise ValueError(f"GLM-Image images have {self.layout.num_tokens} codes in [0, {self.vocab_size})")
        return torch.cat([torch.tensor(self.layout.header), c, torch.tensor(self.layout.trailer)])


def _drafts(target: GlmImageLM, kind: str, seed: int, layers: int = 1):
    """The draft of ``kind`` for a GLM-Image target: ``layerskip`` (first ``layers`` layers, shared weights), ``eagle``
    (a fresh EAGLE-1 head), ``small`` refused (no smaller sibling)."""
    from .imagelm_eagle import eagle_for

    def small():
        raise ValueError("GLM-Image has no smaller sibling with its tokenizer: use --draft layerskip or eagle")
    return make_draft(kind, {"layerskip": lambda: GlmImageLM(target.model, target.glm_layout,
                                                              stack=target.stack.layer_skip(layers)),
                             "small": small, "eagle": lambda: eagle_for(target, seed=seed + 1)})


def tiny_glm_image_pair(seed: int = 0, draft: str = "layerskip", device="cpu", dtype=torch.float32,
                        grids=((8, 8), (4, 4)), **kw):
    """(target ``GlmImageLM``, draft, text id range) on ``real.adapters.glm_image_hf.tiny_glm_image`` (random, CPU):
    ``grids`` as the processor lists them (target (H, W), then prior (h, w)); the header is the tiny size tag and the
    image start (``tiny_glm_prompt``), so prompts are word ids alone."""
    from .glm_image_hf import tiny_glm_ids, tiny_glm_image, tiny_glm_prompt

    m = tiny_glm_image(seed, **kw).to(device=device, dtype=dtype)
    V = int(m.config.vq_config.num_embeddings)
    _, lay = tiny_glm_prompt(grids, n_words=0, V=V)
    t = GlmImageLM(m, lay)
    ids = tiny_glm_ids(V)
    return t, _drafts(t, draft, seed), (ids["word0"], ids["vocab_size"])


def load_glm_image(path: str = GLM_IMAGE_ID, *, height: int = 1152, width: int = 768, device="cpu",
                   dtype=torch.bfloat16, **options):
    """GLM-Image's AR stage in transformers format (``zai-org/GLM-Image``, a directory or a Hub id) for ``height`` x
    ``width`` px (the grids, ``glm_grids``). Returns (``GlmImageLM``, processor). ``options`` of the diffusion stage
    are refused (``check_ar_options``). Unverified here (no network): the published processor's prompt template."""
    from transformers import AutoConfig, AutoProcessor, GlmImageForConditionalGeneration

    from .imagelm_loading import hf_from_pretrained

    check_ar_options(options)
    if options:
        raise ValueError(f"unknown GLM-Image options {sorted(options)}")
    cfg = AutoConfig.from_pretrained(path)
    if getattr(cfg, "model_type", None) != "glm_image":
        raise ValueError(f"{path}: model_type {getattr(cfg, 'model_type', None)!r}, expected 'glm_image'")
    m = hf_from_pretrained(GlmImageForConditionalGeneration, path, dtype=dtype,
                           allow_missing=("vqmodel", "visual")).to(device).eval()
    proc = AutoProcessor.from_pretrained(path)
    (h, w), (H, W) = glm_grids(height, width)
    lay = glm_image_layout(((H, W), (h, w)), image_start=cfg.image_start_token_id, image_end=cfg.image_end_token_id)
    return GlmImageLM(m, lay), proc


def glm_prompt(processor, text: str, height: int = 1152, width: int = 768) -> Prompt:
    """A ``Prompt`` through GLM-Image's processor in text-to-image mode (chat template, size tags, image start)."""
    msgs = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    chat = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    ids = processor(text=[chat], target_h=height, target_w=width, return_tensors="pt")["input_ids"][0]
    return Prompt(ids)


def build_glm(tiny: bool, *, seed: int = 0, kind: str = "layerskip", device="cpu", dtype=torch.float32,
              num_images: int = 1, prompts=None, path: str | None = None, image_size: int | None = None,
              drafter_dir: str | None = None, tiny_kw: dict | None = None):
    """What ``real.registry`` builds for ``glm-image-tiny`` (random; ``num_images`` seeded 8-word prompts; an 8 x 8
    target grid after a 4 x 4 prior grid) or ``glm-image`` (``path``, default ``GLM_IMAGE_ID``; ``prompts`` texts;
    ``image_size`` the square side in px, default 1152 x 768; with ``kind`` eagle and a ``drafter_dir`` the draft returned
is a placeholder that ``real.registry`` replaces by the trained drafter, ``real.drafter.files.load_drafter``). Returns
    (target family, draft or None, conditions, description). ``tiny_kw``: other arguments of the tiny pair
    (``tiny_glm_image_pair``: ``real.realsize.SHALLOW``'s published vocabulary and grids)."""
    if tiny:
        t, d, (a, b) = tiny_glm_image_pair(seed, "layerskip" if kind == "eagle" and drafter_dir else kind, device, dtype,
                                           **(tiny_kw or {}))
        g = torch.Generator().manual_seed(seed)
        size = "shallow at the published vocabulary and grids" if tiny_kw else "tiny"
        return t, d, [Prompt(torch.randint(a, b, (8,), generator=g)) for _ in range(num_images)], \
            f"GlmImageForConditionalGeneration {size} (random), AR stage"
    if not prompts:
        raise ValueError("--model glm-image: pass --prompts TEXT ...")
    hw = (int(image_size), int(image_size)) if image_size else (1152, 768)
    t, proc = load_glm_image(path or GLM_IMAGE_ID, height=hw[0], width=hw[1], device=device, dtype=dtype)
    d = _drafts(t, "layerskip" if kind == "eagle" and drafter_dir else kind, seed)
    return t, d, [glm_prompt(proc, p, *hw) for p in prompts], "GLM-Image AR stage"
