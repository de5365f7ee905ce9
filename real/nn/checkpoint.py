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

__all__ = ["read_checkpoint", "extract_state_dict", "load_checked", "check_finite", "sha256_file", "verify_sha256",
           "PINNED_SHA256", "pinned_sha256", "verify_pinned", "load_captions"]

STATE_KEYS = ("model", "module", "state_dict")

# sha256 of the published checkpoints the registry names, keyed "hub repo/file name" (as torchvision pins
# its weights). Only values taken from the publisher (the Hugging Face LFS pointer "oid sha256:" of the
# file) belong here; no published value could be found for the LlamaGen, VQ-16 and LANTERN releases
# when this table was written (docs/errors.md, "Checkpoints"), so it is empty and downloads of those are
# not verified. Add "repo/file": "hex" lines as they become known; the check runs after each download
# (``verify_pinned``, to be called by ``real.models.llamagen_io.download``).
PINNED_SHA256: dict[str, str] = {}


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks (constant memory)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def verify_sha256(path: str | os.PathLike, expected: str, what: str = "checkpoint") -> str:
    """Raise ValueError naming the file when its sha256 is not ``expected``; return the path."""
    got = sha256_file(path)
    if got.lower() != expected.lower():
        raise ValueError(f"{what} {os.fspath(path)} is corrupt or not the published file: sha256 {got}, expected "
                         f"{expected} (delete it and download again)")
    return os.fspath(path)


def pinned_sha256(repo: str, filename: str) -> str | None:
    """The pinned sha256 of a published file, or None when none is known."""
    return PINNED_SHA256.get(f"{repo}/{filename}")


def verify_pinned(path: str | os.PathLike, repo: str, filename: str) -> str:
    """Check a downloaded published file against its pinned sha256 (when one is known); return the path.
    Hook for ``real.models.llamagen_io.download``: ``return verify_pinned(hf_hub_download(repo, file, ...), repo, file)``."""
    expected = pinned_sha256(repo, filename)
    if expected is not None:
        verify_sha256(path, expected, what=f"{repo}/{filename}")
    return os.fspath(path)


def check_finite(state: Mapping[str, torch.Tensor], what: str = "checkpoint", max_listed: int = 8) -> None:
    """Every floating-point tensor of a state dict is finite (NaN / inf weights are a corrupt file,
    not a model): ValueError naming the tensors otherwise."""
    bad = [k for k, v in state.items()
           if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())
           and not bool(torch.isfinite(v).all())]
    if bad:
        more = f" (+{len(bad) - max_listed} more)" if len(bad) > max_listed else ""
        raise ValueError(f"{what} has NaN or infinite values in {len(bad)} tensor(s): "
                         + ", ".join(bad[:max_listed]) + more)


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """Load a checkpoint file without executing arbitrary pickled code.

    ``.safetensors`` through safetensors; anything else through ``torch.load(weights_only=True)``
    with ``argparse.Namespace`` allowed (LlamaGen training checkpoints store their ``args``).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"checkpoint file not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"checkpoint {path} is a directory, expected a file")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        try:
            return load_file(path, device=str(map_location))
        except Exception as e:  # SafetensorError (truncated or garbled header), OSError: name the file
            raise ValueError(f"{path}: not a readable safetensors file ({type(e).__name__}: "
                             f"{_first_line(e)})") from e
    with torch.serialization.safe_globals([argparse.Namespace]):
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except Exception as e:  # pickle with foreign objects: say so instead of executing it
            raise ValueError(f"{path}: not loadable as a weights-only checkpoint ({type(e).__name__}: "
                             f"{_first_line(e)}): a damaged file, or pickled objects; if you trust the file, load it "
                             "yourself with torch.load(..., weights_only=False) and pass the state dict") from e


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
    ``ignore`` are dropped from the checkpoint first (runtime buffers some trainers saved). Every
    floating tensor must be finite (``check_finite``)."""
    ignore = tuple(ignore)
    state = {k: v for k, v in state.items() if not any(s in k for s in ignore)}
    check_finite(state, what)
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


def _first_line(e: BaseException) -> str:
    """The informative line of an exception's message: torch's weights-only load errors run to six lines of
    advice with the cause after "WeightsUnpickler error:"; otherwise the first non-empty line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for i, ln in enumerate(lines[:-1]):
        if ln.endswith("WeightsUnpickler error:"):
            return lines[i + 1][:200]
    return (lines[0] if lines else type(e).__name__)[:200]


def load_captions(path: str | os.PathLike, option: str = "--captions") -> list:
    """A captions file (t2i conditions), checked: a torch file (weights-only) holding a non-empty list
    of {'embedding': (P, C) finite float tensor, 'mask': (P,) optional} dicts, all of the same shape.
    Errors name ``option`` and the file."""
    where = f"{option}: {os.fspath(path)!r}"
    if not os.path.isfile(path):
        raise ValueError(f"{where} is not an existing file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # garbage, truncated file, pickled foreign objects
        raise ValueError(f"{where} is not a weights-only torch file ({type(e).__name__}: {_first_line(e)})") from None
    if not isinstance(obj, (list, tuple)) or not obj:
        empty = " (empty)" if isinstance(obj, (list, tuple)) else ""
        raise ValueError(f"{where} must hold a non-empty list of {{'embedding', 'mask'}} dicts, "
                         f"got {type(obj).__name__}{empty}")
    shape = None
    for i, c in enumerate(obj):
        e = c.get("embedding") if isinstance(c, dict) else None
        if not isinstance(e, torch.Tensor) or e.ndim != 2 or not e.is_floating_point():
            raise ValueError(f"{where}: entry {i} needs 'embedding', a 2-D float tensor (P, C)")
        if not bool(torch.isfinite(e).all()):
            raise ValueError(f"{where}: entry {i} has NaN or infinite embedding values")
        if shape is not None and tuple(e.shape) != shape:
            raise ValueError(f"{where}: entry {i} has shape {tuple(e.shape)}, entry 0 {shape}")
        shape = tuple(e.shape)
        m = c.get("mask")
        if m is not None and (not isinstance(m, torch.Tensor) or tuple(m.shape) != (e.shape[0],)):
            raise ValueError(f"{where}: entry {i} has a 'mask' that is not a ({e.shape[0]},) tensor")
    return list(obj)
