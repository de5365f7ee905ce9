"""Train the EAGLE-1 drafter of the shipped target and ship it: ``python -m real.zoo.train_eagle``.

The drafter (``real.models.eagle.EagleDrafter``: one decoder layer on (token, target feature) pairs, drafting
through the target's own LM head) is fitted with ``real.models.eagle.train_eagle`` (EAGLE-1 objective) to the
target's last hidden states along training sequences: the train digits' codes (unshifted, and shifted
copies as in the target's training), each with its class and, for a ``--null-frac`` share, with the null
class (classifier-free guidance runs the drafter on the null row too). Quality on the held-out digits:
teacher-forced top-1 agreement with the target and the mean per-token acceptance rate
sum_x min(p, q) (= 1 - TV) against the target at x_1 .. x_48 (x_0 is never drafted by EAGLE), no CFG. Writes ``checkpoints/eagle.safetensors`` and its
manifest entry.
"""
from __future__ import annotations

import torch

from real.models.eagle import EagleDrafter, train_eagle

from . import vq
from .checkpoint import manifest_entry
from .gpt import EAGLE, NULL_CLASS, TARGET, draft_agreement, heldout_tokens, load_target, target_features
from .seeding import reproducible
from .train_llamagen import augmented_codes
from .training import finish, parse_training_args, timed_training, training_parser


def parse(argv=None):
    """The command line of ``python -m real.zoo.train_eagle`` (``--help``); ``argv`` None: sys.argv."""
    p = training_parser("real.zoo.train_eagle", __doc__, seed=2, steps=4000, batch_size=64, lr=2e-3)
    p.add_argument("--p-w", type=float, default=0.1, help="weight of the token cross-entropy (EAGLE's p_w)")
    p.add_argument("--noise", type=float, default=0.1, help="uniform feature-noise width")
    p.add_argument("--shifted", type=int, default=8000, help="shifted training copies to add (of 8 x 4000)")
    p.add_argument("--null-frac", type=float, default=0.2, help="share of sequences featurised with the null class")
    p.add_argument("--max-shift", type=int, default=1)
    args = parse_training_args(p, argv, dry_run=True)
    if args.zoo != "mnist":
        p.error(f"--zoo {args.zoo}: this script trains the MNIST zoo's EAGLE head only")
    return args


def eagle_logits(target, drafter):
    """Teacher-forced drafter logits for x_1 .. x_48: pair (x_j, h_j) predicts the target's h_{j+1}, whose
    head row predicts x_{j+1} (``real.models.eagle.eagle_pairs``)."""
    def f(labels, codes):
        h = target_features(target, labels, codes)
        with torch.no_grad():
            return drafter.head(drafter.train_forward(codes, h, 1))[:, :-1]
    return f


def train(args, target):
    """Train as ``args`` say, bitwise reproducibly on ``args.threads`` threads ->
    (the drafter, eval mode and frozen; training statistics)."""
    with reproducible(args.seed, args.threads):
        gen = torch.Generator().manual_seed(args.seed)
        codes, labels = augmented_codes(args.max_shift)
        S, N, T = codes.shape
        pick = torch.randperm((S - 1) * N, generator=gen)[:args.shifted]
        seqs = torch.cat([codes[0], codes[1:].reshape(-1, T)[pick]])
        labs = torch.cat([labels, labels.repeat(S - 1)[pick]])
        null = torch.rand(len(labs), generator=gen) < args.null_frac
        labs = torch.where(null, NULL_CLASS, labs)
        feats = target_features(target, labs, seqs)
        drafter = EagleDrafter.from_target(target, seed=args.seed)
        drafter.embed_tokens.weight.requires_grad_(False)
        log = train_eagle(drafter, seqs, feats, 1, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                          p_w=args.p_w, noise=args.noise, seed=args.seed, progress=True)
        return drafter.eval().requires_grad_(False), {"sequences": len(seqs), "null_class_sequences": int(null.sum()),
                                                      "final_loss": log[-1]["loss"],
                                                      "final_train_top1": sum(r["top1"] for r in log[-100:]) / 100}


def main(argv=None):
    """Train, evaluate, print the quality and ship the checkpoint and its manifest entry
    (``real.zoo.training.finish``)."""
    args = parse(argv)
    target = load_target()
    (drafter, stats), wall = timed_training(train, args, target)
    ho_codes, ho_labels = heldout_tokens()
    quality = draft_agreement(target, eagle_logits(target, drafter), ho_labels, ho_codes)
    quality["parameters_trained"] = sum(p.numel() for n, p in drafter.named_parameters() if n != "embed_tokens.weight")
    finish(drafter, EAGLE, "real.zoo.train_eagle", args, argv, dict(drafter.config.__dict__), quality, wall, stats,
           extra={"target_sha256": manifest_entry(TARGET)["sha256"], "vq_sha256": manifest_entry(vq.CHECKPOINT)["sha256"]})


if __name__ == "__main__":
    main()
