"""LlamaGen's published checkpoints and caption conditions: ``PRETRAINED`` (name -> Hugging Face repo,
file, config), ``download`` (fetch and check a pinned checkpoint), ``t5_captions`` (flan-t5 features
as ``Caption`` conditions) and ``left_pad_caption`` (upstream's t2i caption preprocessing).
Re-exported by ``real.models.llamagen``, where the model and ``load_llamagen`` live.
"""
from __future__ import annotations

import torch

from real.nn.checkpoint import verify_pinned
from real.protocol import Caption

__all__ = ["PRETRAINED", "download", "t5_captions", "left_pad_caption"]


def left_pad_caption(embedding: torch.Tensor, mask: torch.Tensor) -> Caption:
    """Upstream t2i preprocessing of one caption: move the valid (first ``mask.sum()``) rows of the
    (N, C) T5 features to the end, zero the padding, flip the mask accordingly."""
    mask = mask.to(torch.bool).reshape(-1)
    n = int(mask.sum())
    if n == 0:
        raise ValueError("caption has no valid token")
    if not bool(mask[:n].all()):
        raise ValueError("caption mask must be right-padded (valid tokens first), as produced by a T5 tokenizer")
    emb = torch.cat([embedding[n:], embedding[:n]])
    new_mask = torch.flip(mask, dims=[0])
    return Caption(emb * new_mask[:, None].to(emb.dtype), new_mask)


def t5_captions(prompts: list[str], model: str = "google/flan-t5-xl", *, max_length: int = 120, device="cpu",
                dtype=torch.float32, encoder=None, tokenizer=None) -> list[Caption]:
    """Caption conditions from flan-t5 (transformers; needs the weights locally or network): one
    ``Caption`` per prompt, embedding (max_length, C) left-padded (``left_pad_caption``), mask (max_length,).
    Pass ``encoder``/``tokenizer`` objects to reuse loaded ones."""
    try:
        from transformers import AutoTokenizer, T5EncoderModel
    except ImportError as e:  # pragma: no cover - transformers is an optional extra
        raise NotImplementedError("t5_captions needs transformers (pip install coolsd[transformers]); "
                                  "otherwise pass precomputed Caption embeddings") from e
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
    encoder = encoder or T5EncoderModel.from_pretrained(model, torch_dtype=dtype).to(device).eval()
    enc = tokenizer(prompts, max_length=max_length, padding="max_length", truncation=True, return_tensors="pt")
    with torch.no_grad():
        feats = encoder(input_ids=enc.input_ids.to(device), attention_mask=enc.attention_mask.to(device)).last_hidden_state
    return [left_pad_caption(f, m) for f, m in zip(feats, enc.attention_mask.to(device))]


# published checkpoints (Hugging Face hub): name -> (repo, file, config name, kwargs)
PRETRAINED = {
    "c2i-B-256": ("FoundationVision/LlamaGen", "c2i_B_256.pt", "B", dict(image_size=256)),
    "c2i-B-384": ("FoundationVision/LlamaGen", "c2i_B_384.pt", "B", dict(image_size=384)),
    "c2i-L-256": ("FoundationVision/LlamaGen", "c2i_L_256.pt", "L", dict(image_size=256)),
    "c2i-L-384": ("FoundationVision/LlamaGen", "c2i_L_384.pt", "L", dict(image_size=384)),
    "c2i-XL-384": ("FoundationVision/LlamaGen", "c2i_XL_384.pt", "XL", dict(image_size=384)),
    "c2i-XXL-384": ("FoundationVision/LlamaGen", "c2i_XXL_384.pt", "XXL", dict(image_size=384)),
    "t2i-XL-256": ("peizesun/llamagen_t2i", "t2i_XL_stage1_256.pt", "XL", dict(image_size=256, model_type="t2i")),
    "t2i-XL-512": ("peizesun/llamagen_t2i", "t2i_XL_stage2_512.pt", "XL", dict(image_size=512, model_type="t2i")),
    "vq-c2i": ("FoundationVision/LlamaGen", "vq_ds16_c2i.pt", "VQ-16", {}),
    "vq-t2i": ("peizesun/llamagen_t2i", "vq_ds16_t2i.pt", "VQ-16", {}),
}


def download(name: str, cache_dir: str | None = None) -> str:
    """Path of a published checkpoint, fetched with huggingface_hub (needs network the first time)."""
    if name not in PRETRAINED:
        raise ValueError(f"unknown checkpoint {name!r}; choose from {sorted(PRETRAINED)}")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as e:  # pragma: no cover
        raise NotImplementedError("download needs huggingface_hub (pip install coolsd[transformers])") from e
    repo, file, _, _ = PRETRAINED[name]
    return verify_pinned(hf_hub_download(repo, file, cache_dir=cache_dir), repo, file)
