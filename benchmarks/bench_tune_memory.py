"""Peak memory of ``coolsd tune --objective bound`` on a chain record at LlamaGen's vocabulary (V = 16,384), at the
published 256- and 576-token grids (issue 54): the speed model's renewal recursion over the T positions
(``theory.likelihood.speed.expected_rounds``) is one ``lax.scan``, so what JAX compiles does not grow with T (the
unrolled loop passed 18 GB at 576 tokens). Goals: the 576-token peak at most 1.5 x the 256-token one (the record
itself is 2.25 x larger: 68 MB against 30 MB on disk), and at most 2 GiB at 256 tokens (the real-size tier's bound,
tests/test_realsize.py). Each command runs in a fresh subprocess (``ru_maxrss``, ``bench_record_memory.peak_of``).

Model: ``real.realsize.llamagen_files`` (random weights at the published vocabulary, 2 layers of width 64), one image,
a vanilla chain of L = 4 recorded by ``coolsd generate --record``; ``tune`` runs the uniform family (no SLSQP: the
bound and speed functions every family shares, without the free family's minutes of search).

  python benchmarks/bench_tune_memory.py [--short] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # run from a checkout, installed or not

from _timing import write_ratios  # noqa: E402  (benchmarks/_timing.py)
from bench_record_memory import peak_of  # noqa: E402

TOKENS = (256, 576)


def main() -> None:
    from real.realsize import llamagen_files

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="the run_all mode (the defaults)")
    ap.add_argument("--json", default=None, help="write the ratios here")
    a = ap.parse_args()
    peaks = {}
    with tempfile.TemporaryDirectory() as tmp:
        for T in TOKENS:
            rec = os.path.join(tmp, f"chain{T}.npz")
            peak_of(["generate", *llamagen_files(tmp, T), "--method", "vanilla", "--L", "4", "--num-images", "1",
                     "--seed", "0", "--threads", "1", "--json", "--record", rec])
            peaks[T] = peak_of(["tune", "--record", rec, "--objective", "bound", "--family", "uniform",
                                "--bound-budget", "0.05", "--json"])
    (t0, p0), (t1, p1) = peaks.items()
    ratio = p1 / p0
    print(f"tune --objective bound (uniform) on a one-image chain record, V = 16,384: peak {p0 / 2**20:.0f} MiB at "
          f"{t0} tokens, {p1 / 2**20:.0f} MiB at {t1}: x{ratio:.3f} (goal <= 1.5; <= 2 GiB at {t0})")
    write_ratios(a.json, {"tune_peak_576_vs_256": {
        "value": ratio, "better": "lower",
        "what": f"peak RSS of tune --objective bound on a V = 16,384 chain record of {t1} tokens / of {t0}"}},
        extra={"peak_bytes": {str(t0): p0, str(t1): p1}})
    if ratio > 1.5 or p0 > 2 * 2**30:
        raise SystemExit(f"tune's peak: {p0 / 2**20:.0f} MiB at {t0} tokens (goal <= 2048), x{ratio:.3f} at {t1} "
                         f"(goal <= 1.5)")


if __name__ == "__main__":
    main()
