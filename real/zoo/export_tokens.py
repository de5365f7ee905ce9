"""Write a zoo's training images as a ``coolsd train-drafter --data tokens`` file: ``python -m real.zoo.export_tokens``.

The file holds ``tokens`` (N, T) int64 (the train images' codes under the shipped VQ) and ``class_ids`` (N,): the
unshifted train images first, then ``--shifted`` copies drawn at random (generator seeded with ``--seed``) from the
images shifted by up to ``--max-shift`` pixels, re-encoded (the same augmentation as the target's training). With
mnist, ``--shifted 8000 --seed 2`` gives the 12,000 sequences the shipped EAGLE head was trained on.
"""
from __future__ import annotations

import argparse
import pathlib

import numpy as np
import torch

from . import zoos


def export(zoo: str = "mnist", shifted: int = 8000, max_shift: int = 1, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (N, T) int64, class_ids (N,) int64) as the module docstring says."""
    from .train_llamagen import augmented_codes

    codes, labels = augmented_codes(max_shift, zoo)
    S, N, T = codes.shape
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(max((S - 1) * N, 0), generator=gen)[:shifted] if S > 1 else torch.zeros(0, dtype=torch.long)
    seqs = torch.cat([codes[0], codes[1:].reshape(-1, T)[pick]]) if S > 1 else codes[0]
    labs = torch.cat([labels, labels.repeat(S - 1)[pick]]) if S > 1 else labels
    return seqs.numpy().astype(np.int64), labs.numpy().astype(np.int64)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m real.zoo.export_tokens", description=__doc__.splitlines()[0])
    p.add_argument("--zoo", choices=sorted(zoos.ZOOS), default="mnist")
    p.add_argument("--shifted", type=int, default=8000)
    p.add_argument("--max-shift", type=int, default=1)
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--out", type=pathlib.Path, required=True)
    a = p.parse_args(argv)
    if a.shifted < 0 or a.max_shift < 0:
        p.error("--shifted and --max-shift must be >= 0")
    tokens, class_ids = export(a.zoo, a.shifted, a.max_shift, a.seed)
    import os

    tmp = a.out.with_name(a.out.name + ".tmp.npz")
    np.savez(tmp, tokens=tokens, class_ids=class_ids)
    os.replace(tmp, a.out)
    print(f"{a.out}: {tokens.shape[0]} sequences of {tokens.shape[1]} tokens")


if __name__ == "__main__":
    main()
