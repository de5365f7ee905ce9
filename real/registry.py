"""Named model pairs for the command line (``coolsd generate --model NAME``) and scripts.

A builder takes a ``BuildOptions`` (device, dtype, seed, num_images, class_id, draft, checkpoint paths, ...;
None = the model's default) and returns a ``Bundle``: target, draft, one condition per image, tokens per
image, LANTERN's neighbour table, a VQ decoder. ``register("name", builder, "help")`` adds a model; its
``real.specs.ModelSpec`` says what it accepts (``build`` checks the options, fills in the defaults, CFG, top-k).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from .build_options import BuildOptions
from .protocol import NO_DRAFT, make_draft as _make_draft    # NO_DRAFT: BuildOptions.draft "none", no draft model
from .realsize import SHALLOW, shallow_kwargs

__all__ = ["Bundle", "BuildOptions", "register", "build", "MODELS", "tiny_llamagen_pair"]


@dataclass
class Bundle:
    """What ``build`` returns: ``target`` and ``draft`` models, ``conds`` (one condition per image), ``num_tokens``
    image tokens per image, LANTERN's ``neighbors`` table (V, K) int64 or None, the code decoder ``vq`` (codes
    (B, T) -> images) or None, the model's default ``cfg_scale`` and ``top_k``, ``info``, and ``codebook``."""
    target: Any
    draft: Any
    conds: list
    num_tokens: int
    neighbors: Any = None
    vq: Any = None
    cfg_scale: float = 1.0            # default CFG scale for this model (build: from its real.specs.ModelSpec)
    top_k: int = 0                    # default top-k for this model (0 = off; build: from its spec)
    info: dict = field(default_factory=dict)
    codebook: Any = None              # (V, d) code vectors (as stored), for GSD; None without a VQ


MODELS: dict[str, tuple[Callable[[Any], Bundle], str]] = {}


def register(name: str, builder: Callable[[Any], Bundle], help: str = "", spec=None) -> None:
    """Add model ``name`` to ``MODELS``: ``builder(BuildOptions) -> Bundle`` and its one-line ``help``; its
    ``spec`` (a ``real.specs.ModelSpec``) defaults to ``real.specs.SPECS[name]``: a model without one is refused."""
    from .specs import attach
    attach(name, spec)          # refuses a model without a spec
    MODELS[name] = (builder, help)


