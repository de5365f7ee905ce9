"""The skeleton the zoo's training scripts (``python -m real.zoo.train_*``) share: their command line's
common options, the timed training call, and the end of a run (print the quality, then ship the
checkpoint and its manifest entry unless ``--dry-run``).
"""
from __future__ import annotations

import argparse
import pathlib
import time

import torch

from .checkpoint import CHECKPOINTS, ship


def training_parser(module: str, doc: str, **optimiser) -> argparse.ArgumentParser:
    """The parser of ``python -m module``, described by the first line of the script's ``doc``; given
    ``optimiser`` defaults (``add_optimiser_options``' keywords), those options come first."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    if optimiser:
        add_optimiser_options(p, **optimiser)
    return p


def add_optimiser_options(p: argparse.ArgumentParser, *, seed: int | None, steps: int, batch_size: int, lr: float,
                          seed_help: str | None = None) -> None:
    """--seed, --steps, --batch-size, --lr with the script's defaults (in that order: the manifest's
    ``training`` entry lists the arguments in parser order)."""
    p.add_argument("--seed", type=int, default=seed, help=seed_help)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--lr", type=float, default=lr)


def parse_training_args(p: argparse.ArgumentParser, argv, *, dry_run: bool) -> argparse.Namespace:
    """Add the last options, --threads (2), --out (the shipped checkpoint folder) and, when ``dry_run``,
    --dry-run, then parse ``argv`` (None: the command line)."""
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=pathlib.Path, default=CHECKPOINTS)
    if dry_run:
        p.add_argument("--dry-run", action="store_true", help="train and report, write nothing")
    return p.parse_args(argv)


def timed_training(train, args, *more):
    """``train(args, *more)`` on ``args.threads`` torch threads; returns (its result, wall clock s)."""
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    out = train(args, *more)
    return out, time.perf_counter() - t0


def finish(model: torch.nn.Module, name: str, module: str, args, argv, config: dict, quality: dict, wall: float,
           stats: dict | None = None, extra: dict | None = None) -> str | None:
    """Print ``quality``; then, unless ``args.dry_run``, ``checkpoint.ship`` the model (returns its sha256)."""
    for k, v in quality.items():
        print(f"  {k}: {v:.5g}" if isinstance(v, float) else f"  {k}: {v}")
    if getattr(args, "dry_run", False):
        print(f"trained in {wall:.1f} s (dry run: nothing written)")
        return None
    return ship(model, name, module, args, argv, config, quality, wall, stats, extra)
