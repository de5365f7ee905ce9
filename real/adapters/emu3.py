"""Emu3 (transformers ``Emu3ForConditionalGeneration``) as a ``real.protocol`` model.

Facts (checked on transformers 5.24 with tiny random configs, see tests/test_real_hf_models.py):
the forward does NOT mask image logits (visual tokens are ordinary vocabulary entries
``<|visual token NNNNNN|>``, code = NNNNNN, ``model.vocabulary_mapping.img2bpe``). An image is
written as: prompt, ``<|image start|>``, the text "H*W", ``<|image token|>``, then H rows of (W visual
tokens + end-of-line ``<|extra_200|>``), then ``<|extra_201|>`` (end of frame), ``<|image end|>`` and
EOS. transformers' example constrains generation with a ``prefix_allowed_tokens_fn`` (visual tokens
inside a row, EOL at a row end, then EOF, EOI, EOS) and uses a negative prompt for CFG
(``UnbatchedClassifierFreeGuidanceLogitsProcessor``, CFG on log-softmax scores);
``model.decode_image_tokens(image_tokens=..., height=H, width=W)`` drops the 3 trailing tokens and the
EOL column and decodes with the Emu3 VQ (spatial factor 8 in the released model).

Here: ``ImageLayout`` with header (boi, "H*W" ids, image-wrapper), row_end = EOL, trailer
(EOF, EOI, EOS); the unconditional row is ``Prompt.uncond_ids`` (a negative prompt) + header, or
BOS + header without one (``uncond="header"`` with BOS as the prompt).
"""
from __future__ import annotations

import torch

from .image_layout import ImageLayout
from .imagelm import ImageTokenLM
from .imagelm_eagle import tiny_pair
from .imagelm_loading import CodeDecoder, embedding_dominated_init, hf_from_pretrained
from real.protocol import Prompt

__all__ = ["Emu3ImageLM", "emu3_layout", "tiny_emu3", "tiny_emu3_pair", "load_emu3", "emu3_prompt", "emu3_decoder",
           "EMU3_GEN_ID"]

EMU3_GEN_ID = "BAAI/Emu3-Gen-hf"    # transformers-format Emu3 image generator (BAAI/Emu3-Gen is remote code)


def emu3_layout(vocab: dict, height: int, width: int, size_ids: list[int]) -> ImageLayout:
    """The Emu3 image layout from the tokenizer vocabulary; ``size_ids`` = token ids of the text "H*W"."""
    need = ("<|image start|>", "<|image token|>", "<|extra_200|>", "<|extra_201|>", "<|image end|>")
    miss = [k for k in need if k not in vocab]
    if miss:
        raise ValueError(f"vocabulary lacks Emu3's image tokens {miss}")
    return ImageLayout(height, width, row_end=vocab["<|extra_200|>"],
                       header=(vocab["<|image start|>"], *size_ids, vocab["<|image token|>"]),
                       trailer=(vocab["<|extra_201|>"], vocab["<|image end|>"]))


class Emu3ImageLM(ImageTokenLM):
    """``Emu3ForConditionalGeneration`` over its VQ codes with Emu3's image layout. ``eos_id`` (appended
    to the trailer by ``image_sequence``) defaults to the text config's EOS."""

    def __init__(self, model, layout: ImageLayout, *, bos_id: int | None = None, eos_id: int | None = None):
        """``model``: a transformers ``Emu3ForConditionalGeneration``; codes 0..V-1 are its vocabulary map's visual
        tokens (LM ids (V,) from ``img2bpe``, image head the (V, D) rows of ``lm_head``); ``eos_id`` is appended
        to the ``layout`` trailer when missing; ``bos_id`` / ``eos_id`` default to the text config's. ValueError
        when the visual tokens do not name codes 0..V-1."""
        vm = model.vocabulary_mapping
        img2bpe = vm.img2bpe
        V = len(img2bpe)
        if sorted(img2bpe) != list(range(V)):
            raise ValueError(f"the vocabulary's visual tokens do not name codes 0..{V - 1}")
        ids = torch.tensor([img2bpe[k] for k in range(V)], dtype=torch.long)
        tc = model.config.text_config
        eos = tc.eos_token_id if eos_id is None else eos_id
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        if eos is not None and (not layout.trailer or layout.trailer[-1] != eos):
            layout = ImageLayout(layout.height, layout.width, layout.row_end, layout.header, (*layout.trailer, int(eos)))
        self.bos_id = tc.bos_token_id if bos_id is None else bos_id
        w = model.lm_head.weight[ids.to(model.lm_head.weight.device)]
        super().__init__(model, model.model.text_model, layout, ids, w, uncond="header")

    def rebuild_kwargs(self) -> dict:
        """Keyword arguments that rebuild this adapter around another Emu3 model (``ImageTokenLM.rebuild_kwargs``)."""
        return {"layout": self.layout, "bos_id": self.bos_id, "eos_id": self.layout.trailer[-1]}

    def _prompt(self, cond, cfg: bool) -> Prompt:
        p = cond if isinstance(cond, Prompt) else Prompt(cond)
        if cfg and p.uncond_ids is None and self.bos_id is not None:
            p = Prompt(p.ids, torch.tensor([self.bos_id]))
        return super()._prompt(p, cfg)


