"""Simulator throughput: rounds per second of each backend against a straightforward per-round
Python loop measured in the same run, on one core (the process is pinned to one CPU; BLAS/XLA threads 1).

  python benchmarks/bench_sim.py                 # V = 64, L = 8 (the default setting)
  python benchmarks/bench_sim.py --V 512 --L 4   # other sizes
  python benchmarks/bench_sim.py --short --json out.json   # numpy backend only, fewer rounds (run_all.py)

The machine may be shared: compare the ratios, and read the absolute numbers together with the load
average printed at the top. The numpy backend and the loop (the ratio run_all.py reads) are timed interleaved
(loop, numpy, loop, ...), each by its fastest of 5 runs in CPU time of this thread (``time.thread_time``: the
process is single-threaded and pinned, so this is its wall time less the time slices other processes take).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # run from a checkout, installed or not
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import bisect  # noqa: E402
import random  # noqa: E402

import numpy as np  # noqa: E402
from _timing import interleaved_best, write_ratios  # noqa: E402  (benchmarks/_timing.py)

import sim  # noqa: E402
from theory.markov import chains  # noqa: E402
from theory import markov, rules


def python_loop(P, Q, F, G, s0: int, n_rounds: int, seed: int = 0):
    """The baseline: one round at a time in plain Python (section 1 with virtual extension), with
    precomputed cumulative rows and bisect for the draws. Returns (tau, tokens) lists."""
    rnd = random.Random(seed)
    L, V = F.shape[0], P.shape[0]
    cq = np.cumsum(Q, 1).tolist()
    cp = np.cumsum(P, 1).tolist()
    cg = np.cumsum(G, 2).tolist()
    f = F.tolist()

    def draw(c):
        return min(bisect.bisect_right(c, rnd.random() * c[-1]), V - 1)

    taus, toks = [], []
    for _ in range(n_rounds):
        s, tau, out, stopped = s0, 0, [], False
        for i in range(L):
            if stopped:
                x = draw(cp[s])
            else:
                x = draw(cq[s])
                if rnd.random() < f[i][s][x]:
                    tau += 1
                else:
                    x = draw(cg[i][s])
                    stopped = True
            out.append(x)
            s = x
        out.append(draw(cp[s]))
        taus.append(tau)
        toks.append(out)
    return taus, toks


def rate(fn, n, repeat=3):
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(n)
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--V", type=int, default=64)
    ap.add_argument("--L", type=int, default=8)
    ap.add_argument("--n", type=int, default=1 << 20, help="rounds per timed run of the vectorised backends")
    ap.add_argument("--n-loop", type=int, default=50_000, help="rounds per timed run of the Python loop")
    ap.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the first allowed one)")
    ap.add_argument("--short", action="store_true", help="numpy backend against the loop only, 2^18 / 20000 rounds")
    ap.add_argument("--json", default=None, help="write the ratios to this JSON file (for run_all.py)")
    args = ap.parse_args()
    if args.short:
        args.n, args.n_loop = min(args.n, 1 << 18), min(args.n_loop, 20_000)
    cpu = min(os.sched_getaffinity(0)) if args.cpu is None else args.cpu
    os.sched_setaffinity(0, {cpu})
    print(f"pinned to CPU {cpu}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")

    P, Q = chains.random_pair(args.V, tv=0.4, seed=0)
    v = rules.cool_sd(2.0)
    F, G = markov.rule_tables(P, Q, args.L, v)
    e_tau = markov.expected_accepted(P, Q, F, 0)

    best = interleaved_best({"loop": lambda: python_loop(P, Q, F, G, 0, args.n_loop),
                             "numpy": lambda: sim.simulate(P, Q, F, G, 0, args.n, 1)}, 5, clock=time.thread_time)
    r_loop, r_np = args.n_loop / best["loop"], args.n / best["numpy"]
    taus, _ = python_loop(P, Q, F, G, 0, args.n_loop, seed=1)
    print(f"V={args.V} L={args.L} cool-sd(2.0); exact E[tau] = {e_tau:.4f}")
    print(f"{'backend':26s} {'rounds/s':>12s} {'vs Python loop':>15s} {'mean tau':>9s}")
    print(f"{'python loop (baseline)':26s} {r_loop:12.3e} {1.0:14.1f}x {np.mean(taus):9.4f}")

    m_np = sim.simulate(P, Q, F, G, 0, args.n, 2).accepted.mean()
    print(f"{'numpy (alias tables)':26s} {r_np:12.3e} {r_np / r_loop:14.1f}x {m_np:9.4f}")
    write_ratios(args.json, {"sim_numpy_over_loop": {
        "value": r_np / r_loop, "better": "higher",
        "what": f"simulator rounds/s, numpy backend / per-round Python loop, V={args.V} L={args.L}"}})
    if args.short:
        return
    try:
        import jax  # noqa: F401

        sim.simulate(P, Q, F, G, 0, args.n, 0, backend="jax")             # compile outside the timing
        r_jax = rate(lambda n: sim.simulate(P, Q, F, G, 0, n, 1, backend="jax"), args.n)
        m_jax = sim.simulate(P, Q, F, G, 0, args.n, 2, backend="jax").accepted.mean()
        print(f"{'jax (jit + vmap, uint32)':26s} {r_jax:12.3e} {r_jax / r_loop:14.1f}x {m_jax:9.4f}"
              f"   target >= 1e6: {'OK' if r_jax >= 1e6 else 'MISSED'}")
    except ImportError:
        print("jax not installed: JAX backend skipped")
    n_rule = max(args.n // 16, 1000)
    r_rule = rate(lambda n: sim.simulate_rule(P, Q, v, args.L, 0, n, 1), n_rule, repeat=2)
    print(f"{'rule path (verify_chain)':26s} {r_rule:12.3e} {r_rule / r_loop:14.1f}x "
          f"{sim.simulate_rule(P, Q, v, args.L, 0, n_rule, 2).accepted.mean():9.4f}")
    print(f"numpy vs Python loop: {r_np / r_loop:.1f}x (issue floor: 3x) -> {'OK' if r_np >= 3 * r_loop else 'MISSED'}")


if __name__ == "__main__":
    main()
