"""Reading published checkpoints and loading them strictly, with errors that name what is wrong.

Upstream LlamaGen / VQ / LANTERN files come as ``.pt`` / ``.bin`` pickles (the state dict raw, or
under ``"model"`` (DDP), ``"module"`` (DeepSpeed) or ``"state_dict"``) or as ``.safetensors``.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Iterable, Mapping

import torch
from torch import nn

__all__ = ["read_checkpoint", "extract_state_dict", "load_checked"]

STATE_KEYS = ("model", "module", "state_dict")


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """Load a checkpoint file without executing arbitrary pickled code.

    ``.safetensors`` through safetensors; anything else through ``torch.load(weights_only=True)``
    with ``argparse.Namespace`` allowed (LlamaGen training checkpoints store their ``args``).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"checkpoint file not found: {path}")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path, device=str(map_location))
    with torch.serialization.safe_globals([argparse.Namespace]):
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except Exception as e:  # pickle with foreign objects: say so instead of executing it
            raise ValueError(f"{path}: not loadable as a weights-only checkpoint ({e}). If you trust the file, "
                             "load it yourself with torch.load(..., weights_only=False) and pass the state dict.") from e


def extract_state_dict(obj: Any) -> dict[str, torch.Tensor]:
    """The state dict inside a loaded checkpoint: under "model", "module" or "state_dict", or raw."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"checkpoint is a {type(obj).__name__}, expected a dict of tensors")
    for k in STATE_KEYS:
        if k in obj and isinstance(obj[k], Mapping):
            return dict(obj[k])
    if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return dict(obj)
    raise ValueError(f"no state dict found in checkpoint (looked under {STATE_KEYS} and for a raw dict of tensors); "
                     f"top-level keys: {sorted(map(str, obj))[:10]}")


def load_checked(module: nn.Module, state: Mapping[str, torch.Tensor], *, ignore: Iterable[str] = (),
                 what: str = "checkpoint", max_listed: int = 12) -> None:
    """``module.load_state_dict(state)`` that fails with one ValueError naming every missing key,
    unexpected key and shape mismatch (up to ``max_listed`` of each). Keys containing any substring in
    ``ignore`` are dropped from the checkpoint first (runtime buffers some trainers saved)."""
    ignore = tuple(ignore)
    state = {k: v for k, v in state.items() if not any(s in k for s in ignore)}
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    bad = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
           for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or bad:
        def fmt(name, items):
            if not items:
                return ""
            more = f" (+{len(items) - max_listed} more)" if len(items) > max_listed else ""
            return f"\n  {name} ({len(items)}): " + ", ".join(items[:max_listed]) + more
        raise ValueError(f"{what} does not match {type(module).__name__}:" + fmt("missing keys", missing)
                         + fmt("unexpected keys", unexpected) + fmt("bad shapes", bad))
    module.load_state_dict(state, strict=True)
