"""Theory engine timings. Prints times and ratios against baselines measured in the same run (machines
are noisy: compare ratios, not absolute numbers).

E[tau] + B at V = 1024, L = 8 against the touch-once numpy limit (issue 30, target <= 1.2x): the public
``markov.round_terms`` (P, Q checked, then F and G checked row block by row block inside the one pass
over them, ``theory.markov.tables._round_terms_checked``) and the pair ``expected_accepted`` + ``tv_bound``,
with the breakdown (validation at the public boundary, the unchecked core). CPU time of this thread,
fastest of interleaved repeats. Then the naive matrix-product baseline and the exact TV on 10^6 sequences.

  python benchmarks/bench_theory.py            # V = 1024, L = 8; exact TV on 10^6 sequences
  python benchmarks/bench_theory.py --short --json out.json    # the limit ratio only (run_all.py)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # run from a checkout, installed or not
os.environ.setdefault("OMP_NUM_THREADS", "1")        # "one core", as the target says
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from _timing import best_of, interleaved_best, write_ratios  # noqa: E402  (benchmarks/_timing.py)

import numpy as np  # noqa: E402

from theory.markov import chains  # noqa: E402
from theory import markov, rules
from theory.markov import tables as markov_tables  # the private checked core lives in the tables module


def naive_expected_and_bound(P, Q, F, G, s):
    """The textbook way: form the matrix products A_1 ... A_i (O(L V^3)) and loop over states for D_i."""
    L, V = F.shape[0], P.shape[0]
    M = np.eye(V)
    e = b = 0.0
    for i in range(L):
        A = Q * F[i]
        d = np.array([0.5 * np.abs(A[t] + (1 - A[t].sum()) * G[i, t] - P[t]).sum() for t in range(V)])
        b += (M @ d)[s]
        M = M @ A
        e += M[s].sum()
    return e, b


def touch_once_limit(P, Q, F, G, s):
    """The irreducible numpy work of E[tau] and B (T8, T9): touch F and G once per position (A = Q F_i,
    beta, D_i (T3), one vector-matrix product), no validation, no extra temporaries. (E[tau], B)."""
    v = np.zeros(P.shape[0])
    v[s] = 1.0
    e = b = 0.0
    for i in range(F.shape[0]):  # loop over draft positions
        A = Q * F[i]
        beta = A.sum(-1, keepdims=True)
        b += v @ (0.5 * np.abs(A + (1 - beta) * G[i] - P).sum(-1))
        v = v @ A
        e += v.sum()
    return e, b


def limit_ratio(P, Q, F, G, repeat: int) -> dict:
    """Times (s) of the limit, the public calls and their parts, interleaved (CPU time of this thread)."""
    mu = markov.init_distribution(0, P.shape[0])
    return interleaved_best({
        "touch-once numpy limit": lambda: touch_once_limit(P, Q, F, G, 0),
        "markov.round_terms (public)": lambda: markov.round_terms(P, Q, F, G, 0),
        "  P, Q and init checked (check_chain)": lambda: markov.check_chain(P, Q, copy=False),
        "  F, G checked block by block, with the core": lambda: markov_tables._round_terms_checked(P, Q, F, G, mu),
        "  (full validation pass alone, _validated)": lambda: markov_tables._validated(P, Q, F, G, 0),
        "  (the same core unchecked, round_terms_xp)": lambda: markov.round_terms_xp(P, Q, F, G, mu),
        "expected_accepted + tv_bound (two public calls)":
            lambda: (markov.expected_accepted(P, Q, F, 0), markov.tv_bound(P, Q, F, G, 0)),
    }, repeat, clock=time.thread_time)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--V", type=int, default=1024)
    ap.add_argument("--L", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=30, help="interleaved repeats of the limit comparison")
    ap.add_argument("--short", action="store_true", help="only the limit comparison (about 10 s)")
    ap.add_argument("--json", default=None, help="write the ratios to this JSON file (for run_all.py)")
    args = ap.parse_args()
    P, Q = chains.random_pair(args.V, tv=0.4, seed=0)
    F, G = markov.rule_tables(P, Q, args.L, rules.cool_sd(2.0))

    acc, terms = markov.round_terms(P, Q, F, G, 0)
    e_lim, b_lim = touch_once_limit(P, Q, F, G, 0)
    assert abs(acc.sum() - e_lim) < 1e-12 and abs(terms.sum() - b_lim) < 1e-12, (acc.sum(), e_lim, terms.sum(), b_lim)
    t = limit_ratio(P, Q, F, G, args.repeat)
    t_lim = t["touch-once numpy limit"]
    print(f"V={args.V} L={args.L}  E[tau] + B, CPU time of one thread, fastest of {args.repeat} interleaved:")
    for name, v in t.items():
        print(f"  {name:50s} {v * 1e3:8.2f} ms  {v / t_lim:5.2f}x limit")
    r = t["markov.round_terms (public)"] / t_lim
    print(f"  round_terms / limit = {r:.3f}x  (target <= 1.2x: {'OK' if r <= 1.2 else 'MISSED'})")
    write_ratios(args.json, {
        "theory_round_terms_over_limit": {"value": r, "better": "lower",
                                          "what": f"markov.round_terms / touch-once numpy limit, V={args.V} L={args.L}"},
        "theory_pair_over_limit": {"value": t["expected_accepted + tv_bound (two public calls)"] / t_lim,
                                   "better": "lower", "what": "expected_accepted + tv_bound / limit"},
    })
    if args.short:
        return

    t_fast, (e, b) = best_of(lambda: (markov.expected_accepted(P, Q, F, 0), markov.tv_bound(P, Q, F, G, 0)))
    t_naive, (e2, b2) = best_of(lambda: naive_expected_and_bound(P, Q, F, G, 0), repeat=1)
    assert abs(e - e2) < 1e-9 and abs(b - b2) < 1e-9, (e, e2, b, b2)
    print(f"V={args.V} L={args.L}  expected_accepted + tv_bound: {t_fast * 1e3:8.1f} ms   "
          f"naive (matrix products): {t_naive * 1e3:8.1f} ms   ratio naive/ours = {t_naive / t_fast:6.1f}x   "
          f"(target < 200 ms: {'OK' if t_fast < 0.2 else 'MISSED'})")

    t_tab, _ = best_of(lambda: markov.rule_tables(P, Q, args.L, rules.cool_sd(2.0)), repeat=3)
    print(f"               rule_tables (cool-sd, F and G*): {t_tab * 1e3:8.1f} ms")

    # exact TV over 10^6 sequences: V = 10, L = 5 (V^(L+1) = 10^6)
    P, Q = chains.random_pair(10, tv=0.4, seed=1)
    F, G = markov.rule_tables(P, Q, 5, rules.uniform_rsd(1.5))
    t_tv, tv = best_of(lambda: markov.exact_tv(P, Q, F, G, 0))
    print(f"exact_tv over 10^6 sequences (V=10, L=5): {t_tv * 1e3:8.1f} ms  TV = {tv:.6f}  "
          f"(target < 2 s: {'OK' if t_tv < 2 else 'MISSED'})")
    # naive: enumerate every sequence with itertools (T7 term by term) on a 1% subsample, extrapolated
    import itertools
    A = Q * F
    R = (1 - A.sum(-1, keepdims=True)) * G
    seqs = list(itertools.islice(itertools.product(range(10), repeat=6), 0, 10**6, 100))
    t0 = time.perf_counter()
    for seq in seqs:
        prev, acc, ph, pt = 0, 1.0, 0.0, 1.0
        for j, x in enumerate(seq):
            if j < 5:
                tail = np.prod([P[seq[m - 1], seq[m]] for m in range(j + 1, 6)]) if j < 5 else 1.0
                ph += acc * R[j, prev, x] * tail
                acc *= A[j, prev, x]
            else:
                ph += acc * P[prev, x]
            pt *= P[prev, x]
            prev = x
    t_loop = (time.perf_counter() - t0) * 100
    print(f"               naive per-sequence loop (extrapolated from 1%): {t_loop:8.1f} s   "
          f"ratio = {t_loop / t_tv:8.0f}x")


if __name__ == "__main__":
    main()
