"""Janus / Janus-Pro (transformers ``JanusForConditionalGeneration``) as a ``real.protocol`` model.

Facts (checked on transformers 5.24 with tiny random configs, see tests/test_real_hf_models.py):
image logits come from a separate generation head (``model.model.generation_head``: Linear, GELU,
Linear to the 16384 codes) on the language model's post-norm hidden states, and the next input is the
generation embedding of the sampled code (``prepare_embeddings_for_image_generation`` =
``generation_aligner(generation_embeddings(code))``), not a text-vocabulary embedding. There are no
structural tokens inside the image: 24 x 24 codes for 384 px, the prompt ends with
``<begin_of_image>``. ``generate(generation_mode="image")`` runs its own loop with a (cond, uncond)
batch in which the uncond row is the prompt with every id except BOS and BOI replaced by the pad id
(same length, nothing masked), and combines the logits with ``ClassifierFreeGuidanceLogitsProcessor``
(uncond + scale * (cond - uncond), default scale 5). Pixels: ``model.decode_image_tokens`` (VQ decoder).

Here: the prompt and the codes share one id stream; ids >= the text vocabulary size mean code
``id - text_vocab`` and are embedded through the generation path (``ImageTokenLM.embed`` override).
"""
from __future__ import annotations

import torch

from .image_layout import ImageLayout
from .imagelm import ImageTokenLM
from .imagelm_eagle import tiny_pair
from .imagelm_loading import CodeDecoder, embedding_dominated_init, hf_from_pretrained

__all__ = ["JanusImageLM", "tiny_janus", "tiny_janus_pair", "load_janus", "janus_prompt", "janus_decoder",
           "JANUS_PRO_IDS"]

JANUS_PRO_IDS = {"1B": "deepseek-community/Janus-Pro-1B", "7B": "deepseek-community/Janus-Pro-7B"}


class JanusImageLM(ImageTokenLM):
    """``JanusForConditionalGeneration`` over its VQ codes (generation head / generation embeddings).

    cond: ``Prompt`` of prompt ids; ``boi_id`` is appended unless the prompt already ends with it.
    With CFG and no ``Prompt.uncond_ids``, the uncond row is Janus' own: the prompt with every id but
    ``bos_id`` / ``boi_id`` replaced by ``pad_id``."""

    def __init__(self, model, *, boi_id: int | None = None, pad_id: int | None = None, bos_id: int | None = None,
                 grid: tuple[int, int] | None = None):
        """``model``: a transformers ``JanusForConditionalGeneration``; its V = vq num_embeddings codes are fed as
        stream ids text_vocab + k (the generation embeddings) and scored by the generation head (logits
        (..., V)); ``boi_id`` / ``pad_id`` / ``bos_id`` default to the generation config's; ``grid`` (h, w)
        image tokens (default: the square of num_image_tokens). ValueError when boi / pad ids are unknown or the
        token count is not a square without ``grid``."""
        gc = model.generation_config
        boi = boi_id if boi_id is not None else (getattr(gc, "generation_kwargs", None) or {}).get("boi_token_id")
        pad = pad_id if pad_id is not None else gc.pad_token_id
        bos = bos_id if bos_id is not None else gc.bos_token_id
        if boi is None or pad is None:
            raise ValueError("Janus needs boi_id and pad_id (from generation_config.generation_kwargs['boi_token_id'] "
                             "and generation_config.pad_token_id, or passed explicitly)")
        self.text_vocab = int(model.config.text_config.vocab_size)
        V = int(model.config.vq_config.num_embeddings)
        if grid is None:
            n = int(model.config.vision_config.num_image_tokens)
            s = int(round(n ** 0.5))
            if s * s != n:
                raise ValueError(f"num_image_tokens {n} is not a square; pass grid=(h, w)")
            grid = (s, s)
        self._ids_kw = {"boi_id": int(boi), "pad_id": int(pad), "bos_id": bos, "grid": tuple(grid)}
        lay = ImageLayout(grid[0], grid[1], row_end=None, header=(int(boi),))
        keep = tuple(int(x) for x in (bos, boi) if x is not None)
        super().__init__(model, model.model.language_model, lay, self.text_vocab + torch.arange(V), None,
                         uncond="pad", pad_id=int(pad), keep_ids=keep)

    def rebuild_kwargs(self) -> dict:
        """Keyword arguments that rebuild this adapter around another Janus model (``ImageTokenLM.rebuild_kwargs``)."""
        return dict(self._ids_kw)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings (B, S, D) of model-stream ids (B, S): text ids through the language model's
        embeddings, code ids (text_vocab + k) through Janus' generation embeddings (aligner)."""
        is_code = ids >= self.text_vocab
        text = self.backbone.get_input_embeddings()(ids.masked_fill(is_code, 0))
        if not bool(is_code.any()):
            return text
        codes = self.model.prepare_embeddings_for_image_generation((ids - self.text_vocab).clamp(min=0))
        return torch.where(is_code[..., None], codes.to(text.dtype), text)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits (..., V) over the image codes from last hidden states (..., D) through Janus'
        generation head."""
        gh = self.model.model.generation_head
        return gh(hidden.to(gh.proj_out.weight.dtype)).float()

    def code_embeddings(self) -> torch.Tensor:
        """(V, D) generation-input embedding of every code (for EAGLE drafters)."""
        V = self.vocab_size
        return self.model.prepare_embeddings_for_image_generation(torch.arange(V, device=self.device)).detach()

    def image_sequence(self, codes: torch.Tensor) -> torch.Tensor:
        """Janus has no structural image tokens: boi, then the codes (as code indices, not text ids)."""
        c = torch.as_tensor(codes, dtype=torch.long).reshape(-1).cpu()
        return torch.cat([torch.tensor(self.layout.header), c])


def janus_decoder(model) -> CodeDecoder:
    """Pixels through transformers' ``decode_image_tokens`` (the Janus VQ decoder), (B, 3, H, W)."""
    dims = model.model.vqmodel.quantize.quant_state_dims
    grid = (int(dims[0]), int(dims[1]))
    return CodeDecoder(lambda c: model.decode_image_tokens(c.flatten(1).to(model.device)).permute(0, 3, 1, 2),
                       grid, model.model.vqmodel.quantize.embedding.weight.detach())


