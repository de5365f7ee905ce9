"""Train the VQ tokenizer on the train split and ship it: ``python -m real.zoo.train_vq [--zoo natural256]``.

Adam on reconstruction MSE + codebook + commitment losses (straight-through estimator); dead codes
(unused over the last ``--restart-every`` steps) are restarted on random encoder outputs of the
current batch during the first ``--restart-until`` fraction of training. Writes the zoo's
``vq.safetensors`` and its manifest entry (hash, command, seed, held-out quality). Resumable
(``--state FILE --save-every N``, then ``--resume``; ``real.zoo.training.Resumable``).
"""
from __future__ import annotations

import math

import torch
from tqdm import tqdm

from . import zoos
from .seeding import reproducible
from .training import Resumable, finish, parse_training_args, timed_training, training_parser
from .vq import CHECKPOINT, VQModel, codebook_usage, vq_losses


def parse(argv=None):
    """The command line of ``python -m real.zoo.train_vq`` (``--help``); ``argv`` None: sys.argv."""
    p = training_parser("real.zoo.train_vq", __doc__, seed=0, steps=3000, batch_size=128, lr=2e-3)
    p.add_argument("--codebook-size", type=int, default=512)
    p.add_argument("--code-dim", type=int, default=8)
    p.add_argument("--ch", type=int, default=32)
    p.add_argument("--beta", type=float, default=0.25, help="commitment weight")
    p.add_argument("--restart-every", type=int, default=50)
    p.add_argument("--restart-until", type=float, default=0.8, help="fraction of steps with restarts")
    return parse_training_args(p, argv, dry_run=False, resumable=True)


def restart_dead_codes(model: VQModel, opt: torch.optim.Optimizer, counts: torch.Tensor,
                       z: torch.Tensor, gen: torch.Generator) -> int:
    """Move codes with zero count onto random encoder outputs z (N, d, H, W); reset their Adam state."""
    dead = counts == 0
    n = int(dead.sum())
    if n == 0:
        return 0
    flat = z.detach().permute(0, 2, 3, 1).reshape(-1, z.shape[1])
    pick = torch.randint(len(flat), (n,), generator=gen)
    noise = 0.01 * torch.randn(n, flat.shape[1], generator=gen)
    with torch.no_grad():
        model.codebook[dead] = flat[pick] + noise
    state = opt.state.get(model.codebook, {})
    for key in ("exp_avg", "exp_avg_sq"):
        if key in state:
            state[key][dead] = 0
    return n


@torch.no_grad()
def reconstruct(model: VQModel, images: torch.Tensor, check, batch_size: int = 1000):
    """(reconstructions clamped to [-1, 1], the images as floats, codes) of ``images`` (any dtype ``check`` takes)."""
    recon, xs, codes = [], [], []
    for b in images.split(batch_size):
        x = check(b)
        r, _, _, c = model(x)
        recon.append(r.clamp(-1, 1))
        xs.append(x)
        codes.append(c)
    return torch.cat(recon), torch.cat(xs), torch.cat(codes)


@torch.no_grad()
def evaluate(model: VQModel, zoo: str = "mnist") -> dict[str, float]:
    """Quality figures of the trained model on held-out (and train) images, as a dict of numbers
    (natural256: the train figures on the first 4,000 train crops)."""
    model.eval()
    d = zoos.get(zoo).data
    x_tr, _ = d.train_split()
    x_ho, _ = d.heldout_split()
    rec_ho, x_ho, codes_ho = reconstruct(model, x_ho, d.check_images)
    rec_tr, x_tr, codes_tr = reconstruct(model, x_tr[:4000], d.check_images)
    V = model.config["codebook_size"]
    u_tr, u_ho = codebook_usage(codes_tr, V), codebook_usage(codes_ho, V)
    return {
        "heldout_mse": float(((rec_ho - x_ho) ** 2).mean()),
        "train_mse": float(((rec_tr - x_tr) ** 2).mean()),
        "codes_used_train": u_tr["used"], "codebook_usage_train": u_tr["usage"],
        "perplexity_train": u_tr["perplexity"],
        "codes_used_heldout": u_ho["used"], "codebook_usage_heldout": u_ho["usage"],
        "perplexity_heldout": u_ho["perplexity"],
    }


def train(args) -> tuple[VQModel, dict]:
    """Train as ``args`` say, bitwise reproducibly on ``args.threads`` threads (and across --resume) ->
    (the tokenizer; the count of restarted codes, wall clock and CPU time)."""
    z = zoos.get(args.zoo)
    with reproducible(args.seed, args.threads):
        gen = torch.Generator().manual_seed(args.seed)
        x, _ = z.data.train_split()
        model = VQModel(args.codebook_size, args.code_dim, args.ch, z.channels)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * s / args.steps)))
        counts = torch.zeros(args.codebook_size, dtype=torch.int64)
        restarts = 0
        perm, pos = torch.randperm(len(x), generator=gen), 0
        run = Resumable(args, "real.zoo.train_vq")
        saved = run.restore(model=model, opt=opt, sched=sched, gen=gen)
        start = saved.get("step", 0)
        if saved:
            counts, restarts, perm, pos = saved["counts"], saved["restarts"], saved["perm"], saved["pos"]
        bar = tqdm(range(start, args.steps), desc=f"train_vq {args.zoo}", mininterval=10, initial=start,
                   total=args.steps)
        for step in bar:
            if pos + args.batch_size > len(x):
                perm, pos = torch.randperm(len(x), generator=gen), 0
            xb = z.data.check_images(x[perm[pos:pos + args.batch_size]])
            pos += args.batch_size
            model.train()
            recon, zc, zq, codes = model(xb)
            losses = vq_losses(xb, recon, zc, zq, args.beta)
            loss = sum(losses.values())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            counts += torch.bincount(codes.reshape(-1), minlength=args.codebook_size)
            if (step + 1) % args.restart_every == 0:
                if step + 1 <= args.restart_until * args.steps:
                    restarts += restart_dead_codes(model, opt, counts, zc, gen)
                counts.zero_()
            if step % 50 == 0:
                bar.set_postfix(recon=f"{losses['recon'].item():.4f}", commit=f"{losses['commit'].item():.4f}",
                                used=int((counts > 0).sum()))
            run.maybe_save(step + 1, {"counts": counts, "restarts": restarts, "perm": perm, "pos": pos},
                           model=model, opt=opt, sched=sched, gen=gen)
        wall, cpu = run.elapsed()
        return model, {"restarted_codes": restarts} | (
            {"wall_clock_s": round(wall, 1), "cpu_s": round(cpu, 1)} if args.zoo != "mnist" else {})


def main(argv=None):
    """Train, evaluate, print the quality and ship the checkpoint and its manifest entry
    (``real.zoo.training.finish``)."""
    args = parse(argv)
    (model, stats), wall = timed_training(train, args)
    wall = stats.pop("wall_clock_s", wall)   # resumable runs: all sessions
    finish(model, CHECKPOINT, "real.zoo.train_vq", args, argv, model.config, evaluate(model, args.zoo), wall, stats)


if __name__ == "__main__":
    main()
