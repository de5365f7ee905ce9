"""Train the zoo's image classifier on the train split and ship it: ``python -m real.zoo.train_classifier``
(``--zoo natural256`` for that family).

Adam + cross-entropy with random +-2 pixel shifts as augmentation (MNIST; natural256's crops already vary in
position, scale and flip: ``--shift 0``); accuracy is measured on the held-out split, which the classifier
never sees. Writes the zoo's ``classifier.safetensors`` and its manifest entry (hash, command, seed, held-out
accuracy, Frechet-distance noise floor).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import zoos
from .classifier import CHECKPOINT, Classifier
from .metrics import frechet_distance
from .seeding import reproducible
from .training import finish, parse_training_args, timed_training, training_parser


def parse(argv=None):
    """The command line of ``python -m real.zoo.train_classifier`` (``--help``); ``argv`` None: sys.argv."""
    p = training_parser("real.zoo.train_classifier", __doc__, seed=0, steps=1500, batch_size=64, lr=1e-3)
    p.add_argument("--ch", type=int, default=32)
    p.add_argument("--feature-dim", type=int, default=64)
    p.add_argument("--shift", type=int, default=None, help="max random shift in pixels (augmentation; "
                   "default 2 for mnist, 0 otherwise)")
    args = parse_training_args(p, argv, dry_run=False)
    if args.shift is None:
        args.shift = 2 if args.zoo == "mnist" else 0
    return args


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


@torch.no_grad()
def _apply(fn, images: torch.Tensor, check, batch_size: int = 1000) -> torch.Tensor:
    """``fn`` over ``check``-ed batches of ``images``, concatenated."""
    return torch.cat([fn(check(b)) for b in images.split(batch_size)])


def fd_noise_floor(model: Classifier, seed: int, zoo: str = "mnist") -> dict:
    """FD between real-image feature sets that differ only by sampling: the two held-out halves, and
    random train subsets of n images vs the held-out images (mean over 5 subsets)."""
    d = zoos.get(zoo).data
    f_ho = _apply(model.features, d.heldout_split()[0], d.check_images).double().numpy()
    f_tr = _apply(model.features, d.train_split()[0], d.check_images).double().numpy()
    half = len(f_ho) // 2
    rng = np.random.default_rng(seed)
    by_n = {}
    for n in (100, 250, 500, 1000):
        vals = [frechet_distance(f_tr[rng.choice(len(f_tr), n, replace=False)], f_ho) for _ in range(5)]
        by_n[str(n)] = {"mean": float(np.mean(vals)), "sd": float(np.std(vals, ddof=1))}
    return {"fd_heldout_half_vs_half": frechet_distance(f_ho[:half], f_ho[half:]),
            "fd_train_n_vs_heldout": by_n}


def train(args) -> Classifier:
    """Train as ``args`` say, bitwise reproducibly on ``args.threads`` threads -> the trained classifier
    (eval mode)."""
    z = zoos.get(args.zoo)
    with reproducible(args.seed, args.threads):
        gen = torch.Generator().manual_seed(args.seed)
        x, y = z.data.train_split()
        model = Classifier(args.ch, args.feature_dim, z.num_classes, in_ch=z.channels, image_size=z.image_size)
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
            loss = F.cross_entropy(model(random_shift(z.data.check_images(x[idx]), args.shift, gen)), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            if step % 50 == 0:
                bar.set_postfix(loss=f"{loss.item():.4f}")
        return model.eval()


@torch.no_grad()
def evaluate(model: Classifier, seed: int, zoo: str = "mnist") -> dict:
    """Quality figures of the trained model on held-out (and train) images, as a dict of numbers."""
    d = zoos.get(zoo).data
    x_ho, y_ho = d.heldout_split()
    x_tr, y_tr = d.train_split()
    predict = lambda x: model(x).argmax(1)  # noqa: E731
    acc_ho = float((_apply(predict, x_ho, d.check_images) == y_ho).double().mean())
    return {"heldout_accuracy": acc_ho,
            "heldout_accuracy_se": math.sqrt(acc_ho * (1 - acc_ho) / len(y_ho)),
            "train_accuracy": float((_apply(predict, x_tr, d.check_images) == y_tr).double().mean()),
            **fd_noise_floor(model, seed, zoo)}


def main(argv=None):
    """Train, evaluate, print the quality and ship the checkpoint and its manifest entry
    (``real.zoo.training.finish``)."""
    args = parse(argv)
    model, wall = timed_training(train, args)
    finish(model, CHECKPOINT, "real.zoo.train_classifier", args, argv, model.config,
           evaluate(model, args.seed, args.zoo), wall)


if __name__ == "__main__":
    main()
