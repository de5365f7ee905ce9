"""Whole-image recursion timings (docs/theory.md section 7). Prints times and the ratio against a
baseline measured in the same run: the textbook recursion that forms the round kernels K_j (V x V
matrix products, O(L V^3)) and applies them as matrices at every n.

  python benchmarks/bench_image.py            # V = 256, L = 4, T = 1024
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # run from a checkout, installed or not
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from _timing import best_of  # noqa: E402  (benchmarks/_timing.py)

import numpy as np  # noqa: E402

from theory.markov import chains, image  # noqa: E402
from theory import markov, rules


def kernel_baseline(P, Q, F, G, T, s0):
    """Expected rounds with explicit kernel matrices K^(l)_j for every l (formed once) applied per n."""
    L, V = F.shape[0], P.shape[0]
    K = {ell: image.round_kernels(P, Q, F, G, ell) for ell in range(L + 1)}
    pi = np.zeros((T + 1, V))
    pi[0, s0] = 1.0
    for n in range(T):
        ell = min(L, T - n - 1)
        for j in range(ell + 1):
            pi[n + j + 1] += pi[n] @ K[ell][j]
    return float(pi[:T].sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--V", type=int, default=256)
    ap.add_argument("--L", type=int, default=4)
    ap.add_argument("--T", type=int, default=1024)
    a = ap.parse_args()
    P, Q = chains.random_pair(a.V, tv=0.4, seed=0)
    F, G = markov.rule_tables(P, Q, a.L, rules.cool_sd(2.0))
    t_rec, pred = best_of(lambda: image.image_prediction(P, Q, F, G, a.T, 0), repeat=3)
    t_base, rounds = best_of(lambda: kernel_baseline(P, Q, F, G, a.T, 0), repeat=1)
    assert abs(rounds - pred.expected_rounds) < 1e-8 * a.T
    print(f"V={a.V} L={a.L} T={a.T}: E[rounds]={pred.expected_rounds:.4f}, tokens/call={pred.tokens_per_call:.4f}, "
          f"accumulated bound={pred.accumulated_bound:.4f}")
    print(f"recursion (vector-matrix)  {t_rec * 1e3:9.1f} ms")
    print(f"baseline (kernel matrices) {t_base * 1e3:9.1f} ms   ratio baseline/recursion = {t_base / t_rec:.1f}x")


if __name__ == "__main__":
    main()
