"""The published checkpoints' shapes, written once, and random-weight models built at them (the real-size tier:
tests/test_realsize.py, ``benchmarks/bench_record_memory.py``, docs/records.md; issue 54).

``PUBLISHED``: per family, the vocabulary the drafting and the verification run over (``V``: image codes), the
vocabulary of the whole model where it is larger (``full_vocab``: text and image ids), the image grids (rows,
columns) of its published checkpoints, and its VQ codebook (codes, dimension) where the toolkit decodes it. Sources:
LlamaGen's ``GPT_models`` / ``VQ_models`` (vocab_size 16384, codebook_embed_dim 8; 256 px c2i = 16 x 16, 384 px =
24 x 24); Lumina-mGPT's Chameleon tokenizer (65,536 ids, 8,192 image codes at ids 4..8195:
``real.adapters.chameleon``); Janus-Pro's gen head (16,384 codes, 384 px = 24 x 24: ``real.adapters.janus``); Emu3's
vision tokenizer (32,768 codes: ``real.adapters.emu3``); GLM-Image's AR stage (16,384 vision codes:
``real.adapters.glm_image_hf``).

``SHALLOW``: per family other than LlamaGen, the arguments of its tiny builder (``real.adapters.chameleon.
tiny_chameleon``, ``janus.tiny_janus``, ``emu3.tiny_emu3``, ``glm_image_hf.tiny_glm_image``) that give a shallow,
narrow random model (2 layers, width 64) at the published vocabulary, full vocabulary and grid; the registry builds
them as ``--model chameleon-realsize``, ``janus-realsize``, ``emu3-realsize`` and ``glm-image-realsize`` (random
weights, built at run time; ``--num-tokens`` bounds a run on the larger grids).

``llamagen_files(folder, tokens, seed)``: a shallow, narrow LlamaGen c2i target at the published vocabulary and
classes (``real.models.llamagen`` config "shallow": 2 layers, dim 64) and a VQ checkpoint with VQ-16's codebook
(config "shallow"), saved in the upstream layouts; returns the ``coolsd generate`` / ``sweep`` arguments that load
them (``--model llamagen``, layer-skip draft).
"""
from __future__ import annotations

import os

__all__ = ["PUBLISHED", "SHALLOW", "LLAMAGEN_IMAGE_SIZE", "llamagen_files", "shallow_kwargs"]