def build(name: str, opts: BuildOptions | None = None, **kw) -> Bundle:
    """The ``Bundle`` of model ``name`` built with ``opts`` and/or options ``kw`` (fields of ``BuildOptions``;
    an unknown one is a ValueError naming it); ``num_tokens`` beyond one image of the model is refused once built."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(MODELS)}")
    if opts is not None and not isinstance(opts, BuildOptions):
        raise TypeError(f"opts must be a BuildOptions (BuildOptions.from_namespace(args) for a Namespace), "
                        f"got {type(opts).__name__}")
    known = {f.name for f in dataclasses.fields(BuildOptions)}
    bad = sorted(set(kw) - known)
    if bad:
        raise ValueError(f"unknown build option(s) {bad}; known: {sorted(known)}")
    opts = dataclasses.replace(opts or BuildOptions(), **kw)       # BuildOptions checks the types
    from .specs import conditions_of, prepare, universal_drafts
    no_draft = opts.draft == NO_DRAFT
    # the one generic check; drafter-free decoding is checked as a drafter-free mode (no draft model's rules apply:
    # --model llamagen then needs no --draft-ckpt)
    s, opts = prepare(name, dataclasses.replace(opts, draft=universal_drafts()[0]) if no_draft else opts)
    if no_draft:   # drafter-free decoding: the builders make no draft at all (``_make_draft``)
        opts = dataclasses.replace(opts, draft=NO_DRAFT)
    bundle = MODELS[name][0](opts)
    lay, conf = getattr(bundle.target, "layout", None), getattr(bundle.target, "config", None)
    cap = getattr(lay, "num_tokens", None) or getattr(conf, "block_size", None)     # tokens of one image
    if opts.num_tokens is not None and cap is not None and opts.num_tokens > int(cap):
        raise ValueError(f"--num-tokens {opts.num_tokens} is more than the {int(cap)} tokens of one image of --model "
                         f"{name}")
    bundle.cfg_scale, bundle.top_k = s.cfg_default(opts.model_type), s.top_k
    bundle.info.setdefault("conditions", conditions_of(opts, bundle.conds))
    return bundle


def _o(opts: BuildOptions, name: str, default):
    """Option ``name`` or ``default`` when unset (None); a name BuildOptions lacks raises AttributeError."""
    v = getattr(opts, name)
    return default if v is None else v


def _neighbor_table(vectors, opts, K: int | None = None):
    """LANTERN neighbour table of codebook vectors (V, d), lazily (``real.neighbors.NeighborTable``: built when a rule
    first reads it, as wide as that rule reads, cached on disk): Euclidean distance between the raw vectors as
    LANTERN's release ranks them (default), or between l2-normalised ones (``--lantern-neighbors l2``, our earlier
    table). At most K columns (default V - 1)."""
    from .neighbors import NeighborTable

    return NeighborTable(vectors, _o(opts, "lantern_neighbors", "raw"), K)


def _dtype(opts) -> torch.dtype:
    d = _o(opts, "dtype", "float32")
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if d not in table:
        raise ValueError(f"unknown dtype {d!r}; choose from {sorted(table)}")
    return table[d]


def _device(opts) -> torch.device:
    d = _o(opts, "device", "cpu")
    if d == "auto":
        d = "cuda" if torch.cuda.is_available() else "cpu"
    if str(d).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
    return torch.device(d)


def _class_ids(opts, num_classes: int) -> list[int]:
    n = int(_o(opts, "num_images", 1))
    cid = opts.class_id
    if cid is not None:
        if not 0 <= int(cid) < num_classes:
            raise ValueError(f"--class-id must be in [0, {num_classes}), got {cid}")
        return [int(cid)] * n
    rng = np.random.default_rng(int(_o(opts, "seed", 0)))
    return [int(x) for x in rng.integers(0, num_classes, n)]


# --------------------------------------------------------------------------- LlamaGen tiny (random weights)

def tiny_llamagen_pair(seed: int = 0, draft: str = "layerskip", model_type: str = "c2i", device="cpu",
                       dtype=torch.float32):
    """Random tiny LlamaGen target (4 layers, dim 128, V = 256, 8x8 tokens) and a draft:
    ``layerskip`` (its first layer, embeddings and head), ``small`` (independent random tiny-draft
    config), or ``eagle`` (a random EAGLE-1 head on the target). The target's weights are scaled so
    that the residual stream is embedding-dominated (a layer-skip draft then agrees often), which makes
    the acceptance rates of the methods differ visibly."""
    from .models import llamagen as lg
    from .models.eagle import EagleDrafter

    c = lg.config("tiny", model_type=model_type)
    t = lg.LlamaGen(c).random_init(seed, std=0.05, output_std=0.2, embed_std=1.0).to(device, dtype).eval()
    return t, _make_draft(draft, {
        "layerskip": lambda: lg.truncated(t, 1).eval(),
        "small": lambda: lg.LlamaGen(lg.config("tiny-draft", model_type=model_type)).random_init(
            seed + 1, std=0.05, output_std=0.2, embed_std=1.0).to(device, dtype).eval(),
        "eagle": lambda: EagleDrafter.from_target(t, seed=seed + 1).eval()})


def _trained_eagle(opts, target, model: str):
    """--drafter-dir's drafter for ``target`` built as ``model``: ``real.drafter.files.load_drafter``, the one loader."""
    from .drafter.files import load_drafter
    return load_drafter(opts.drafter_dir, target, model)


def _tiny_vq(seed: int, V: int):
    from .models.vq import VQModel, vq_config

    return VQModel(vq_config("tiny", codebook_size=V)).random_init(seed).eval()


