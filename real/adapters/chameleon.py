"""Chameleon / Lumina-mGPT (transformers ``ChameleonForConditionalGeneration``) as a ``real.protocol`` model.

Facts (checked on transformers 5.24 with tiny random configs, see tests/test_real_hf_models.py):
``ChameleonForConditionalGeneration.forward`` sets every image-token logit to the dtype minimum, so
image logits are computed here from ``model.model``'s post-norm hidden states and the LM-head rows of
the image tokens. Image tokens are the vocabulary entries named ``IMGIMG<letters>Z`` (letters A-J
spell the decimal digits of the VQ code); engine token k = VQ code k is fed as LM id ``img2bpe[k]``
(transformers' ``ChameleonImageVocabularyMapping``), an order that differs from the id order.
``ChameleonVQVAE`` in transformers has an encoder only: pixels come from ``real.models.chameleon_vqgan``.

Lumina-mGPT layout (Alpha-VLLM; read from the LANTERN release's copy of its inference code): the prompt
is followed by boi ``<racm3:break>`` (id 8197), a height and a width token ``<reserved{8800+n}>`` with
n = pixels / 32 (id 8804 + n; 768 px: n = 24, id 8828), then h = 2n rows of (w = 2n codes + newline
``<reserved08799>``), then eoi ``<eoss>`` (id 8196). Sampling: CFG 3.0 with the unconditional row
starting at boi (the header alone), image top-k 2000, newline and eoi forced. Here: ``ImageLayout``
with header (boi, h-token, w-token), row_end = newline, trailer (eoi,); ``uncond="header"``.
"""
from __future__ import annotations

import os

import torch

from .image_layout import ImageLayout
from .imagelm import ImageTokenLM
from .imagelm_eagle import tiny_pair
from .imagelm_loading import embedding_dominated_init, hf_from_pretrained

__all__ = ["ChameleonImageLM", "lumina_layout", "sjd_plain_tail", "SJD_LOOP_INTERVAL", "image_code_ids", "tiny_chameleon", "tiny_chameleon_pair",
           "load_lumina_mgpt", "lumina_prompt", "LUMINA_IDS", "tiny_vqgan", "vqgan_paths", "lumina_7b_config"]

# Lumina-mGPT / Chameleon special ids (tokenizer of Alpha-VLLM/Lumina-mGPT-7B-*)
LUMINA_IDS = {"boi": 8197, "eoi": 8196, "size0": 8804, "newline": 8803, "bos": 1, "eos": 2, "pad": 1,
              "end_turn": 8710}


def lumina_layout(pixels: int = 768, *, boi: int = 8197, eoi: int = 8196, newline: int = 8803,
                  size0: int = 8804, patch: int = 32, downsample: int = 16) -> ImageLayout:
    """Lumina-mGPT's square image layout at ``pixels`` px (768: 48 x 48 codes)."""
    if pixels % patch:
        raise ValueError(f"Lumina-mGPT images are multiples of {patch} px, got {pixels}")
    n = pixels // patch
    side = pixels // downsample
    return ImageLayout(side, side, row_end=newline, header=(boi, size0 + n, size0 + n), trailer=(eoi,))


# SJD's (tyshiwo1/Accelerating-T2I-AR-with-SJD at b389cfb2b6aa228efab32190f98bc13c3fd4b8e6, test_lumina_mgpt.py) and
# SCD's (junhyukso/SCD at 7322379df906785094bd35aa2006791ba9acc8b0, lumina1/test_*.py) Lumina-mGPT schedule: Jacobi
# windows while l <= g < r, g the tokens generated after the prompt (header and newlines included), with
# l = 3 and r = (size // 16) ** 2 + size // 16 - 10; the window is min(max_num_new_tokens, r - g) there, 1 elsewhere.
SJD_LOOP_INTERVAL = (3, -10)


def sjd_plain_tail(layout: ImageLayout) -> int:
    """Image codes at the end of a Lumina-mGPT image that the SJD / SCD releases sample plainly (their loop interval
    ``SJD_LOOP_INTERVAL``): the codes generated at g >= r = H * W + H - 10 (square images: (size // 16) ** 2 + size //
    16 - 10), g counting the header (3 tokens: boi, height, width) and one newline per row. 12 at every size of at least
    13 codes per row (the last 13 generated tokens before eoi: 12 codes and the final newline). The first l = 3
    generated tokens are the header: not image codes, so no plain head."""
    l, back = SJD_LOOP_INTERVAL
    r = layout.height * layout.width + layout.height + back
    per_row = layout.width + (layout.row_end is not None)
    head = len(layout.header)
    if head != l:
        raise ValueError(f"the SJD schedule assumes Lumina-mGPT's {l} header tokens, this layout has {head}")
    return sum(1 for i in range(layout.height) for c in range(layout.width) if head + i * per_row + c >= r)


