"""The skeleton the zoo's training scripts (``python -m real.zoo.train_*``) share: their command line's
common options (``--zoo`` picks the model family of ``real.zoo.zoos``), the timed training call, resumable
training state (``Resumable``: ``--state FILE --save-every N``, continued with ``--resume``), and the end of a
run (print the quality, then ship the checkpoint and its manifest entry unless ``--dry-run``).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import time

import torch

from . import zoos
from .checkpoint import ship


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


def parse_training_args(p: argparse.ArgumentParser, argv, *, dry_run: bool, resumable: bool = False) -> argparse.Namespace:
    """Add the last options, --zoo (mnist), --threads (2), --out (the zoo's shipped checkpoint folder), when
    ``dry_run`` --dry-run, when ``resumable`` --state / --save-every / --resume; then parse ``argv`` (None: the
    command line)."""
    p.add_argument("--zoo", choices=sorted(zoos.ZOOS), default="mnist", help="model family (real.zoo.zoos)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=pathlib.Path, default=None, help="default: the zoo's checkpoint folder")
    if dry_run:
        p.add_argument("--dry-run", action="store_true", help="train and report, write nothing")
    if resumable:
        p.add_argument("--state", type=pathlib.Path, default=None,
                       help="resumable training state file, written every --save-every steps (default: none)")
        p.add_argument("--save-every", type=int, default=100)
        p.add_argument("--resume", action="store_true", help="continue from --state (same config and data)")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = zoos.get(args.zoo).directory
    if resumable and args.resume and args.state is None:
        p.error("--resume needs --state FILE")
    return args


NOT_CONFIG = ("out", "dry_run", "state", "save_every", "resume", "threads", "eval_every")


class Resumable:
    """Training state saved every ``args.save_every`` steps to ``args.state`` (atomically), and restored by
    ``--resume``: model, optimiser, schedule, generators and loop variables, so a resumed run continues the
    same sequence of batches (bitwise, on the same thread count). The file records the run's training
    arguments and the data fingerprint; resuming with other ones is refused (SystemExit, one line).
    Keeps the run's accumulated wall clock and CPU time (``elapsed``): CPU time does not grow while the
    process is stopped (SIGSTOP), so it measures the work whatever the machine's other users do."""

    def __init__(self, args, module: str):
        """For the run of ``python -m module`` with parsed ``args``."""
        self.path = getattr(args, "state", None)
        self.every = getattr(args, "save_every", 0)
        self.meta = {"module": module, "data_sha256": zoos.get(args.zoo).data.fingerprint(),
                     "args": {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items()
                              if k not in NOT_CONFIG}}
        self.resume = bool(getattr(args, "resume", False))
        self.wall0, self.cpu0 = 0.0, 0.0
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def restore(self, **stateful) -> dict:
        """On --resume: load the saved state into ``stateful`` objects (``load_state_dict``; torch.Generator:
        ``set_state``) and return the saved plain values (``step``, loop variables); {} for a fresh run."""
        if not self.resume:
            return {}
        if not self.path.exists():
            raise SystemExit(f"error: --resume: no training state at {self.path}")
        saved = torch.load(self.path, weights_only=False)
        for key in ("module", "data_sha256", "args"):
            if saved["meta"][key] != self.meta[key]:
                diff = key if key != "args" else ", ".join(
                    f"{k}: saved {saved['meta'][key].get(k)!r}, now {v!r}" for k, v in self.meta[key].items()
                    if saved["meta"][key].get(k) != v)
                raise SystemExit(f"error: --resume: {self.path} was written by another run ({diff}); "
                                 "resume with the same options, or start afresh without --resume")
        for name, obj in stateful.items():
            if isinstance(obj, torch.Generator):
                obj.set_state(saved["state"][name])
            else:
                obj.load_state_dict(saved["state"][name])
        torch.set_rng_state(saved["torch_rng"])
        self.wall0, self.cpu0 = saved["elapsed"]
        print(f"resumed from {self.path} at step {saved['values']['step']}", flush=True)
        return saved["values"]

    def elapsed(self) -> tuple[float, float]:
        """(wall clock s, CPU s) of the whole run, earlier sessions included."""
        return self.wall0 + time.perf_counter() - self.t0, self.cpu0 + time.process_time() - self.c0

    def maybe_save(self, step: int, values: dict, **stateful) -> None:
        """After ``step`` steps: save when ``step`` is a multiple of --save-every (and --state is set)."""
        if self.path is None or self.every <= 0 or step % self.every:
            return
        state = {n: (o.get_state() if isinstance(o, torch.Generator) else o.state_dict()) for n, o in stateful.items()}
        blob = {"meta": self.meta, "state": state, "torch_rng": torch.get_rng_state(),
                "values": {"step": step, **values}, "elapsed": self.elapsed()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        torch.save(blob, tmp)
        os.replace(tmp, self.path)


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
        print(f"  {k}: {v:.5g}" if isinstance(v, float) else f"  {k}: {v}", flush=True)
    if getattr(args, "dry_run", False):
        print(f"trained in {wall:.1f} s (dry run: nothing written)")
        return None
    return ship(model, name, module, args, argv, config, quality, wall, stats, extra)