def _build_llamagen_tiny(opts, model_type="c2i") -> Bundle:
    from .protocol import Caption

    seed = int(_o(opts, "seed", 0))
    dev, dt = _device(opts), _dtype(opts)
    kind = _o(opts, "draft", "layerskip")
    t, d = tiny_llamagen_pair(seed, "layerskip" if kind == "eagle" and opts.drafter_dir else kind, model_type, dev, dt)
    if kind == "eagle" and opts.drafter_dir:
        d = _trained_eagle(opts, t, "llamagen-tiny" if model_type == "c2i" else "llamagen-tiny-t2i")
    vq = _tiny_vq(seed, t.config.vocab_size).to(dev)
    nb, cb = _neighbor_table(vq.quantize.embedding.weight, opts), vq.quantize.embedding.weight.detach()
    if model_type == "c2i":
        conds = _class_ids(opts, t.config.num_classes)
    else:
        g = torch.Generator().manual_seed(seed)
        n = int(_o(opts, "num_images", 1))
        P, C = t.config.cls_token_num, t.config.caption_dim
        conds = []
        for _ in range(n):
            valid = int(torch.randint(1, P + 1, (1,), generator=g))
            mask = torch.arange(P) >= P - valid
            conds.append(Caption(torch.randn(P, C, generator=g) * mask[:, None], mask))
    T = int(_o(opts, "num_tokens", t.config.block_size))
    return Bundle(t, d, conds, T, nb, vq, codebook=cb,
                  info={"target": "LlamaGen tiny (random)", "draft": _o(opts, "draft", "layerskip"), "type": model_type})


register("llamagen-tiny", _build_llamagen_tiny, "random tiny LlamaGen c2i target + tiny draft (CPU demo/tests)")
register("llamagen-tiny-t2i", lambda o: _build_llamagen_tiny(o, "t2i"),
         "random tiny LlamaGen t2i target (8 caption tokens) + tiny draft")


# --------------------------------------------------------------------------- LlamaGen from checkpoints

def _build_llamagen(opts) -> Bundle:
    """Real LlamaGen c2i/t2i: --target-ckpt/--target-size, --draft-ckpt/--draft-size (or --draft eagle
    with --drafter-dir, a LANTERN release directory), --vq-ckpt, --image-size; t2i needs --captions
    (a .pt file with a list of {embedding, mask}) or --prompts with flan-t5-xl available."""
    from .models import llamagen as lg, llamagen_io
    from .models.vq import load_vq

    dev, dt = _device(opts), _dtype(opts)
    mtype = _o(opts, "model_type", "c2i")
    size = _o(opts, "image_size", 384 if mtype == "c2i" else 256)

    def ckpt(path_opt, name_opt):
        p = getattr(opts, path_opt)
        if p is None and getattr(opts, name_opt):
            p = llamagen_io.download(getattr(opts, name_opt))
        if p is None:
            raise ValueError(f"--{path_opt.replace('_', '-')} (or --{name_opt.replace('_', '-')} to download) is required")
        return p

    t = lg.load_llamagen(ckpt("target_ckpt", "target_pretrained"), _o(opts, "target_size", "XL"),
                         image_size=size, model_type=mtype, device=dev, dtype=dt)
    kind = _o(opts, "draft", "small")
    if kind == "eagle" and opts.drafter_dir is None:
        raise ValueError("--draft eagle needs --drafter-dir (LANTERN drafter directory with config.json)")
    d = _make_draft(kind, {
        "eagle": lambda: _trained_eagle(opts, t, "llamagen"),
        "layerskip": lambda: lg.truncated(t, int(_o(opts, "draft_layers", 1))),
        "small": lambda: lg.load_llamagen(ckpt("draft_ckpt", "draft_pretrained"), _o(opts, "draft_size", "B"),
                                          image_size=size, model_type=mtype, device=dev, dtype=dt)})
    vq, nb, cb = None, None, None
    vq_path = opts.vq_ckpt
    if vq_path:
        vq = load_vq(vq_path, _o(opts, "vq_size", "VQ-16"), device=dev)
        cb = vq.quantize.embedding.weight.detach()
        nb = _neighbor_table(cb, opts, K=int(_o(opts, "neighbors_k", 1001)))
    if mtype == "c2i":
        conds = _class_ids(opts, t.config.num_classes)
    else:
        conds = _captions(opts, dev, dt)
    return Bundle(t, d, conds, int(_o(opts, "num_tokens", t.config.block_size)), nb, vq, codebook=cb,
                  info={"target": "LlamaGen", "type": mtype, "draft": kind})


