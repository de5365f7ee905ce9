"""An EAGLE-1 drafter for any registered target: a fresh one sized to it, written in the layout ``--drafter-dir``
loads (LANTERN's release layout: ``config.json`` + ``model.safetensors``) with our manifest, and read back with every
mismatch refused in one line.

* ``fresh_drafter(target, layers=1, seed=0)``: a new head on ``target`` (our ``real.models.llamagen.LlamaGen``, the
  shipped zoo models included, or a ``real.adapters.batched_imagelm.BatchedImageLM`` / family adapter: Chameleon /
  Lumina-mGPT, Janus(-Pro), Emu3, GLM-Image): hidden size, heads and MLP width of the target's decoder, its code
  embeddings (frozen), its own LM head (frozen, not stored).
* ``save_drafter(directory, drafter, manifest)``: atomically (a temporary sibling renamed into place).
* ``load_drafter(directory, target, model=None)``: the manifest (when present: files written here) must name the same
  model and target fingerprint; the config must fit the target (hidden size, vocabulary, image grid); the weights
  must have exactly the drafter's keys and shapes. ValueError naming the reason otherwise.
* ``target_fingerprint(target)``: sha256 over the target's parameter names, shapes, dtypes and first 4,096 values
  each (cheap at 7B, and different for differently seeded random targets).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil

import numpy as np
import torch

__all__ = ["MANIFEST", "fresh_drafter", "save_drafter", "load_drafter", "target_fingerprint", "target_module",
           "drafter_fits"]

MANIFEST = "coolsd_drafter.json"     # our manifest beside LANTERN's config.json (a release directory has none)
SAMPLED = 4096                       # values of each parameter the fingerprint reads


def _family(target):
    """The family adapter behind a batched image-LM target, or None for our LlamaGen."""
    from real.models.llamagen import LlamaGen

    if isinstance(target, LlamaGen):
        return None
    fam = getattr(target, "family", target)
    if not hasattr(fam, "code_embeddings") or not hasattr(fam, "layout"):
        raise ValueError(f"no EAGLE drafter can be made for a {type(target).__name__} target: EAGLE heads exist for "
                         "LlamaGen targets and the image-LM adapters (real.adapters)")
    return fam


def target_module(target) -> torch.nn.Module:
    """The ``nn.Module`` holding the target's weights (the family's transformers model for adapters)."""
    fam = _family(target)
    if fam is None:
        return target
    m = getattr(fam, "model", None)
    if isinstance(m, torch.nn.Module):
        return m
    stack = getattr(fam, "stack", None)
    if isinstance(stack, torch.nn.Module):
        return stack
    raise ValueError(f"{type(fam).__name__}: no module holds the target's weights")


def target_fingerprint(target) -> str:
    """Hex sha256 of the target's parameters: name, shape, dtype and the first ``SAMPLED`` values of each (module
    docstring)."""
    h = hashlib.sha256()
    mod = target_module(target)
    for name, p in sorted(mod.state_dict().items()):
        t = p.detach().reshape(-1)[:SAMPLED].to("cpu", torch.float32)
        h.update(f"{name}|{tuple(p.shape)}|{p.dtype}|".encode())
        h.update(np.ascontiguousarray(t.numpy()).tobytes())
    return h.hexdigest()


def fresh_drafter(target, *, layers: int = 1, seed: int = 0, std: float = 0.02):
    """A new EAGLE-1 head on ``target`` (module docstring), weights N(0, std^2) from ``seed``, ``layers`` decoder
    layers (EAGLE-1's release: 1)."""
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers must be an int >= 1, got {layers!r}")
    fam = _family(target)
    if fam is None:
        from real.models.eagle import EagleDrafter

        return EagleDrafter.from_target(target, num_layers=layers, seed=seed, std=std)
    from real.adapters.imagelm_eagle import eagle_for

    return eagle_for(fam, num_layers=layers, seed=seed, std=std)


def drafter_fits(config, target) -> str | None:
    """Why a drafter of ``config`` (a ``real.models.eagle.EagleConfig``) cannot draft for ``target``, or None."""
    fam = _family(target)
    if fam is None:
        tc = target.config
        want = {"hidden_size": tc.dim, "vocab_size": target.vocab_size, "block_size": tc.block_size}
    else:
        ref = fresh_drafter(target).config
        want = {"hidden_size": ref.hidden_size, "vocab_size": ref.vocab_size, "block_size": ref.block_size}
    bad = [f"{k} {getattr(config, k)} (the target needs {v})" for k, v in want.items() if getattr(config, k) != v]
    return None if not bad else "its " + ", ".join(bad)


def save_drafter(directory, drafter, manifest: dict) -> pathlib.Path:
    """Write ``drafter`` (config.json + model.safetensors, LANTERN's layout) and ``manifest`` (``MANIFEST``, with the
    weights' sha256 added) into ``directory``, atomically: a half-written directory never exists under that name."""
    from real.models.eagle import save_lantern_drafter
    from real.nn.checkpoint import sha256_file

    out = pathlib.Path(directory)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    save_lantern_drafter(drafter, str(tmp))
    m = dict(manifest, weights_sha256=sha256_file(tmp / "model.safetensors"))
    (tmp / MANIFEST).write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    if old.exists():
        shutil.rmtree(old)
    return out


def load_drafter(directory, target, model: str | None = None):
    """The drafter saved in ``directory`` on ``target`` (module docstring), in the target's device and dtype, eval
    mode, frozen. ``model``: the registered model name the target was built as (checked against our manifest)."""
    from real.models.eagle import EagleConfig
    from real.nn.checkpoint import extract_state_dict, load_checked, read_checkpoint, sha256_file

    d = pathlib.Path(directory)
    cfg = d / "config.json"
    if not cfg.is_file():
        raise ValueError(f"--drafter-dir {str(d)!r}: no config.json (not an EAGLE drafter directory; make one with "
                         "coolsd train-drafter)")
    try:
        c = EagleConfig.from_lantern_json(json.loads(cfg.read_text()))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"--drafter-dir {str(d)!r}: config.json is not a drafter config ({e})") from None
    weights = next((d / n for n in ("model.safetensors", "pytorch_model.bin") if (d / n).is_file()), None)
    if weights is None:
        raise ValueError(f"--drafter-dir {str(d)!r}: neither model.safetensors nor pytorch_model.bin")
    man = d / MANIFEST
    if man.is_file():
        m = json.loads(man.read_text())
        if model is not None and m.get("model") not in (None, model):
            raise ValueError(f"--drafter-dir {str(d)!r} was trained for --model {m['model']}, not {model}")
        if m.get("target_fingerprint") not in (None, target_fingerprint(target)):
            raise ValueError(f"--drafter-dir {str(d)!r} was trained on another {m.get('model', '')} target (its "
                             "weights' fingerprint differs: another checkpoint or seed); train one for this target")
        if m.get("weights_sha256") not in (None, sha256_file(weights)):
            raise ValueError(f"--drafter-dir {str(d)!r}: {weights.name} is altered (sha256 differs from the manifest); "
                             f"retrain with: {m.get('command', 'coolsd train-drafter')}")
    why = drafter_fits(c, target)
    if why is not None:
        raise ValueError(f"--drafter-dir {str(d)!r} does not fit --model {model or type(target).__name__}: {why}")
    fam = _family(target)
    if fam is None:
        from real.models.eagle import EagleDrafter

        drafter = EagleDrafter(c, target.output)
    else:
        from real.adapters.imagelm_eagle import AdapterEagle

        drafter = AdapterEagle(c, fam.head)
    load_checked(drafter, extract_state_dict(read_checkpoint(str(weights))), ignore=("rotary_emb",),
                 what=f"EAGLE drafter {weights}")
    dev = target.device
    return drafter.to(device=dev, dtype=target.dtype).eval().requires_grad_(False)