def image_code_ids(model) -> torch.Tensor:
    """(V,) LM ids of VQ codes 0..V-1 from the model's vocabulary map (``img2bpe``)."""
    vm = model.model.vocabulary_mapping
    if vm.vocab_map is None:
        raise ValueError("the Chameleon config has no vocabulary_map: pass the tokenizer's vocabulary "
                         "(load_lumina_mgpt does) to map VQ codes to token ids")
    img2bpe = vm.img2bpe
    V = len(img2bpe)
    if sorted(img2bpe) != list(range(V)):
        raise ValueError(f"the vocabulary's IMGIMG tokens do not name codes 0..{V - 1}")
    return torch.tensor([img2bpe[k] for k in range(V)], dtype=torch.long)


class ChameleonImageLM(ImageTokenLM):
    """``ChameleonForConditionalGeneration`` over its VQ codes with a Lumina-mGPT-style layout.

    cond: ``Prompt`` of prompt ids (the header is appended); with CFG the unconditional row is the
    header alone unless ``Prompt.uncond_ids`` is given (then uncond_ids + header). ``code_ids`` (V,) the
    LM ids of the codes (default: the model's vocabulary map, ``image_code_ids``)."""

    def __init__(self, model, layout: ImageLayout, code_ids: torch.Tensor | None = None):
        """``model``: a transformers ``ChameleonForConditionalGeneration``; ``layout``: its ``ImageLayout``;
        ``code_ids`` (V,) int64: the LM ids of codes 0..V-1 (default ``image_code_ids(model)``); the image head
        is those (V, D) rows of ``lm_head``."""
        ids = image_code_ids(model) if code_ids is None else torch.as_tensor(code_ids, dtype=torch.long)
        w = model.lm_head.weight[ids.to(model.lm_head.weight.device)]
        super().__init__(model, model.model, layout, ids, w, uncond="header")

    def rebuild_kwargs(self) -> dict:
        """Keyword arguments that rebuild this adapter around another Chameleon model (``ImageTokenLM.rebuild_kwargs``)."""
        return {"layout": self.layout, "code_ids": self.code_ids.cpu()}


# --------------------------------------------------------------------------- tiny random configs

def _tiny_vocab(V: int, n_text: int = 48):
    """A Chameleon-style vocabulary map: specials, V image tokens ``IMGIMG<digits as A-J>Z`` given ids
    in sorted-name order (so code -> id is not monotone, as in Chameleon's), then layout tokens and text."""
    vm = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    names = sorted("IMGIMG" + "".join(chr(ord("A") + int(ch)) for ch in str(k)) + "Z" for k in range(V))
    for i, nm in enumerate(names):
        vm[nm] = 4 + i
    nxt = 4 + V
    specials = {}
    for nm in ("<racm3:break>", "<eoss>", "<reserved08799>", "<image>", "<reserved08706>"):
        vm[nm] = specials[nm] = nxt
        nxt += 1
    for s in range(1, 9):                     # size tokens <reserved{8800+s}>
        vm[f"<reserved{8800 + s:05d}>"] = nxt
        specials[f"size{s}"] = nxt
        nxt += 1
    text0 = nxt
    for t in range(n_text):
        vm[f"t{t}"] = nxt
        nxt += 1
    return vm, specials, text0, nxt