def _captions(opts, dev, dt):
    from .models import llamagen_io
    from .protocol import Caption

    if opts.captions:
        from .nn.checkpoint import load_captions

        return [Caption(c["embedding"], c.get("mask")) for c in load_captions(opts.captions)]
    if opts.prompts:
        return llamagen_io.t5_captions(list(opts.prompts), device=dev, dtype=dt)
    raise ValueError("t2i needs --captions FILE.pt (list of {'embedding', 'mask'}) or --prompts TEXT ...")


register("llamagen", _build_llamagen, "LlamaGen from published checkpoints (c2i or t2i; see --target-ckpt ...)")


# --------------------------------------------------------------------------- transformers (tiny random Llama)

def _build_hf_llama_tiny(opts, fast: bool = False) -> Bundle:
    from .adapters.hf import HFCausalLM, hf_llama_pair
    from .models.llama import FastLlama
    from .protocol import Prompt

    seed = int(_o(opts, "seed", 0))
    dev, dt = _device(opts), _dtype(opts)
    tgt, drf = hf_llama_pair(seed)
    g = torch.Generator().manual_seed(seed)
    n = int(_o(opts, "num_images", 1))
    V = tgt.config.vocab_size
    conds = [Prompt(torch.randint(0, V, (8,), generator=g), torch.randint(0, V, (2,), generator=g)) for _ in range(n)]
    wrap = FastLlama.from_hf if fast else HFCausalLM
    kind = _o(opts, "draft", "layerskip")
    return Bundle(wrap(tgt.to(dev, dt)), _make_draft(kind, {"layerskip": lambda: wrap(drf.to(dev, dt))}), conds,
                  int(_o(opts, "num_tokens", 64)), info={"target": "LlamaForCausalLM tiny (random)", "draft": kind,
                                       "backend": "real.models.llama.FastLlama" if fast else "real.adapters.hf.HFCausalLM"})


register("hf-llama-tiny", _build_hf_llama_tiny, "random tiny transformers LlamaForCausalLM + layer-skip draft (HF adapter)")
register("llama-tiny-fast", lambda o: _build_hf_llama_tiny(o, fast=True),
         "the hf-llama-tiny pair run by real.models.llama.FastLlama (static-cache Llama, same weights)")


# --------------------------------------------------------------------------- multimodal transformers LMs
# Chameleon / Lumina-mGPT, Janus(-Pro), Emu3 through real.adapters.imagelm adapters (engine tokens = VQ codes).

def _build_mm_tiny(opts, family: str, realsize: bool = False) -> Bundle:
    """Random tiny target + draft of one family (8 x 8 codes, V = 64, CPU demo/tests); --draft
    layerskip (default: the target's first decoder layer), small (independent 1-layer random model of the
    family, same vocabulary) or eagle (random EAGLE-1 head). ``realsize``: shallow and narrow at the published
    vocabulary and grid instead (``real.realsize.SHALLOW``)."""
    from .protocol import Prompt

    seed = int(_o(opts, "seed", 0))
    dev, dt = _device(opts), _dtype(opts)
    kind = _o(opts, "draft", "layerskip")
    kw = shallow_kwargs(family) if realsize else {"side": 8}
    size = "shallow (random) at the published vocabulary and grid" if realsize else "tiny (random)"
    if family == "chameleon":
        from .adapters.chameleon import tiny_chameleon_pair, tiny_vqgan

        t, d, (a, b) = tiny_chameleon_pair(seed, kind, dev, dt, **kw)
        vq = tiny_vqgan(seed, t.vocab_size).to(dev)
        name = f"ChameleonForConditionalGeneration {size}, Lumina-mGPT layout"
    elif family == "janus":
        from .adapters.janus import janus_decoder, tiny_janus_pair

        t, d, (a, b) = tiny_janus_pair(seed, kind, dev, dt, **kw)
        vq = janus_decoder(t.model)
        name = f"JanusForConditionalGeneration {size}"
    elif family == "emu3":
        from .adapters.emu3 import emu3_decoder, tiny_emu3_pair

        t, d, (a, b) = tiny_emu3_pair(seed, kind, dev, dt, **kw)
        vq = emu3_decoder(t.model, t.layout)
        name = f"Emu3ForConditionalGeneration {size}"
    else:
        raise ValueError(f"unknown family {family!r}")
    if kind == "eagle" and opts.drafter_dir:
        d = _trained_eagle(opts, t, f"{family}-realsize" if realsize else f"{family}-tiny")
    g = torch.Generator().manual_seed(seed)
    n = int(_o(opts, "num_images", 1))
    conds = [Prompt(torch.cat([torch.tensor([1]), torch.randint(a, b, (8,), generator=g)])) for _ in range(n)]
    nb = _neighbor_table(vq.codebook, opts)
    t, d = _batched_mm(t), _batched_mm(d)
    return Bundle(t, d, conds, int(_o(opts, "num_tokens", t.layout.num_tokens)), nb, vq,
                  info={"target": name, "draft": kind, "grid": [t.layout.height, t.layout.width]}, codebook=vq.codebook)


