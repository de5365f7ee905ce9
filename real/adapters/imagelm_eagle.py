"""EAGLE drafters for the multimodal LMs of ``real.adapters.imagelm``: ``AdapterEagle`` (a ``real.models.eagle``
drafter whose head is the target's image head), a fresh one sized to a target (``eagle_for``), one
saved in LANTERN's layout (``load_adapter_eagle``), and the draft of the ``tiny_*_pair`` test pairs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import json
import os

import torch

from real.nn.checkpoint import extract_state_dict, load_checked, read_checkpoint
from real.models.eagle import EagleConfig, EagleDrafter
from real.protocol import make_draft

if TYPE_CHECKING:                       # annotations only: imagelm imports this module's users
    from .imagelm import ImageTokenLM

# ``ImageTokenLM`` in annotations is real.adapters.imagelm's adapter (not imported: real.adapters.imagelm imports this module)

__all__ = ["AdapterEagle", "eagle_for", "load_adapter_eagle", "tiny_draft", "tiny_pair"]


class AdapterEagle(EagleDrafter):
    """``real.models.eagle.EagleDrafter`` drafting through an ``ImageTokenLM``'s image head (code rows of
    the LM head, or Janus' generation head); ``embed_tokens`` holds the V code input embeddings."""

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits (..., V) over the image codes from drafter hidden states (..., D)."""
        return self._head[0](hidden)


def tiny_draft(target: ImageTokenLM, kind: str, seed: int, *, layerskip, small):
    """The draft of a ``tiny_*_pair``: ``layerskip`` / ``small`` call the given builders (the target's
    first layer; an independent random 1-layer model), ``eagle`` a fresh EAGLE-1 head on the target
    (seed + 1)."""
    return make_draft(kind, {"layerskip": layerskip, "small": small, "eagle": lambda: eagle_for(target, seed=seed + 1)})


def tiny_pair(factory, wrap, seed: int, draft: str, device, dtype, kw: dict, *, layer_key: str,
              set_layers, small_keys: tuple[str, ...] = ("V", "side")):
    """(target adapter, draft adapter, text id range) of a ``tiny_*_pair``. ``factory(seed, **kw)`` builds
    a tiny random transformers model and returns (model, *rest, text id range) (``rest``: the layout,
    or nothing); ``wrap(model, *rest)`` makes the ``ImageTokenLM`` adapter. Drafts as ``tiny_draft``:
    the target's first layer (``truncated_hf`` with ``layer_key`` and ``set_layers(config, n)``), an
    independent random 1-layer, 32-wide model ``factory(seed + 1, ...)`` sharing the target's
    ``small_keys`` arguments, or a fresh EAGLE-1 head."""
    from .imagelm_loading import truncated_hf

    m, *rest, text = factory(seed, **kw)
    m = m.to(device, dtype)
    t = wrap(m, *rest)
    small_kw = {k: v for k, v in kw.items() if k in small_keys}
    d = tiny_draft(t, draft, seed,
                   layerskip=lambda: wrap(truncated_hf(m, 1, layer_key, set_layers), *rest),
                   small=lambda: wrap(factory(seed + 1, hidden=32, layers=1, heads=2, **small_kw)[0].to(device, dtype),
                                      *rest))
    return t, d, text


def eagle_for(target: ImageTokenLM, *, num_layers: int = 1, seed: int = 0, std: float = 0.02):
    """A fresh EAGLE-1 drafter (``real.models.eagle`` layout) for an ``ImageTokenLM`` target: hidden size,
    heads and MLP width of the target's decoder, 2-D RoPE over the H x W grid (a non-square code stream, such as
    GLM-Image's two grids, is laid on the smallest square grid that holds it: the drafter's own positions),
    embeddings = the target's code input embeddings, head = the target's image head (frozen). Train it
    with ``real.models.eagle.record_features`` + ``train_eagle``."""
    import math

    lay = target.layout
    side = lay.height if lay.height == lay.width else math.isqrt(lay.num_tokens - 1) + 1
    bc = target.backbone.config
    c = EagleConfig(hidden_size=bc.hidden_size, intermediate_size=bc.intermediate_size,
                    num_attention_heads=bc.num_attention_heads, vocab_size=target.vocab_size,
                    block_size=side * side, num_key_value_heads=getattr(bc, "num_key_value_heads", None),
                    num_hidden_layers=num_layers, rope_base=float(_rope_theta(bc)))
    d = AdapterEagle(c, target.head).to(target.device)
    return d.init_weights(target.code_embeddings(), seed, std).to(target.dtype).eval()


def load_adapter_eagle(directory: str, target: ImageTokenLM):
    """An EAGLE drafter saved with ``real.models.eagle.save_lantern_drafter`` (config.json + weights) for an
    ``ImageTokenLM`` target; key / shape mismatches raise ValueError naming them."""
    cfg_path = os.path.join(directory, "config.json")
    if not os.path.exists(cfg_path):
        raise ValueError(f"{directory}: no config.json")
    with open(cfg_path) as f:
        c = EagleConfig.from_lantern_json(json.load(f))
    if c.vocab_size != target.vocab_size or c.hidden_size != target.hidden_size:
        raise ValueError(f"{directory}: drafter (V={c.vocab_size}, D={c.hidden_size}) does not fit the target "
                         f"(V={target.vocab_size}, D={target.hidden_size})")
    for name in ("model.safetensors", "pytorch_model.bin"):
        w = os.path.join(directory, name)
        if os.path.exists(w):
            break
    else:
        raise ValueError(f"{directory}: neither model.safetensors nor pytorch_model.bin found")
    d = AdapterEagle(c, target.head)
    load_checked(d, extract_state_dict(read_checkpoint(w)), ignore=("rotary_emb",), what="EAGLE drafter checkpoint")
    return d.to(device=target.device, dtype=target.dtype).eval()


def _rope_theta(cfg) -> float:
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        return rp["rope_theta"]
    return getattr(cfg, "rope_theta", 10000.0)
