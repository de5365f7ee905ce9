"""Train the digit classifier on the train split and ship it: ``python -m real.zoo.train_classifier``.

Adam + cross-entropy with random +-2 pixel shifts as augmentation; accuracy is measured on the
held-out split, which the classifier never sees. Writes ``checkpoints/classifier.safetensors`` and
its manifest entry (hash, command, seed, held-out accuracy, Frechet-distance noise floor).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import data
from .classifier import CHECKPOINT, Classifier
from .metrics import frechet_distance
from .seeding import reproducible
from .training import finish, parse_training_args, timed_training, training_parser


def parse(argv=None):
    """The command line of ``python -m real.zoo.train_classifier`` (``--help``); ``argv`` None: sys.argv."""
    p = training_parser("real.zoo.train_classifier", __doc__, seed=0, steps=1500, batch_size=64, lr=1e-3)
    p.add_argument("--ch", type=int, default=32)
    p.add_argument("--feature-dim", type=int, default=64)
    p.add_argument("--shift", type=int, default=2, help="max random shift in pixels (augmentation)")
    return parse_training_args(p, argv, dry_run=False)


def random_shift(x: torch.Tensor, max_shift: int, gen: torch.Generator) -> torch.Tensor:
    """Shift each image (N, 1, H, W) by independent integer offsets in [-max_shift, max_shift],
    filling with background (-1)."""
    if max_shift == 0:
        return x
    n, _, h, w = x.shape
    padded = F.pad(x, (max_shift,) * 4, value=-1.0)
    off = torch.randint(0, 2 * max_shift + 1, (n, 2), generator=gen)
    rows = (off[:, 0, None] + torch.arange(h))[:, :, None]  # (n, h, 1)
    cols = (off[:, 1, None] + torch.arange(w))[:, None, :]  # (n, 1, w)
    return padded[torch.arange(n)[:, None, None], 0, rows, cols][:, None]


def fd_noise_floor(model: Classifier, seed: int) -> dict:
    """FD between real-digit feature sets that differ only by sampling: the two held-out halves, and
    random train subsets of n digits vs the 1,000 held-out digits (mean over 5 subsets)."""
    with torch.no_grad():
        f_ho = model.features(data.heldout_split()[0]).double().numpy()
        f_tr = model.features(data.train_split()[0]).double().numpy()
    rng = np.random.default_rng(seed)
    by_n = {}
    for n in (100, 250, 500, 1000):
        vals = [frechet_distance(f_tr[rng.choice(len(f_tr), n, replace=False)], f_ho) for _ in range(5)]
        by_n[str(n)] = {"mean": float(np.mean(vals)), "sd": float(np.std(vals, ddof=1))}
    return {"fd_heldout_half_vs_half": frechet_distance(f_ho[:500], f_ho[500:]),
            "fd_train_n_vs_heldout": by_n}


def train(args) -> Classifier:
    """Train as ``args`` say, bitwise reproducibly on ``args.threads`` threads -> the trained classifier
    (eval mode)."""
    with reproducible(args.seed, args.threads):
        gen = torch.Generator().manual_seed(args.seed)
        x, y = data.train_split()
        model = Classifier(args.ch, args.feature_dim)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * s / args.steps)))
        perm, pos = torch.randperm(len(x), generator=gen), 0
        bar = tqdm(range(args.steps), desc="train_classifier", mininterval=2)
        for step in bar:
            if pos + args.batch_size > len(x):
                perm, pos = torch.randperm(len(x), generator=gen), 0
            idx = perm[pos:pos + args.batch_size]
            pos += args.batch_size
            model.train()
            loss = F.cross_entropy(model(random_shift(x[idx], args.shift, gen)), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            if step % 50 == 0:
                bar.set_postfix(loss=f"{loss.item():.4f}")
        return model.eval()


@torch.no_grad()
def evaluate(model: Classifier, seed: int) -> dict:
    """Quality figures of the trained model on held-out (and train) digits, as a dict of numbers."""
    x_ho, y_ho = data.heldout_split()
    x_tr, y_tr = data.train_split()
    acc_ho = float((model(x_ho).argmax(1) == y_ho).double().mean())
    return {"heldout_accuracy": acc_ho,
            "heldout_accuracy_se": math.sqrt(acc_ho * (1 - acc_ho) / len(y_ho)),
            "train_accuracy": float((model(x_tr).argmax(1) == y_tr).double().mean()),
            **fd_noise_floor(model, seed)}


def main(argv=None):
    """Train, evaluate, print the quality and ship the checkpoint and its manifest entry
    (``real.zoo.training.finish``)."""
    args = parse(argv)
    model, wall = timed_training(train, args)
    finish(model, CHECKPOINT, "real.zoo.train_classifier", args, argv, model.config, evaluate(model, args.seed), wall)


if __name__ == "__main__":
    main()