def _batched_mm(model, release: bool = False):
    """A family adapter (``real.adapters.imagelm``) as ``real.adapters.batched_imagelm.BatchedImageLM`` (B > 1, per-row
    caches); EAGLE drafters (already batched) and None pass through. ``release``: drop the ported transformers layers."""
    from .adapters.batched_imagelm import BatchedImageLM
    from .adapters.glm_image import GlmImageLM
    from .adapters.imagelm import ImageTokenLM

    ok = isinstance(model, (ImageTokenLM, GlmImageLM))
    return BatchedImageLM(model, release_source=release) if ok else model


def _mm_draft(opts, family: str, target, load_small):
    from .adapters.imagelm_eagle import eagle_for
    from .adapters.imagelm_loading import truncated_hf

    kind = _o(opts, "draft", "eagle" if family != "janus" else "small")
    k = int(_o(opts, "draft_layers", 1))

    def layerskip():
        key, set_n = {"chameleon": ("model.layers", lambda c, n: setattr(c, "num_hidden_layers", n)),
                      "janus": ("language_model.layers", lambda c, n: setattr(c.text_config, "num_hidden_layers", n)),
                      "emu3": ("text_model.layers", lambda c, n: setattr(c.text_config, "num_hidden_layers", n))}[family]
        return type(target)(truncated_hf(target.model, k, key, set_n), **target.rebuild_kwargs())

    def small():
        if load_small is None:
            raise ValueError(f"{family} has no smaller sibling with the same tokenizer; use --draft eagle or layerskip")
        return load_small()
    names = {"eagle": "eagle" if opts.drafter_dir else "eagle (random, untrained: pass --drafter-dir for a trained one)",
             "layerskip": f"layerskip {k}", "small": "small sibling", NO_DRAFT: NO_DRAFT}
    model = {"chameleon": "lumina-mgpt", "janus": "janus-pro", "emu3": "emu3"}[family]
    d = _make_draft(kind, {"eagle": lambda: _trained_eagle(opts, target, model) if opts.drafter_dir
                           else eagle_for(target), "layerskip": layerskip, "small": small})
    return d, names.get(kind, kind)