# --------------------------------------------------------------------------- tiny random configs

def tiny_janus(seed: int = 0, *, V: int = 64, side: int = 4, hidden: int = 64, layers: int = 3, heads: int = 4,
               text_vocab: int = 96, init: bool = True):
    """A tiny random ``JanusForConditionalGeneration``: Llama LM (``text_vocab`` ids: 0 pad, 1 bos,
    2 eos, 3 boi, text from 4), V-code VQ (ds 2), side x side image tokens. Positions: at least 512, and room for
    the side x side image tokens after a prompt."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    cfg = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=text_vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=max(512, side * side + 128), pad_token_id=0, bos_token_id=1, eos_token_id=2),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=8 * side,
                           patch_size=8, projection_dim=hidden, num_image_tokens=side * side, depth=1, mlp_ratio=2),
        vq_config=dict(embed_dim=8, num_embeddings=V, latent_channels=32, base_channels=32, channel_multiplier=[1, 2],
                       num_res_blocks=1, num_patches=side, projection_dim=hidden, image_token_embed_dim=hidden,
                       num_hidden_layers=2),
        image_token_id=text_vocab - 1)
    torch.manual_seed(seed)
    m = JanusForConditionalGeneration(cfg).eval()
    m.generation_config.bos_token_id, m.generation_config.pad_token_id = 1, 0
    m.generation_config.generation_kwargs = {"boi_token_id": 3}
    if init:
        embedding_dominated_init(m, seed)
    return m, (4, text_vocab - 1)


def tiny_janus_pair(seed: int = 0, draft: str = "layerskip", device="cpu", dtype=torch.float32, **kw):
    """(target, draft, text id range): draft ``layerskip`` (first LM layer), ``small`` (independent
    random Janus with a 1-layer, 32-wide LM; same codes and text ids) or ``eagle``."""

    return tiny_pair(tiny_janus, JanusImageLM, seed, draft, device, dtype, kw, layer_key="language_model.layers",
                     set_layers=lambda c, n: setattr(c.text_config, "num_hidden_layers", n),
                     small_keys=("V", "side", "text_vocab"))


# --------------------------------------------------------------------------- real checkpoints

def load_janus(path: str = JANUS_PRO_IDS["7B"], *, device="cpu", dtype=torch.bfloat16):
    """Janus(-Pro) in transformers format (``deepseek-community/Janus-Pro-1B`` / ``-7B``; the
    ``deepseek-ai/*`` repositories hold the original, non-transformers layout) from a directory or a Hub
    id. Returns (adapter, processor or None). Missing / unexpected / mis-shaped keys -> ValueError."""
    from transformers import AutoConfig, JanusForConditionalGeneration

    cfg = AutoConfig.from_pretrained(path)
    if getattr(cfg, "model_type", None) != "janus":
        raise ValueError(f"{path}: model_type {getattr(cfg, 'model_type', None)!r}, expected 'janus' "
                         "(transformers-format checkpoints are deepseek-community/Janus-Pro-*)")
    m = hf_from_pretrained(JanusForConditionalGeneration, path, dtype=dtype)
    try:
        from transformers import JanusProcessor

        proc = JanusProcessor.from_pretrained(path)
    except Exception:  # a weights-only directory: prompts must then come as ids
        proc = None
    return JanusImageLM(m.to(device).eval(), boi_id=_boi_id(path, m, proc)), proc


def _boi_id(path: str, model, processor) -> int:
    """<begin_of_image>: generation_config.generation_kwargs (dropped by GenerationConfig loading in
    5.24 when the file says _from_model_config), the raw generation_config.json, or the tokenizer."""
    import json
    import os

    kw = getattr(model.generation_config, "generation_kwargs", None) or {}
    if "boi_token_id" in kw:
        return int(kw["boi_token_id"])
    f = os.path.join(path, "generation_config.json")
    if os.path.exists(f):
        with open(f) as fh:
            raw = json.load(fh)
        if "boi_token_id" in (raw.get("generation_kwargs") or {}):
            return int(raw["generation_kwargs"]["boi_token_id"])
    if processor is not None:
        tid = processor.tokenizer.convert_tokens_to_ids("<begin_of_image>")
        if tid is not None and tid != processor.tokenizer.unk_token_id:
            return int(tid)
    raise ValueError(f"{path}: cannot find Janus' <begin_of_image> id (generation_config generation_kwargs or tokenizer)")


def janus_prompt(processor, text: str):
    """A ``Prompt`` through Janus' chat template in image-generation mode (ends with boi)."""
    from real.protocol import Prompt

    msgs = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    prompt = processor.apply_chat_template(msgs, add_generation_prompt=True)
    ids = processor(text=prompt, generation_mode="image", return_tensors="pt")["input_ids"][0]
    return Prompt(ids)