def emu3_decoder(model, layout: ImageLayout) -> CodeDecoder:
    """Pixels through transformers' ``decode_image_tokens`` on the complete image sequence."""
    H, W = layout.height, layout.width
    eol = torch.full((1, 1), layout.row_end, dtype=torch.long)
    bpe = torch.tensor([model.vocabulary_mapping.img2bpe[k] for k in range(len(model.vocabulary_mapping.img2bpe))])
    tail = torch.tensor([layout.trailer[-3:]], dtype=torch.long) if len(layout.trailer) >= 3 else None
    if tail is None:
        raise ValueError("Emu3's decode_image_tokens expects 3 trailing tokens (EOF, EOI, EOS) after the rows")

    def fn(codes):          # (B, H, W) codes -> the (B, H*(W+1) + 3) sequence transformers decodes
        B = codes.shape[0]
        rows = torch.cat([bpe[codes.cpu()], eol.expand(B, H, 1)], 2).reshape(B, -1)
        seq = torch.cat([rows, tail.expand(B, -1)], 1).to(model.device)
        return model.decode_image_tokens(image_tokens=seq, height=H, width=W)

    return CodeDecoder(fn, (H, W), model.model.vqmodel.quantize.embedding.weight.detach())


# --------------------------------------------------------------------------- tiny random configs

def _tiny_vocab(V: int, n_text: int = 48):
    vm = {"<|endoftext|>": 0, "<|extra_203|>": 1, "<|extra_204|>": 2}          # pad, bos, eos (Emu3 names)
    n = 3
    for nm in ("<|extra_200|>", "<|extra_201|>", "<|image start|>", "<|image end|>", "<|image token|>", "<image>"):
        vm[nm] = n
        n += 1
    for ch in "0123456789*":
        vm[ch] = n
        n += 1
    names = [f"<|visual token {k:06d}|>" for k in range(V)]
    order = torch.randperm(V, generator=torch.Generator().manual_seed(1234)).tolist()   # ids not in code order
    for j in order:
        vm[names[j]] = n
        n += 1
    text0 = n
    for t in range(n_text):
        vm[f"w{t}"] = n
        n += 1
    return vm, text0, n


def tiny_emu3(seed: int = 0, *, V: int = 64, side: int = 4, hidden: int = 64, layers: int = 3, heads: int = 4,
              init: bool = True, n_text: int = 48):
    """A tiny random ``Emu3ForConditionalGeneration`` (GQA Llama-like LM, V-code VQ with spatial factor
    2) and its layout (side x side); ``n_text`` text ids after the visual tokens (``real.realsize`` fills Emu3's
    184,622). Positions: at least 1,024, and room for the side x (side + 1) image tokens after a prompt. Returns
    (model, layout, text id range)."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    vm, text0, n = _tiny_vocab(V, n_text)
    cfg = Emu3Config(
        text_config=dict(vocab_size=n, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         max_position_embeddings=max(1024, side * (side + 1) + 128),
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, attention_dropout=0.0),
        vq_config=dict(codebook_size=V, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 2],
                       num_res_blocks=1, attn_resolutions=[], hidden_size=64, num_attention_heads=1,
                       temporal_downsample_factor=4),
        vocabulary_map=vm)
    torch.manual_seed(seed)
    m = Emu3ForConditionalGeneration(cfg).eval()
    if init:
        embedding_dominated_init(m, seed)
    size_ids = [vm[ch] for ch in f"{side}*{side}"]
    return m, emu3_layout(vm, side, side, size_ids), (text0, n)


def tiny_emu3_pair(seed: int = 0, draft: str = "layerskip", device="cpu", dtype=torch.float32, **kw):
    """(target, draft, text id range): draft ``layerskip`` (first layer), ``small`` (independent random
    1-layer, 32-wide LM over the same vocabulary) or ``eagle``."""

    return tiny_pair(tiny_emu3, Emu3ImageLM, seed, draft, device, dtype, kw, layer_key="text_model.layers",
                     set_layers=lambda c, n: setattr(c.text_config, "num_hidden_layers", n),
                     small_keys=("V", "side", "n_text"))


# --------------------------------------------------------------------------- real checkpoints

def load_emu3(path: str = EMU3_GEN_ID, *, ratio: str = "1:1", image_area: int | None = None, device="cpu",
              dtype=torch.bfloat16):
    """Emu3 in transformers format (``BAAI/Emu3-Gen-hf``) from a directory or a Hub id. The image size
    comes from the processor (``ratio``, ``image_area``). Returns (adapter, processor)."""
    from transformers import AutoConfig, Emu3ForConditionalGeneration, Emu3Processor

    cfg = AutoConfig.from_pretrained(path)
    if getattr(cfg, "model_type", None) != "emu3":
        raise ValueError(f"{path}: model_type {getattr(cfg, 'model_type', None)!r}, expected 'emu3' "
                         "(the transformers-format generator is BAAI/Emu3-Gen-hf)")
    m = hf_from_pretrained(Emu3ForConditionalGeneration, path, dtype=dtype)
    proc = Emu3Processor.from_pretrained(path)
    area = image_area if image_area is not None else 518400       # Emu3Processor's default (720 x 720 px)
    H, W = proc.calculate_generate_size(ratio, area, proc.downsample_ratio)
    tok = proc.tokenizer
    vocab = tok.get_vocab()
    hdr = tok(f"<|image start|>{H}*{W}<|image token|>", add_special_tokens=False)["input_ids"]
    if not hdr or hdr[0] != vocab.get("<|image start|>") or hdr[-1] != vocab.get("<|image token|>"):
        raise ValueError(f"{path}: the tokenizer does not keep Emu3's image header tokens whole: {hdr}")
    lay = emu3_layout(vocab, H, W, hdr[1:-1])
    return Emu3ImageLM(m.to(device).eval(), lay), proc


def emu3_prompt(processor, text: str, negative: str | None = None) -> Prompt:
    """A ``Prompt`` of BOS + text (the adapter appends the image header to both CFG rows)."""
    enc = lambda s: processor(text=[s], return_tensors="pt")["input_ids"][0]
    return Prompt(enc(text), None if negative is None else enc(negative))