def _build_mm_real(opts, family: str) -> Bundle:
    """Published checkpoints (local directory or Hugging Face id; network needed for ids):
    --target-pretrained (default Alpha-VLLM/Lumina-mGPT-7B-768, deepseek-community/Janus-Pro-7B,
    BAAI/Emu3-Gen-hf), --prompts TEXT ..., --draft eagle|layerskip|small (Janus: small =
    deepseek-community/Janus-Pro-1B, or --draft-pretrained), --drafter-dir (trained EAGLE drafter),
    Lumina: --image-size (768) and --vq-ckpt (Chameleon tokenizer directory with vqgan.yaml/.ckpt)."""
    dev, dt = _device(opts), _dtype(opts)
    prompts = opts.prompts
    if not prompts:
        raise ValueError(f"--model {family}: pass --prompts TEXT ...")
    vq, load_small = None, None
    if family == "chameleon":
        from .adapters.chameleon import load_lumina_mgpt, lumina_prompt, vqgan_paths
        from .models.chameleon_vqgan import load_chameleon_vqgan

        size = int(_o(opts, "image_size", 768))
        t, tok = load_lumina_mgpt(_o(opts, "target_pretrained", "Alpha-VLLM/Lumina-mGPT-7B-768"), pixels=size,
                                  device=dev, dtype=dt)
        conds = [lumina_prompt(tok, p, size) for p in prompts]
        if opts.vq_ckpt:
            import os

            y, c = vqgan_paths(opts.vq_ckpt if os.path.isdir(opts.vq_ckpt) else os.path.dirname(opts.vq_ckpt))
            vq = load_chameleon_vqgan(c, y, device=dev)
    elif family == "janus":
        from .adapters.janus import JANUS_PRO_IDS, janus_decoder, janus_prompt, load_janus

        t, proc = load_janus(_o(opts, "target_pretrained", JANUS_PRO_IDS["7B"]), device=dev, dtype=dt)
        if proc is None:
            raise ValueError("the Janus checkpoint has no processor files: prompts cannot be tokenised")
        conds = [janus_prompt(proc, p) for p in prompts]
        vq = janus_decoder(t.model)
        load_small = lambda: load_janus(_o(opts, "draft_pretrained", JANUS_PRO_IDS["1B"]), device=dev, dtype=dt)[0]
    else:
        from .adapters.emu3 import EMU3_GEN_ID, emu3_decoder, emu3_prompt, load_emu3

        t, proc = load_emu3(_o(opts, "target_pretrained", EMU3_GEN_ID), device=dev, dtype=dt)
        conds = [emu3_prompt(proc, p) for p in prompts]
        vq = emu3_decoder(t.model, t.layout)
    d, dname = _mm_draft(opts, family, t, load_small)
    d = _batched_mm(d, release=True)
    t = _batched_mm(t, release=True)      # after the drafts: a layer-skip copy reads the transformers layers
    nb = None
    if vq is not None:
        nb = _neighbor_table(vq.codebook, opts, K=int(_o(opts, "neighbors_k", 1001)))
    return Bundle(t, d, conds, int(_o(opts, "num_tokens", t.layout.num_tokens)), nb, vq,
                  info={"target": family, "draft": dname, "grid": [t.layout.height, t.layout.width]},
                  codebook=None if vq is None else vq.codebook.detach())


def _build_glm(opts, tiny: bool, realsize: bool = False) -> Bundle:
    """GLM-Image's AR stage, batched (``real.adapters.glm_image.build_glm``): ``glm-image-tiny``, ``glm-image-realsize``
    (random, shallow, at the published vocabulary and grids: ``real.realsize.SHALLOW``) or ``glm-image``."""
    from .adapters.glm_image import build_glm

    t, d, conds, name = build_glm(tiny, seed=int(_o(opts, "seed", 0)), kind=_o(opts, "draft", "layerskip"),
                                  device=_device(opts), dtype=_dtype(opts), num_images=int(_o(opts, "num_images", 1)),
                                  prompts=opts.prompts, path=_o(opts, "target_pretrained", None),
                                  image_size=_o(opts, "image_size", None), drafter_dir=opts.drafter_dir,
                                  tiny_kw=shallow_kwargs("glm-image") if realsize else None)
    if _o(opts, "draft", "layerskip") == "eagle" and opts.drafter_dir:
        d = _trained_eagle(opts, t, "glm-image-realsize" if realsize else "glm-image-tiny" if tiny else "glm-image")
    t, d = _batched_mm(t, release=not tiny), _batched_mm(d)
    lay = t.family.glm_layout
    return Bundle(t, d, conds, int(_o(opts, "num_tokens", lay.num_tokens)), None, None,
                  info={"target": name, "draft": _o(opts, "draft", "layerskip"), "grids": [list(g) for g in lay.grids]})


register("glm-image-tiny", lambda o: _build_glm(o, True),
         "random tiny GLM-Image AR stage (a 4 x 4 prior grid, then an 8 x 8 target grid; 3-D RoPE) + layer-skip draft")