PUBLISHED: dict[str, dict] = {
    "llamagen": {"V": 16384, "grids": ((16, 16), (24, 24)), "codebook": (16384, 8), "classes": 1000},
    "lumina-mgpt": {"V": 8192, "full_vocab": 65536, "grids": ((48, 48),), "codebook": (8192, 256)},
    "janus-pro": {"V": 16384, "full_vocab": 102400, "grids": ((24, 24),), "codebook": (16384, 8)},
    "emu3": {"V": 32768, "full_vocab": 184622, "grids": ((90, 90),), "codebook": (32768, 4)},
    "glm-image": {"V": 16384, "grids": ((32, 32),), "codebook": None},
}
LLAMAGEN_IMAGE_SIZE = {256: 256, 576: 384}      # tokens -> --image-size (downsample 16)
_NARROW = {"hidden": 64, "layers": 2}
# the tiny vocabularies' fixed entries besides the codes and the text ids (real.adapters.chameleon._tiny_vocab: 4
# specials, 5 layout tokens, 8 size tokens; real.adapters.emu3._tiny_vocab: 3 specials, 6 image markers, 11 size
# characters): the text ids fill the rest of the published full vocabulary
_FIXED = {"lumina-mgpt": 4 + 5 + 8, "emu3": 3 + 6 + 11}
SHALLOW: dict[str, tuple[str, dict, str]] = {       # family: (PUBLISHED key, builder arguments, --list-models line)
    "chameleon": ("lumina-mgpt", {**_NARROW, "V": PUBLISHED["lumina-mgpt"]["V"], "side": 48,
                                  "n_text": PUBLISHED["lumina-mgpt"]["full_vocab"] - PUBLISHED["lumina-mgpt"]["V"]
                                  - _FIXED["lumina-mgpt"]},
                  "random shallow Chameleon at Lumina-mGPT's vocabulary (8,192 codes in 65,536 ids) and 768 px grid "
                  "(48 x 48)"),
    "janus": ("janus-pro", {**_NARROW, "V": PUBLISHED["janus-pro"]["V"], "side": 24,
                            "text_vocab": PUBLISHED["janus-pro"]["full_vocab"]},
              "random shallow Janus at Janus-Pro's vocabulary (16,384 codes, 102,400 text ids) and grid (24 x 24)"),
    "emu3": ("emu3", {**_NARROW, "V": PUBLISHED["emu3"]["V"], "side": 90,
                      "n_text": PUBLISHED["emu3"]["full_vocab"] - PUBLISHED["emu3"]["V"] - _FIXED["emu3"]},
             "random shallow Emu3 at Emu3-Gen's vocabulary (32,768 visual tokens in 184,622 ids) and grid (90 x 90)"),
    # GLM-Image's processor lists the target grid, then the prior one (real.models.glm_image.glm_grids: 1024 px)
    "glm-image": ("glm-image", {**_NARROW, "V": PUBLISHED["glm-image"]["V"], "grids": ((32, 32), (16, 16))},
                  "random shallow GLM-Image AR stage at the published vocabulary (16,384) and 1024 px grids "
                  "(16 x 16, 32 x 32)"),
}


def shallow_kwargs(family: str) -> dict:
    """The tiny builder's arguments of ``family`` (``SHALLOW``'s keys) at its published shapes; ValueError for
    another family."""
    if family not in SHALLOW:
        raise ValueError(f"no real-size build of family {family!r}; choose from {sorted(SHALLOW)}")
    return dict(SHALLOW[family][1])


def llamagen_files(folder, tokens: int = 256, seed: int = 0, size: str = "shallow") -> list[str]:
    """Write the target and ``vq.pt`` (module docstring) under ``folder`` once (kept when present) and return
    the arguments that load them at ``tokens`` image tokens (256 or 576). ``size``: the target's LlamaGen config
    ("shallow", or a published depth such as "B": 12 layers, width 768, for costs at a realistic depth). ValueError
    for another token count."""
    import torch

    from real.models import llamagen as lg
    from real.models.vq import VQModel, vq_config

    if tokens not in LLAMAGEN_IMAGE_SIZE:
        raise ValueError(f"LlamaGen's published grids hold {sorted(LLAMAGEN_IMAGE_SIZE)} tokens, got {tokens}")
    V, classes = PUBLISHED["llamagen"]["V"], PUBLISHED["llamagen"]["classes"]
    name = f"target{seed}.pt" if size == "shallow" else f"target_{size}_{seed}.pt"
    t_path, vq_path = os.path.join(folder, name), os.path.join(folder, f"vq{seed}.pt")
    if not os.path.exists(t_path):
        c = lg.config(size)
        assert c.vocab_size == V and c.num_classes == classes
        t = lg.LlamaGen(c).random_init(seed, std=0.05, output_std=0.2, embed_std=1.0)
        torch.save({"model": t.state_dict()}, t_path)
    if not os.path.exists(vq_path):
        vq = VQModel(vq_config("shallow")).random_init(seed)
        assert tuple(vq.quantize.embedding.weight.shape) == PUBLISHED["llamagen"]["codebook"]
        torch.save({"model": vq.state_dict()}, vq_path)
    return ["--model", "llamagen", "--target-ckpt", t_path, "--target-size", size, "--draft", "layerskip",
            "--image-size", str(LLAMAGEN_IMAGE_SIZE[tokens]), "--vq-ckpt", vq_path, "--vq-size", "shallow"]
