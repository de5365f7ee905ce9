"""Train the zoo's class-conditional LlamaGen (target or small draft) and ship it:
``python -m real.zoo.train_llamagen --role target`` / ``--role draft`` (``--zoo natural256`` for that family).

Data: the zoo's train split tokenized by its shipped VQ. MNIST's augmentation against overfitting: every
digit is also shifted by whole pixels (every offset in [-s, s]^2, background fill) and re-encoded
with the VQ once at start-up; a training example uses a random shifted copy with probability
``--shift-prob`` and the digit itself otherwise (natural256: no shifts, ``--max-shift 0``; its crops already
vary in position, scale and flip). Class dropout (the label replaced by the null class
with probability ``--class-dropout``) trains the unconditional model classifier-free guidance needs.
AdamW, linear warm-up then cosine decay, residual dropout. Quality is measured on the 1,000 held-out
digits (NLL per image token, never trained on; ``--eval-images N``: the first N held-out images during
training, all at the end). Writes the zoo's ``{target,draft}.safetensors`` and the manifest entry (hash,
command, seed, config, quality, wall clock). Resumable (``--state FILE --save-every N``, then ``--resume``).
"""
from __future__ import annotations

import functools
import itertools
import math

import torch
import torch.nn.functional as F
from tqdm import tqdm

from real.models import llamagen as lg

from . import vq, zoos
from .checkpoint import manifest_entry
from .gpt import DRAFT, TARGET, fixed_batch, heldout_tokens, llamagen_config, nll_per_token, null_class, train_logits
from .seeding import reproducible
from .training import Resumable, add_optimiser_options, finish, parse_training_args, timed_training, training_parser

ROLES = {  # default architecture per zoo and role: (dim, layers, heads)
    "mnist": {"target": (64, 12, 4), "draft": (96, 2, 4)},
    "natural256": {"target": (128, 6, 4), "draft": (64, 2, 4)},
}