register("glm-image", lambda o: _build_glm(o, False),
         "GLM-Image's AR stage (zai-org/GLM-Image, transformers format); --prompts; codes only (no diffusion decoder)")
register("chameleon-tiny", lambda o: _build_mm_tiny(o, "chameleon"),
         "random tiny Chameleon (Lumina-mGPT layout: boi, size tokens, rows + newline, eoi) + tiny draft")
register("janus-tiny", lambda o: _build_mm_tiny(o, "janus"), "random tiny Janus (generation head) + tiny draft")
register("emu3-tiny", lambda o: _build_mm_tiny(o, "emu3"), "random tiny Emu3 (visual tokens, EOL rows) + tiny draft")
for _f in SHALLOW:      # the real-size tier: random, shallow, at the published vocabularies and grids
    register(f"{_f}-realsize", (lambda f: lambda o: _build_glm(o, True, True) if f == "glm-image"
                                else _build_mm_tiny(o, f, True))(_f), SHALLOW[_f][2])
register("lumina-mgpt", lambda o: _build_mm_real(o, "chameleon"),
         "Lumina-mGPT-7B (Chameleon) from transformers-format weights; --prompts, --vq-ckpt for pixels")
register("janus-pro", lambda o: _build_mm_real(o, "janus"),
         "Janus-Pro-7B (transformers format) with Janus-Pro-1B (--draft small) or EAGLE drafts; --prompts")
register("emu3", lambda o: _build_mm_real(o, "emu3"), "Emu3-Gen (BAAI/Emu3-Gen-hf) with EAGLE/layer-skip drafts; --prompts")


# --------------------------------------------------------------------------- the shipped zoos (MNIST, natural256)

def _build_zoo(opts, zoo: str, title: str) -> Bundle:
    """A shipped zoo's models (``real.zoo``): our LlamaGen c2i target over the zoo's VQ; --draft small (default:
    the independent small LlamaGen), eagle (MNIST: the EAGLE-1 drafter trained on the target's features) or
    layerskip (--draft-layers of the target)."""
    from .models import llamagen as lg
    from .zoo import gpt, zoos
    from .zoo import vq as zvq

    z = zoos.get(zoo)
    dev, dt = _device(opts), _dtype(opts)
    t = gpt.load_target(zoo).to(dev, dt)
    kind = _o(opts, "draft", "small")
    d = _make_draft(kind, {"small": lambda: gpt.load_draft(zoo).to(dev, dt),
                           "eagle": lambda: _trained_eagle(opts, t, zoo) if opts.drafter_dir
                           else gpt.load_eagle(t, zoo).to(dev, dt),
                           "layerskip": lambda: lg.truncated(t, int(_o(opts, "draft_layers", 1)))})
    cb = zvq.raw_codebook(zoo)
    nb = _neighbor_table(cb, opts)
    return Bundle(t, d, _class_ids(opts, z.num_classes), int(_o(opts, "num_tokens", z.tokens)), nb, zvq.ZooDecoder(zoo),
                  info={"target": f"{title} LlamaGen c2i (real.zoo, shipped)", "draft": kind, "grid": [z.side, z.side]},
                  codebook=cb)


def _build_mnist(opts) -> Bundle:
    """The shipped MNIST models: 12-layer target over the zoo's VQ (7x7 = 49 tokens, 512 codes) (``_build_zoo``)."""
    return _build_zoo(opts, "mnist", "MNIST")


def _build_natural256(opts) -> Bundle:
    """The shipped natural256 models: target over 64x64 natural-image crops tokenized to 16x16 = 256 tokens of
    1,024 codes, 16 classes (source photographs); --draft small or layerskip (``_build_zoo``)."""
    return _build_zoo(opts, "natural256", "natural256")


register("mnist", _build_mnist, "the shipped MNIST LlamaGen c2i target (real.zoo) + small / eagle / layerskip draft")
register("natural256", _build_natural256,
         "the shipped natural-image LlamaGen c2i target (real.zoo: 64x64 crops, 16x16 tokens, V = 1024) + small / "
         "layerskip draft")
