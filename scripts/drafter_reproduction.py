"""The MNIST reproduction of issue 48: the EAGLE-1 head rebuilt by ``coolsd train-drafter`` against the shipped one, on
the 1,000 held-out digits: teacher-forced top-1 agreement and acceptance rate sum_x min(p, q) per token (x_1 .. x_48,
no CFG, temperature 1: the figures the shipped head's manifest records), with standard errors over digits.

  python scripts/drafter_reproduction.py --drafter-dir RUN/mnist_eagle --out docs/results/drafters/mnist_reproduction.json
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def per_digit(target, drafter, labels, codes) -> dict:
    from real.zoo.gpt import target_features, train_logits

    with torch.no_grad():
        h = target_features(target, labels, codes)
        q = torch.softmax(drafter.head(drafter.train_forward(codes, h, 1))[:, :-1], -1)
        p = torch.softmax(train_logits(target, labels, codes), -1)[:, -q.shape[1]:]
    acc = torch.minimum(p, q).sum(-1).double().mean(1)
    top1 = (p.argmax(-1) == q.argmax(-1)).double().mean(1)
    n = len(acc)
    return {"acceptance": float(acc.mean()), "acceptance_se": float(acc.std() / math.sqrt(n)),
            "top1": float(top1.mean()), "top1_se": float(top1.std() / math.sqrt(n)), "digits": n}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter-dir", required=True)
    p.add_argument("--out", type=pathlib.Path, required=True)
    a = p.parse_args(argv)
    from real.drafter.files import load_drafter
    from real.zoo import gpt

    target = gpt.load_target()
    codes, labels = gpt.heldout_tokens()
    shipped = per_digit(target, gpt.load_eagle(target), labels, codes)
    rebuilt = per_digit(target, load_drafter(a.drafter_dir, target, "mnist").float(), labels, codes)
    d = rebuilt["acceptance"] - shipped["acceptance"]
    se = math.hypot(rebuilt["acceptance_se"], shipped["acceptance_se"])
    out = {"shipped": shipped, "rebuilt": rebuilt, "difference": d, "difference_se_independent": se,
           "within_2se_or_better": bool(d >= -2 * se),
           "rebuilt_manifest": json.loads((pathlib.Path(a.drafter_dir) / "coolsd_drafter.json").read_text())["identity"]}
    print(f"shipped: acceptance {shipped['acceptance']:.4f} +- {shipped['acceptance_se']:.4f}, top-1 {shipped['top1']:.4f}")
    print(f"rebuilt: acceptance {rebuilt['acceptance']:.4f} +- {rebuilt['acceptance_se']:.4f}, top-1 {rebuilt['top1']:.4f}")
    print(f"difference {d:+.4f} (SE {se:.4f}, z = {d / se:+.2f}); within 2 SE or better: {out['within_2se_or_better']}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