def parse(argv=None):
    """The command line of ``python -m real.zoo.train_llamagen`` (``--help``); ``argv`` None: sys.argv."""
    p = training_parser("real.zoo.train_llamagen", __doc__)
    p.add_argument("--role", choices=("draft", "target"), required=True)
    p.add_argument("--dim", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    add_optimiser_options(p, seed=None, steps=3200, batch_size=64, lr=2e-3, seed_help="default: 0 for the target, 1 for the draft")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--dropout", type=float, default=0.1, help="residual dropout")
    p.add_argument("--class-dropout", type=float, default=0.1, help="probability of the null class (CFG)")
    p.add_argument("--max-shift", type=int, default=None, help="pixel shifts in [-s, s]^2 (augmentation; "
                   "default 1 for mnist, 0 otherwise)")
    p.add_argument("--shift-prob", type=float, default=0.5, help="probability of a shifted copy")
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-images", type=int, default=0, help="held-out images scored during training (0: all)")
    args = parse_training_args(p, argv, dry_run=True, resumable=True)
    if args.max_shift is None:
        args.max_shift = 1 if args.zoo == "mnist" else 0
    if args.zoo != "mnist" and args.max_shift:
        p.error(f"--max-shift: --zoo {args.zoo} has no shift augmentation (use 0)")
    d = ROLES[args.zoo][args.role]
    args.dim = args.dim or d[0]
    args.layers = args.layers or d[1]
    args.heads = args.heads or d[2]
    if args.seed is None:
        args.seed = 0 if args.role == "target" else 1
    return args


def shift_images(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """Images (N, 1, 28, 28) moved by (dy, dx) whole pixels, the background (-1) filling in."""
    if dy == 0 and dx == 0:
        return x
    s = max(abs(dy), abs(dx))
    padded = F.pad(x, (s, s, s, s), value=-1.0)
    return padded[:, :, s - dy:s - dy + 28, s - dx:s - dx + 28]


def augmented_codes(max_shift: int, zoo: str = "mnist") -> tuple[torch.Tensor, torch.Tensor]:
    """(codes (S, N, T), labels (N,)): the zoo's train images under every shift in [-s, s]^2 (S of them,
    the unshifted copy first; mnist: N = 4000, T = 49), each re-encoded with the shipped VQ; ``max_shift`` 0:
    S = 1, ``vq.token_dataset``. Computed once per process (copies returned)."""
    codes, y = _augmented_codes(max_shift, zoo)
    return codes.clone(), y.clone()


@functools.lru_cache(maxsize=2)
def _augmented_codes(max_shift: int, zoo: str) -> tuple[torch.Tensor, torch.Tensor]:
    if max_shift == 0:
        codes, y = vq.token_dataset(zoo)
        return codes[None], y
    x, y = zoos.get(zoo).data.train_split()
    shifts = [(0, 0)] + [s for s in itertools.product(range(-max_shift, max_shift + 1), repeat=2) if s != (0, 0)]
    codes = torch.stack([vq.encode(shift_images(x, dy, dx), zoo=zoo).reshape(len(x), -1) for dy, dx in shifts])
    return codes, y


def train(args) -> tuple[lg.LlamaGen, dict]:
    """Train as ``args`` say, bitwise reproducibly on ``args.threads`` threads (and across --resume) ->
    (the model, eval mode and frozen; the held-out NLL history)."""
    with reproducible(args.seed, args.threads):
        gen = torch.Generator().manual_seed(args.seed)
        codes, labels = augmented_codes(args.max_shift, args.zoo)
        S, N, _ = codes.shape
        ho_codes, ho_labels = heldout_tokens(args.zoo)
        if args.eval_images:
            ho_codes, ho_labels = ho_codes[:args.eval_images], ho_labels[:args.eval_images]
        null = null_class(args.zoo)
        c = llamagen_config(args.dim, args.layers, args.heads, class_dropout_prob=args.class_dropout, zoo=args.zoo)
        model = lg.LlamaGen(c).random_init(args.seed, std=0.02)
        decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
        other = [p for n, p in model.named_parameters() if p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                 {"params": other, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup) * (
            0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))))
        perm, pos = torch.randperm(N, generator=gen), 0
        # dropout masks come from torch's global generator: reseed it here, so that they do not depend on
        # what was constructed before in this process (module inits, a first VQ load, draw from it too)
        torch.manual_seed(args.seed)
        history = []
        run = Resumable(args, "real.zoo.train_llamagen")
        saved = run.restore(model=model, opt=opt, sched=sched, gen=gen)
        start = saved.get("step", 0)
        if saved:
            perm, pos, history = saved["perm"], saved["pos"], saved["history"]
        bar = tqdm(range(start, args.steps), desc=f"train_llamagen {args.zoo} {args.role}",
                   mininterval=2 if args.zoo == "mnist" else 30, initial=start, total=args.steps)
        for step in bar:
            if pos + args.batch_size > N:
                perm, pos = torch.randperm(N, generator=gen), 0
            idx = perm[pos:pos + args.batch_size]
            pos += args.batch_size
            B = len(idx)
            if S > 1:
                shifted = torch.rand(B, generator=gen) < args.shift_prob
                which = torch.where(shifted, torch.randint(1, S, (B,), generator=gen), torch.zeros(B, dtype=torch.long))
            else:   # no shifted copies (--max-shift 0)
                which = torch.zeros(B, dtype=torch.long)
            x = codes[which, idx]
            y = torch.where(torch.rand(B, generator=gen) < args.class_dropout, null, labels[idx])
            model.train()
            loss = F.cross_entropy(train_logits(model, y, x, dropout=args.dropout).flatten(0, 1), x.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if step % 50 == 0:
                bar.set_postfix(loss=f"{loss.item():.3f}")
            if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
                model.eval()
                h = nll_per_token(model, ho_labels, ho_codes)
                history.append({"step": step + 1, "train_loss": round(loss.item(), 4), "heldout_nll": round(h, 4)})
                tqdm.write(f"  step {step + 1}: held-out NLL {h:.4f} nats/token (cpu {run.elapsed()[1]:.0f} s)")
            run.maybe_save(step + 1, {"perm": perm, "pos": pos, "history": history},
                           model=model, opt=opt, sched=sched, gen=gen)
        wall, cpu = run.elapsed()
        return model.eval().requires_grad_(False), {"history": history} | (
            {"wall_clock_s": round(wall, 1), "cpu_s": round(cpu, 1)} if args.zoo != "mnist" else {})


def unigram_entropies(train_codes: torch.Tensor, heldout_codes: torch.Tensor, V: int) -> dict:
    """The baseline a trained model must beat: the entropy (nats) of the held-out codes' histogram, and the NLL
    per token of the held-out codes under the train codes' unigram law (add-one smoothed)."""
    ho = torch.bincount(heldout_codes.reshape(-1), minlength=V).double()
    p_ho = ho / ho.sum()
    nz = p_ho[p_ho > 0]
    tr = torch.bincount(train_codes.reshape(-1), minlength=V).double() + 1.0
    p_tr = tr / tr.sum()
    return {"unigram_entropy_heldout": float(-(nz * nz.log()).sum()),
            "unigram_nll_heldout": float(-(p_ho * p_tr.log()).sum())}


def evaluate(model: lg.LlamaGen, role: str, zoo: str = "mnist") -> dict:
    """Quality figures of the trained model on held-out (and train) images, as a dict of numbers."""
    ho_codes, ho_labels = heldout_tokens(zoo)
    tr_codes, tr_labels = vq.token_dataset(zoo)
    fl, fc = fixed_batch(zoo)
    null = torch.full_like(ho_labels, null_class(zoo))
    out = {}
    if role == "draft":  # agreement with the shipped target (trained first)
        from .gpt import draft_agreement, load_target

        out = draft_agreement(load_target(zoo), lambda lb, cb: train_logits(model, lb, cb), ho_labels, ho_codes)
    return out | unigram_entropies(tr_codes, ho_codes, model.vocab_size) | {
        "heldout_nll_per_token": nll_per_token(model, ho_labels, ho_codes),
        "heldout_nll_per_token_null_class": nll_per_token(model, null, ho_codes),
        "train_nll_per_token": nll_per_token(model, tr_labels[:1000], tr_codes[:1000]),
        "fixed_batch_nll_per_token": nll_per_token(model, fl, fc),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def main(argv=None):
    """Train, evaluate, print the quality and ship the checkpoint and its manifest entry
    (``real.zoo.training.finish``)."""
    args = parse(argv)
    (model, stats), wall = timed_training(train, args)
    wall = stats.pop("wall_clock_s", wall)   # resumable runs: all sessions
    name = TARGET if args.role == "target" else DRAFT
    finish(model, name, "real.zoo.train_llamagen", args, argv, dict(model.config.__dict__),
           evaluate(model, args.role, args.zoo), wall, stats,
           extra={"vq_sha256": manifest_entry(vq.CHECKPOINT, zoos.get(args.zoo).directory)["sha256"]})


if __name__ == "__main__":
    main()
