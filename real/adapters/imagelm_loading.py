"""Loading helpers for the multimodal LMs of ``real.adapters.imagelm`` (Chameleon / Lumina-mGPT, Janus, Emu3):
checked ``from_pretrained``, layer-skip copies, the seeded initialisation of tiny test models, and
``CodeDecoder`` (codes -> pixels for ``coolsd generate --save``).
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["hf_loading_errors", "hf_from_pretrained", "truncated_hf", "embedding_dominated_init", "CodeDecoder"]


def hf_loading_errors(info: dict, *, allow_missing: tuple[str, ...] = (), what: str = "checkpoint") -> None:
    """Raise ValueError naming missing / unexpected / mismatched keys from transformers'
    ``output_loading_info`` (keys containing any of ``allow_missing`` may be missing: parts of a
    multimodal checkpoint that image generation does not use)."""
    missing = [k for k in info.get("missing_keys", []) if not any(s in k for s in allow_missing)]
    unexpected = list(info.get("unexpected_keys", []))
    bad = [f"{x[0]}: checkpoint {tuple(x[1])} vs model {tuple(x[2])}" if isinstance(x, tuple) and len(x) == 3 else str(x)
           for x in info.get("mismatched_keys", [])]
    if missing or unexpected or bad:
        def fmt(name, items):
            return f"\n  {name} ({len(items)}): " + ", ".join(map(str, items[:12])) + (" ..." if len(items) > 12 else "") if items else ""
        raise ValueError(f"{what} does not match the model class:" + fmt("missing keys", missing)
                         + fmt("unexpected keys", unexpected) + fmt("bad shapes", bad))


def hf_from_pretrained(cls, path: str, *, allow_missing: tuple[str, ...] = (), **kw):
    """``cls.from_pretrained(path, **kw)`` that refuses a checkpoint that does not fit: missing,
    unexpected or mis-shaped keys raise one ValueError naming them (transformers would re-initialise
    missing weights with a warning)."""
    m, info = cls.from_pretrained(path, output_loading_info=True, ignore_mismatched_sizes=True, **kw)
    hf_loading_errors(info, allow_missing=allow_missing, what=str(path))
    return m.eval()


def truncated_hf(model, n_layers: int, layer_key: str, config_setter):
    """A layer-skip draft: a copy of transformers ``model`` with only its first ``n_layers`` decoder
    layers (keys ``{layer_key}.{i}.*``), everything else shared by value (embeddings, norm, heads, VQ).
    ``config_setter(config, n)`` sets the layer count on a deep copy of the config."""
    import copy

    cfg = copy.deepcopy(model.config)
    config_setter(cfg, n_layers)
    old = torch.get_default_dtype()
    torch.set_default_dtype(model.dtype)      # build where the weights live (no CPU float32 copy of a 7B head)
    try:
        with torch.device(model.device):
            d = type(model)(cfg).eval()
    finally:
        torch.set_default_dtype(old)
    d.generation_config = copy.deepcopy(model.generation_config)
    pre = layer_key + "."
    sd = {k: v for k, v in model.state_dict().items()
          if pre not in k or int(k.split(pre, 1)[1].split(".")[0]) < n_layers}
    missing, unexpected = d.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"layer-skip copy does not match: missing {missing[:6]}, unexpected {unexpected[:6]}")
    return d.to(model.device, model.dtype)


@torch.no_grad()
def embedding_dominated_init(model: nn.Module, seed: int, *, embed_std: float = 1.0, head_std: float = 0.2,
                             std: float = 0.05, embed_keys=("embed_tokens", "generation_embeddings"),
                             head_keys=("lm_head", "vision_head")) -> nn.Module:
    """Seeded random weights for tiny test models whose residual stream is dominated by the token
    embedding (norm weights 1, norm biases 0, embeddings N(0, embed_std), heads N(0, head_std), the rest
    N(0, std)): a layer-skip draft then agrees with the target often and acceptance rates differ by
    method, like ``real.adapters.hf.hf_llama_pair``. VQ / vision towers keep their default init."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "vqmodel" in name or "vision_model" in name:
            continue
        if "norm" in name:
            p.fill_(1.0 if name.endswith("weight") else 0.0)
        elif any(k in name for k in embed_keys):
            p.copy_(torch.randn(p.shape, generator=g) * embed_std)
        elif any(k in name for k in head_keys):
            p.copy_(torch.randn(p.shape, generator=g) * head_std)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


# --------------------------------------------------------------------------- decoding

class CodeDecoder:
    """``decode_code(codes (B, T)) -> images (B, 3, H, W)`` in [-1, 1] for ``coolsd generate --save``,
    from a function ``fn(codes (B, h, w)) -> (B, 3, H, W)`` and the code ``grid`` (h, w);
    ``codebook`` (V, d) feeds LANTERN's neighbour tables."""

    def __init__(self, fn, grid: tuple[int, int], codebook: torch.Tensor | None = None):
        """``fn(codes (B, h, w) int64) -> images (B, 3, H, W)``; ``grid`` (h, w); ``codebook`` (V, d) or None."""
        self.fn, self.grid, self.codebook = fn, grid, codebook

    @torch.no_grad()
    def decode_code(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, h*w) or (h*w,) -> float32 images (B, 3, H, W) clamped to [-1, 1]."""
        c = torch.as_tensor(codes, dtype=torch.long)
        if c.ndim == 1:
            c = c[None]
        h, w = self.grid
        if c.shape[-1] != h * w:
            raise ValueError(f"{c.shape[-1]} codes do not fill the {h} x {w} grid")
        return self.fn(c.view(-1, h, w)).float().clamp(-1, 1)
