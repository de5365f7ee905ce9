"""Hash-verified safetensors checkpoints described by ``checkpoints/manifest.json``.

The manifest maps a file name to ``{"sha256", "command", "seed", "config", "quality", ...}``.
Loading verifies the sha256 before reading a byte of tensors, then checks key names and shapes
against the model, so a wrong or stale checkpoint fails with a ValueError that says what is wrong.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Any

import torch

CHECKPOINTS = pathlib.Path(__file__).resolve().parent / "checkpoints"
MANIFEST = "manifest.json"


def sha256(path: str | pathlib.Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(directory: str | pathlib.Path = CHECKPOINTS) -> dict[str, Any]:
    """The manifest of ``directory`` as a dict (``{'files': {}}`` when there is none)."""
    path = pathlib.Path(directory) / MANIFEST
    if not path.exists():
        return {"files": {}}
    return json.loads(path.read_text())


def manifest_entry(name: str, directory: str | pathlib.Path = CHECKPOINTS) -> dict[str, Any]:
    """The manifest entry of checkpoint file ``name`` (e.g. "vq.safetensors")."""
    files = read_manifest(directory).get("files", {})
    if name not in files:
        raise ValueError(f"checkpoint {name!r} is not in {pathlib.Path(directory) / MANIFEST} "
                         f"(known: {sorted(files)})")
    return files[name]


def update_manifest(name: str, entry: dict[str, Any],
                    directory: str | pathlib.Path = CHECKPOINTS) -> None:
    """Insert or replace the entry of ``name`` (other entries are kept)."""
    directory = pathlib.Path(directory)
    manifest = read_manifest(directory)
    manifest.setdefault("files", {})[name] = entry
    manifest["files"] = dict(sorted(manifest["files"].items()))
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")


def save_state(model: torch.nn.Module, name: str,
               directory: str | pathlib.Path = CHECKPOINTS) -> str:
    """Write the model's state dict (contiguous float32 copies) to ``directory/name``; returns sha256."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    path = pathlib.Path(directory) / name
    save_file(state, str(path))
    return sha256(path)


def ship(model: torch.nn.Module, name: str, module: str, args, argv: list[str] | None, config: dict,
         quality: dict, wall: float, stats: dict | None = None, extra: dict | None = None) -> str:
    """Write a trained zoo model to ``args.out/name`` and its manifest entry: sha256, the command that
    regenerates it (``python -m module`` + its arguments), seed, config, training arguments (+ ``stats``),
    quality, wall clock, environment, the data fingerprint, then ``extra`` (hashes of the checkpoints it
    was trained on). Returns the sha256."""
    import platform
    import sys

    from . import zoos

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    digest = save_state(model, name, out)
    update_manifest(name, {
        "sha256": digest,
        "command": " ".join([f"python -m {module}", *(a for a in (sys.argv[1:] if argv is None else argv)
                                                      if a != "--resume")]),   # the command of a fresh run
        "seed": args.seed,
        "config": config,
        "training": {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items()
                     if k not in ("out", "dry_run", "state", "resume")} | (stats or {}),
        "quality": quality,
        "wall_clock_s": round(wall, 1),
        "environment": {"torch": torch.__version__, "python": platform.python_version(), "threads": args.threads},
        "data_sha256": zoos.get(getattr(args, "zoo", "mnist")).data.fingerprint(),
    } | (extra or {}), out)
    print(f"trained in {wall:.1f} s; wrote {out / name} sha256 {digest}")
    return digest


def check_state(model: torch.nn.Module, state: dict[str, torch.Tensor], name: str = "checkpoint") -> None:
    """Raise ValueError naming missing keys, unexpected keys and shape mismatches."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    missing = sorted(set(want) - set(got))
    unexpected = sorted(set(got) - set(want))
    bad = sorted(f"{k}: checkpoint {got[k]} vs model {want[k]}"
                 for k in set(want) & set(got) if want[k] != got[k])
    problems = []
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if bad:
        problems.append(f"bad shapes [{'; '.join(bad)}]")
    if problems:
        raise ValueError(f"{name} does not fit {type(model).__name__}: " + "; ".join(problems))


def load_state(name: str, directory: str | pathlib.Path = CHECKPOINTS) -> dict[str, torch.Tensor]:
    """Tensors of ``directory/name`` after checking its sha256 against the manifest."""
    from safetensors.torch import load_file

    directory = pathlib.Path(directory)
    entry = manifest_entry(name, directory)
    path = directory / name
    if not path.exists():
        raise ValueError(f"checkpoint file {path} is missing (manifest lists it; regenerate with: "
                         f"{entry.get('command', '?')})")
    digest = sha256(path)
    if digest != entry["sha256"]:
        raise ValueError(f"checkpoint {path} has sha256 {digest}, manifest records {entry['sha256']}: "
                         f"the file is corrupt or stale (regenerate with: {entry.get('command', '?')})")
    return load_file(str(path))


def load_into(model: torch.nn.Module, name: str,
              directory: str | pathlib.Path = CHECKPOINTS) -> torch.nn.Module:
    """Verify hash, keys and shapes, then load ``name`` into ``model`` (eval mode); returns the model."""
    state = load_state(name, directory)
    check_state(model, state, name)
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_shipped(build, name: str, directory: str | pathlib.Path = CHECKPOINTS) -> torch.nn.Module:
    """A shipped zoo model: ``build(**config)`` from ``name``'s manifest entry, its weights loaded with
    ``load_into`` (hash, keys and shapes checked), eval mode, gradients off."""
    model = build(**manifest_entry(name, directory)["config"])
    return load_into(model, name, directory).requires_grad_(False)
