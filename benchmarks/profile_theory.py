"""Profile of the theory engine's E[tau] + B at V = 1024, L = 8 on one core (issue 30): the touch-once
numpy limit, the public calls, their validation and internal cores, then cProfile of the public calls.
Writes text (benchmarks/results/theory_profile_*.txt are its output before and after the issue-30 work).

  python benchmarks/profile_theory.py [--V 1024 --L 8]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from _timing import interleaved_best, profile_text  # noqa: E402

import numpy as np  # noqa: E402

from theory.markov import chains  # noqa: E402
from theory.core import checks
from theory import markov, rules
from theory.markov import tables as markov_tables  # the private checked core lives in the tables module
from bench_theory import touch_once_limit  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--V", type=int, default=1024)
    ap.add_argument("--L", type=int, default=8)
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(__file__)).stdout.strip()
    P, Q = chains.random_pair(args.V, tv=0.4, seed=0)
    F, G = markov.rule_tables(P, Q, args.L, rules.cool_sd(2.0))
    mu = np.zeros(args.V)
    mu[0] = 1.0
    rows = [("touch-once numpy limit", lambda: touch_once_limit(P, Q, F, G, 0))]
    if hasattr(markov, "round_terms"):
        rows.append(("markov.round_terms (public, E[tau] and B)", lambda: markov.round_terms(P, Q, F, G, 0)))
    rows += [
        ("expected_accepted + tv_bound (two public calls)",
         lambda: (markov.expected_accepted(P, Q, F, 0), markov.tv_bound(P, Q, F, G, 0))),
        ("  expected_accepted", lambda: markov.expected_accepted(P, Q, F, 0)),
        ("  tv_bound", lambda: markov.tv_bound(P, Q, F, G, 0)),
        ("  check_chain(P, Q)", lambda: markov.check_chain(P, Q)),
        ("  checks.acceptance_tables(F)", lambda: checks.acceptance_tables(F, args.V)),
        ("  checks.resampling_tables(G)", lambda: checks.resampling_tables(G, F)),
        ("  acceptance_probs_xp (core)", lambda: markov.acceptance_probs_xp(P, Q, F, mu)),
        ("  bound_terms_xp (core)", lambda: markov.bound_terms_xp(P, Q, F, G, mu)),
    ]
    if hasattr(markov, "round_terms_xp"):
        rows.append(("  round_terms_xp (core)", lambda: markov.round_terms_xp(P, Q, F, G, mu)))
    if hasattr(markov_tables, "_round_terms_checked"):
        rows.append(("  _round_terms_checked (core, F and G checked per block)",
                     lambda: markov_tables._round_terms_checked(P, Q, F, G, mu)))
    print(f"theory engine profile at {commit}: V={args.V} L={args.L}, OMP_NUM_THREADS="
          f"{os.environ['OMP_NUM_THREADS']}; CPU time of this thread, fastest of 20 interleaved repeats")
    times = interleaved_best(dict(rows), 20, clock=time.thread_time)
    t_lim = times[rows[0][0]]
    for name, t in times.items():
        print(f"{name:50s} {t * 1e3:8.2f} ms  {t / t_lim:5.2f}x limit")
    def calls():
        for _ in range(5):
            markov.expected_accepted(P, Q, F, 0), markov.tv_bound(P, Q, F, G, 0)
            if hasattr(markov, "round_terms"):
                markov.round_terms(P, Q, F, G, 0)
    print("\ncProfile of 5 x (expected_accepted + tv_bound [+ round_terms]), by own time:")
    print(profile_text(calls, 18))


if __name__ == "__main__":
    main()
