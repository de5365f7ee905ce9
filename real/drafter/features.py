"""The drafter's training data: code sequences with their conditions, the target's features along them, extracted once
into a sharded on-disk cache that streams in bounded memory and resumes where it stopped.

Sources (``coolsd train-drafter --data``):
* ``generate``: the target's own samples under the inference processing (CFG, temperature, top-k), plain AR through
  ``real.decode.engine.generate`` (Lumina-mGPT's recipe);
* ``tokens FILE``: an ``.npz`` of code sequences ``tokens`` (N, T) with ``class_ids`` (N,) for a class-conditional
  model or ``prompts`` (N,) text for a prompted one, teacher-forced (LlamaGen's recipe) (``read_tokens_file``).

Features: one ``prefill(conds, x_{0:T-1}, cfg, return_hidden=True)`` per shard: hidden (R, P + T - 1, D), the
target's last hidden states after its final norm at the positions [prefix; x_0 .. x_{T-2}] (the engine feeds the
drafter the same rows). With CFG the rows are [cond; null]; a sequence keeps its null row's features with
probability ``null_frac`` (EAGLE / LANTERN: the drafter also drafts the CFG null row). The logits are not stored:
the EAGLE-1 objective reads them through the target's frozen LM head from these features (V-wide rows would cost
V / D times the disk).

A shard is a directory ``shard_KKKKK/`` holding ``tokens.npy`` (n, T) int64, ``features.npy`` (n, P + T - 1, D) in the
cache dtype, ``null.npy`` (n,) bool and ``meta.json`` (P); it is written under a temporary name and renamed, so a
shard on disk is complete. ``FeatureCache`` opens the shards memory-mapped.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["TokenFile", "read_tokens_file", "FeatureCache", "extract_shard", "generate_shard", "CACHE_DTYPES"]

CACHE_DTYPES = {"float32": np.float32, "float16": np.float16}


@dataclass(frozen=True)
class TokenFile:
    """A ``--data tokens`` file: ``tokens`` (N, T) int64 and ``class_ids`` (N,) int64 or ``prompts`` (N,) str."""
    tokens: np.ndarray
    class_ids: np.ndarray | None
    prompts: tuple | None

    @property
    def conditions(self) -> list:
        return [int(c) for c in self.class_ids] if self.class_ids is not None else list(self.prompts)


def read_tokens_file(path, option: str = "--data tokens") -> TokenFile:
    """Read and check a tokens file (module docstring): one-line ValueError naming ``option`` and the fault."""
    from theory.core.files import input_file

    input_file(option, path, "npz")
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
            if "tokens" not in keys:
                raise ValueError(f"{option} {path}: no 'tokens' array (N, T); found {sorted(keys)}")
            tokens = z["tokens"]
            cls = z["class_ids"] if "class_ids" in keys else None
            prm = z["prompts"] if "prompts" in keys else None
    except (OSError, ValueError, EOFError) as e:
        if isinstance(e, ValueError) and str(e).startswith(option):
            raise
        raise ValueError(f"{option} {path}: not a readable .npz ({e})") from None
    if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 2 or tokens.dtype.kind not in "iu":
        raise ValueError(f"{option} {path}: tokens must be a (N >= 1, T >= 2) integer array, got {tokens.dtype} "
                         f"{tokens.shape}")
    if (cls is None) == (prm is None):
        raise ValueError(f"{option} {path}: give exactly one of class_ids (N,) or prompts (N,) beside tokens")
    cond = cls if cls is not None else prm
    if cond.shape != (tokens.shape[0],):
        raise ValueError(f"{option} {path}: {'class_ids' if cls is not None else 'prompts'} must be ({tokens.shape[0]},), "
                         f"got {cond.shape}")
    if cls is not None and cls.dtype.kind not in "iu":
        raise ValueError(f"{option} {path}: class_ids must be integers, got {cls.dtype}")
    if prm is not None and prm.dtype.kind != "U":
        raise ValueError(f"{option} {path}: prompts must be text, got {prm.dtype}")
    if int(tokens.min()) < 0:
        raise ValueError(f"{option} {path}: tokens hold a negative code ({int(tokens.min())})")
    return TokenFile(tokens.astype(np.int64), None if cls is None else cls.astype(np.int64),
                     None if prm is None else tuple(str(p) for p in prm))


def _null_rows(n: int, null_frac: float, seed: int, shard: int) -> np.ndarray:
    """(n,) bool: which sequences of shard ``shard`` keep their null row (a draw of its own per shard)."""
    return np.random.default_rng([seed, shard, 7]).random(n) < null_frac


@torch.no_grad()
def extract_shard(target, conds: list, tokens: np.ndarray, *, cfg: bool, null_frac: float, seed: int, shard: int,
                  dtype=np.float16) -> dict:
    """The features of one shard (module docstring): {"tokens" (n, T), "features" (n, P + T - 1, D), "null" (n,),
    "P"}. ``cfg``: run the [cond; null] rows (null rows kept with probability ``null_frac``)."""
    x = torch.as_tensor(tokens, dtype=torch.long, device=target.device)
    rows = x[:, :-1].repeat(2, 1) if cfg else x[:, :-1]          # the models take one token row per model row
    out = target.prefill(list(conds), rows, cfg=cfg, return_hidden=True)
    h = out.hidden
    n = x.shape[0]
    null = _null_rows(n, null_frac, seed, shard) if cfg else np.zeros(n, bool)
    if cfg:
        h = torch.where(torch.as_tensor(null, device=h.device)[:, None, None], h[n:], h[:n])
    P = h.shape[1] - (x.shape[1] - 1)
    return {"tokens": np.asarray(tokens, np.int64), "features": h.float().cpu().numpy().astype(dtype), "null": null,
            "P": int(P)}


def generate_shard(target, conds: list, num_tokens: int, processing, seed: int, batch_size: int | None = None) -> np.ndarray:
    """The target's own samples (plain AR, ``processing``) for ``conds``: tokens (n, num_tokens) int64."""
    from real.decode import engine

    gens = engine.generate(target, None, list(conds), num_tokens=num_tokens, processing=processing, seed=seed,
                           batch_size=batch_size, progress=False)
    return torch.stack([g.tokens for g in gens]).cpu().numpy().astype(np.int64)


class FeatureCache:
    """The shards under ``root`` (module docstring): ``done(k)``, ``write(k, shard)`` (atomic), and for training
    ``open()`` -> per shard (tokens, features (memory-mapped), null, P)."""

    def __init__(self, root):
        self.root = pathlib.Path(root)

    def path(self, k: int) -> pathlib.Path:
        return self.root / f"shard_{k:05d}"

    def done(self, k: int) -> bool:
        return (self.path(k) / "meta.json").is_file()

    def write(self, k: int, shard: dict) -> None:
        final = self.path(k)
        tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for name in ("tokens", "features", "null"):
            np.save(tmp / f"{name}.npy", shard[name])
        (tmp / "meta.json").write_text(json.dumps({"P": shard["P"], "n": int(len(shard["tokens"]))}))
        os.replace(tmp, final)

    def open(self, shards: int) -> list[dict]:
        """Shards 0 .. shards - 1, features memory-mapped (bounded memory whatever the cache's size)."""
        out = []
        for k in range(shards):
            p = self.path(k)
            meta = json.loads((p / "meta.json").read_text())
            out.append({"tokens": np.load(p / "tokens.npy"), "features": np.load(p / "features.npy", mmap_mode="r"),
                        "null": np.load(p / "null.npy"), "P": int(meta["P"])})
        return out

    def nbytes(self) -> int:
        return sum(f.stat().st_size for f in self.root.rglob("*.npy"))