def tiny_chameleon(seed: int = 0, *, V: int = 64, side: int = 4, hidden: int = 64, layers: int = 3, heads: int = 4,
                   init: bool = True, n_text: int = 48):
    """A tiny random ``ChameleonForConditionalGeneration`` (V image codes, qk-norm, tiny VQ encoder) and
    its ``ImageLayout`` (side x side codes, Lumina-style header/newline/eoi from the tiny vocabulary; ``n_text``
    text ids after them: ``real.realsize`` fills Lumina-mGPT's 65,536). Positions: at least 1,024, and room for
    the side x (side + 1) image tokens after a prompt. Returns (model, layout, text_ids (first text id, end))."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    vm, sp, text0, n = _tiny_vocab(V, n_text)
    cfg = ChameleonConfig(vocab_size=n, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=heads,
                          max_position_embeddings=max(1024, side * (side + 1) + 128), vocabulary_map=vm, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                          vq_config=dict(embed_dim=32, num_embeddings=V, latent_channels=32, base_channels=32,
                                         channel_multiplier=[1, 2], resolution=8, num_res_blocks=1))
    torch.manual_seed(seed)
    m = ChameleonForConditionalGeneration(cfg).eval()
    if init:
        embedding_dominated_init(m, seed)
    size_tok = sp[f"size{min(side, 8)}"]
    lay = ImageLayout(side, side, row_end=sp["<reserved08799>"], header=(sp["<racm3:break>"], size_tok, size_tok),
                      trailer=(sp["<eoss>"],))
    return m, lay, (text0, n)


def tiny_chameleon_pair(seed: int = 0, draft: str = "layerskip", device="cpu", dtype=torch.float32, **kw):
    """(target adapter, draft adapter, text id range) for tests and ``--model chameleon-tiny``: draft
    ``layerskip`` (the target's first layer), ``small`` (independent random 1-layer, hidden 32, same
    vocabulary) or ``eagle`` (a random EAGLE-1 head on the target)."""

    return tiny_pair(tiny_chameleon, ChameleonImageLM, seed, draft, device, dtype, kw, layer_key="model.layers",
                     set_layers=lambda c, n: setattr(c, "num_hidden_layers", n), small_keys=("V", "side", "n_text"))


def lumina_7b_config(max_position_embeddings: int = 4096):
    """A ``ChameleonConfig`` shaped like Lumina-mGPT-7B (hidden 4096, 32 layers, 32 heads, MLP 11008,
    vocabulary 65536, 8192 image codes at ids 4..8195) with a synthetic vocabulary map that puts the
    layout tokens at the published ids (boi 8197, eoi 8196, newline 8803, size tokens 8804 + n), for
    random-weight timing runs (scripts/gpu_check.sh --lumina)."""
    from transformers import ChameleonConfig

    vm = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    names = sorted("IMGIMG" + "".join(chr(ord("A") + int(ch)) for ch in str(k)) + "Z" for k in range(8192))
    vm.update({nm: 4 + i for i, nm in enumerate(names)})
    vm.update({"<eoss>": 8196, "<racm3:break>": 8197, "<reserved08799>": 8803, "<image>": 8711,
               "<reserved08706>": 8710})
    vm.update({f"<reserved{8800 + n:05d}>": 8804 + n for n in range(1, 65)})
    return ChameleonConfig(vocab_size=65536, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=max_position_embeddings,
                           vocabulary_map=vm, bos_token_id=1, eos_token_id=2, pad_token_id=1)


def tiny_vqgan(seed: int = 0, V: int = 64):
    """A random tiny ``real.models.chameleon_vqgan.ChameleonVQGAN`` over V codes (downsampling 2)."""
    from real.models.chameleon_vqgan import ChameleonVQGAN, VQGANConfig

    c = VQGANConfig(n_embed=V, embed_dim=8, ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=32, resolution=8)
    return ChameleonVQGAN(c).random_init(seed).eval()


# --------------------------------------------------------------------------- real checkpoints

def load_lumina_mgpt(path: str = "Alpha-VLLM/Lumina-mGPT-7B-768", *, pixels: int = 768, device="cpu",
                     dtype=torch.bfloat16, tokenizer=None) -> tuple[ChameleonImageLM, object]:
    """Lumina-mGPT (or any Chameleon checkpoint in transformers format) from a local directory or a
    Hugging Face id (network needed then). Returns (adapter, tokenizer). The VQ encoder weights may be
    absent (generation does not use them); any other missing / unexpected / mis-shaped key is a
    ValueError. When the config lacks ``vocabulary_map`` it is taken from the tokenizer."""
    from transformers import AutoConfig, AutoTokenizer, ChameleonForConditionalGeneration

    cfg = AutoConfig.from_pretrained(path)
    if getattr(cfg, "model_type", None) != "chameleon":
        raise ValueError(f"{path}: model_type {getattr(cfg, 'model_type', None)!r}, expected a Chameleon checkpoint")
    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
    if cfg.vocabulary_map is None:
        cfg.vocabulary_map = dict(tok.get_vocab())
        cfg.image_token_id = cfg.vocabulary_map.get("<image>")
    m = hf_from_pretrained(ChameleonForConditionalGeneration, path, config=cfg, dtype=dtype,
                           allow_missing=("model.vqmodel.",))
    m = m.to(device).eval()
    vocab = cfg.vocabulary_map
    need = {"<racm3:break>": LUMINA_IDS["boi"], "<eoss>": LUMINA_IDS["eoi"], "<reserved08799>": LUMINA_IDS["newline"]}
    ids = {k: vocab.get(k) for k in need}
    if any(v is None for v in ids.values()):
        raise ValueError(f"{path}: tokenizer lacks Lumina-mGPT's layout tokens {[k for k, v in ids.items() if v is None]}")
    lay = lumina_layout(pixels, boi=ids["<racm3:break>"], eoi=ids["<eoss>"], newline=ids["<reserved08799>"],
                        size0=vocab.get("<reserved08800>", LUMINA_IDS["size0"]))
    return ChameleonImageLM(m, lay), tok


def lumina_prompt(tokenizer, caption: str, pixels: int = 768, negative: str | None = None):
    """A ``Prompt`` in Lumina-mGPT's text-to-image template ("Generate an image of {p}x{p} according to
    the following prompt:\\n{caption}" + end-of-turn ``<reserved08706>``; the adapter appends boi and
    the size tokens)."""
    from real.protocol import Prompt

    def enc(text):
        ids = tokenizer(text + "<reserved08706>", add_special_tokens=True)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    cond = enc(f"Generate an image of {pixels}x{pixels} according to the following prompt:\n{caption}")
    return Prompt(cond, None if negative is None else enc(negative))


def vqgan_paths(directory: str) -> tuple[str, str]:
    """(vqgan.yaml, vqgan.ckpt) inside a Chameleon tokenizer directory (``.../chameleon/tokenizer``)."""
    y, c = os.path.join(directory, "vqgan.yaml"), os.path.join(directory, "vqgan.ckpt")
    for p in (y, c):
        if not os.path.exists(p):
            raise ValueError(f"{p} not found (Chameleon's VQGAN ships as vqgan.yaml + vqgan.ckpt)")
    return y, c
