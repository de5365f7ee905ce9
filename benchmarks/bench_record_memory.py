"""Peak memory of ``coolsd generate --record`` on the dynamic tree at LlamaGen's vocabulary (V = 16,384), 10 vs 100
images (issue 54): the record streams per batch to disk (``coolsd.npzstream``), so the peak must not grow with the
number of images (goal: at most 10% from 10 to 100). Each run is a fresh subprocess whose peak resident memory
(``ru_maxrss``) is read at its end; both use the same batch size, so the rows held are one batch's.

Model: ``real.realsize.llamagen_files`` (the published vocabulary and classes, 2 layers of width 64, VQ-16's
codebook), images cut to ``--tokens`` tokens (small images), a small release-construction dynamic tree (10 nodes,
depth 3, top-3: ``real.decode.dynamic_tree``; the release's 60-node tree records about 8 MB per round at this V, so
100 images would write several GB). Also printed: the record's size on disk per image.

  python benchmarks/bench_record_memory.py [--short] [--tokens 8] [--images 10 100] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # run from a checkout, installed or not

from _timing import write_ratios  # noqa: E402  (benchmarks/_timing.py)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PEAK = ("import resource, sys; from coolsd.cli import main; rc = main(sys.argv[1:]); "
        "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr); sys.exit(rc)")


def peak_of(argv: list[str]) -> int:
    """Peak resident bytes of ``coolsd`` with ``argv`` in a fresh subprocess (its ``ru_maxrss``)."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", PEAK, *argv], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"coolsd {' '.join(argv)} failed:\n{r.stderr[-2000:]}")
    return int(next(ln.split()[1] for ln in r.stderr.splitlines() if ln.startswith("PEAK")))


def main() -> None:
    from real.realsize import llamagen_files

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="the run_all mode (the defaults)")
    ap.add_argument("--tokens", type=int, default=8, help="tokens per image (default 8)")
    ap.add_argument("--images", type=int, nargs=2, default=(10, 100), help="the two image counts (default 10 100)")
    ap.add_argument("--batch-size", type=int, default=10, help="images per batch, both runs (default 10)")
    ap.add_argument("--json", default=None, help="write the ratios here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = llamagen_files(tmp, 256) + ["--mode", "dynamic", "--tree-sampling", "release", "--tree-total", "10",
                                           "--tree-depth", "3", "--tree-topk", "3", "--method", "vanilla",
                                           "--num-tokens", str(a.tokens), "--batch-size", str(a.batch_size),
                                           "--threads", "1", "--seed", "0", "--json"]
        out = {}
        for n in a.images:
            rec = os.path.join(tmp, f"rec{n}.npz")
            out[n] = (peak_of(["generate", *base, "--num-images", str(n), "--record", rec]), os.path.getsize(rec))
    (n0, (p0, s0)), (n1, (p1, s1)) = out.items()
    ratio = p1 / p0
    print(f"generate --record, dynamic tree (release, 10 nodes), V = 16,384, {a.tokens} tokens, batch {a.batch_size}: "
          f"peak {p0 / 2**20:.0f} MiB at {n0} images, {p1 / 2**20:.0f} MiB at {n1}: x{ratio:.3f} (goal <= 1.10); "
          f"record {s0 / n0 / 2**20:.2f} / {s1 / n1 / 2**20:.2f} MiB per image")
    write_ratios(a.json, {"record_peak_100_vs_10": {
        "value": ratio, "better": "lower",
        "what": f"peak RSS of generate --record (dynamic tree, V = 16,384) at {n1} images / at {n0}"}},
        extra={"peak_bytes": {str(n0): p0, str(n1): p1}, "record_bytes_per_image": {str(n0): s0 / n0,
                                                                                  str(n1): s1 / n1}})
    if ratio > 1.10:
        raise SystemExit(f"peak memory grew x{ratio:.3f} from {n0} to {n1} images (goal <= 1.10)")


if __name__ == "__main__":
    main()
