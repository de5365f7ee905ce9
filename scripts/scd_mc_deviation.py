"""How far SCD's maximal coupling as released is from lossless (docs/theory.md section 12): the law of N images of a
V = 3, T = 6 toy target decoded with Jacobi drafts (window 4) under each coupling, against the exact law of plain
sampling (enumeration of the 729 sequences): chi-square p, TV over sequences and per-position marginal TV.

  PYTHONPATH=.:tests OMP_NUM_THREADS=1 python scripts/scd_mc_deviation.py --images 60000
"""
from __future__ import annotations

import argparse

import numpy as np
import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=60000)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from test_jacobi import _counts, _law_model, _tv
    from test_real_engine import _chi2, _exact_law

    from real.decode.jacobi import COUPLINGS, Jacobi
    from real.decode.sampling import Processing
    from theory import rules

    T, N = 6, a.images
    t, proc = _law_model(T), Processing(temperature=1.0, cfg_scale=1.5)
    law = _exact_law(t, 1, T, proc)
    for cp in COUPLINGS:   # a loop over the four couplings (settings)
        c, _ = _counts(t, Jacobi(4, coupling=cp), rules.vanilla(), N, 100, T, proc, a.seed)
        p, _ = _chi2(c, law, N)
        marg = []
        for j in range(T):   # a loop over the T = 6 positions
            e, x = np.zeros(3), np.zeros(3)
            for s, v in c.items():
                e[s[j]] += v / N
            for s, v in law.items():
                x[s[j]] += v
            marg.append(0.5 * np.abs(e - x).sum())
        print(f"{cp:9s} N={N} chi2 p={p:.3g} TV(sequences)={_tv(c, law, N):.4f} "
              f"marginal TV by position={np.round(marg, 4).tolist()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
