"""How good is T15's estimate of log P^ for lossless dynamic trees (docs/theory/likelihood.md 11d) on a trained model?

Generates images with vanilla verification on lossless dynamic trees (where P^ = P, so the truth is log P), regrows
``--trees`` importance-sampled trees per round start (``real.decode.score_tree.tree_rows``) and prints, per image,
log P, the jackknifed estimate of log P^ and its SE, then the mean error, the median SE and how many estimates are
more than 3 SEs from the truth (the validation in docs/theory/likelihood.md 11d):

  python scripts/lossless_mc_check.py                      # MNIST, small draft, 12 images, 16 trees
  python scripts/lossless_mc_check.py --draft eagle --images 4
  python scripts/lossless_mc_check.py --model natural256 --draft eagle --images 4    # 256 tokens, V = 1024
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("mnist", "natural256"), default="mnist")
    ap.add_argument("--draft", choices=("small", "eagle"), default="small")
    ap.add_argument("--images", type=int, default=12)
    ap.add_argument("--trees", type=int, default=None, help="trees per round start (default: LOSSLESS_TREES)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.images < 1:
        ap.error("--images must be >= 1")
    import numpy as np
    import torch

    from real.decode import engine, regrow
    from real.decode import score_tree as st
    from real.decode.dynamic_tree import DynamicTree
    from real.decode.sampling import Processing
    from real.registry import build
    from theory import rules
    from theory.likelihood import log_target

    torch.set_num_threads(1)
    trees = a.trees or regrow.LOSSLESS_TREES
    if trees < st.LOSSLESS_GROUPS or trees % st.LOSSLESS_GROUPS:
        ap.error(f"--trees must be a multiple of {st.LOSSLESS_GROUPS} (the jackknife's groups), got {trees}")
    b = build(a.model, draft=a.draft, num_images=a.images, seed=a.seed)
    t, d = b.target, b.draft
    proc, spec = Processing(cfg_scale=b.cfg_scale), DynamicTree()
    conds = list(b.conds)
    gens = engine.generate(t, d, conds, num_tokens=b.num_tokens, verifier=rules.vanilla(), drafting=spec,
                           processing=proc, seed=a.seed, batch_size=a.images)
    tok = torch.stack([torch.as_tensor(g.tokens) for g in gens])
    t0 = time.perf_counter()
    rows = st.tree_rows(t, d, conds, tok, spec, processing=proc, seed=a.seed, trees=trees)
    lp = log_target(rows.p.double().numpy(), tok.numpy())
    out = st.tree_likelihood(rows, tok, rules.vanilla(), spec, detail=True)
    wall = time.perf_counter() - t0
    lph, se = out["log_p_hat"], out["se"]
    for i in range(a.images):
        print(f"image {i:2d}: log P {lp[i]:9.2f}   estimate {lph[i]:9.2f}   SE {se[i]:6.2f}")
    fin = np.isfinite(lph)
    err = (lph - lp)[fin]
    z = err / se[fin]
    print(f"{a.model}, {a.draft} draft, {trees} trees per round start: {fin.sum()} of {a.images} finite; mean "
          f"error {err.mean():.2f} nats; median SE {np.median(se[fin]):.2f}; {int((np.abs(z) > 3).sum())} beyond 3 SEs; "
          f"scoring {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
