"""Images per second of ``coolsd sweep`` in one process vs under ``torchrun --nproc-per-node 2`` (same
grid, same images, same seeds: the two runs produce identical tokens).

Throughput counts the generation phase only: images generated / (last unit finished - first unit
started), from the unit files' timestamps (model loading and the merge are excluded). With ``--repeats`` the
two runs alternate (one process, 2 ranks, one process, ...) and each keeps its fastest repeat, in wall time (the
ratio is about two processes sharing the machine, so CPU time of one thread would not measure it). Run on an
otherwise idle machine: on a shared one the ratio measures the other load.

    python benchmarks/bench_sweep_ranks.py --images 64
    python benchmarks/bench_sweep_ranks.py --short --json out.json    # 8 images per grid point, 2 repeats (run_all.py)
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _timing import write_ratios  # noqa: E402  (benchmarks/_timing.py)


def throughput(out: pathlib.Path) -> tuple[float, int]:
    starts, ends, n = [], [], 0
    for f in out.glob("units/*/*.npz"):
        with np.load(f) as z:
            meta = json.loads(str(z["meta"]))
            n += len(z["tokens"])
        starts.append(meta["started"])
        ends.append(meta["finished"])
    return n / (max(ends) - min(starts)), n


def run(cmd, out):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run([*cmd, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr[-3000:])
    return throughput(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--unit-images", type=int, default=4)
    p.add_argument("--grid", nargs="+", default=["vanilla", "cool-sd:delta=4"])
    p.add_argument("--repeats", type=int, default=1, help="alternating runs of each, the fastest kept")
    p.add_argument("--short", action="store_true", help="--images 8 (per grid point) --repeats 2")
    p.add_argument("--json", default=None, help="write the ratio to this JSON file (for run_all.py)")
    a = p.parse_args(argv)
    if a.short:
        a.images, a.repeats = 8, 2
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    sweep = ["-m", "coolsd", "sweep", "--model", "mnist", "--grid", *a.grid, "--images", str(a.images),
             "--unit-images", str(a.unit_images), "--no-progress"]
    one = two = 0.0
    for k in range(a.repeats):    # one process and 2 ranks alternate, so load changes hit both alike
        with tempfile.TemporaryDirectory() as tmp:
            r1, n1 = run([sys.executable, *sweep], pathlib.Path(tmp) / "one")
            r2, n2 = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *sweep],
                         pathlib.Path(tmp) / "two")
        print(f"  repeat {k + 1}: one process {r1:.2f} images/s, 2 ranks {r2:.2f} images/s")
        one, two = max(one, r1), max(two, r2)
    print(f"one process: {one:.2f} images/s ({n1} images); torchrun 2 ranks: {two:.2f} images/s ({n2} images), fastest of "
          f"{a.repeats}; "
          f"ratio {two / one:.2f}x (cpu count {os.cpu_count()}, load average {os.getloadavg()[0]:.1f})")
    write_ratios(a.json, {"sweep_2_ranks_over_1": {"value": two / one, "better": "higher",
                                                   "what": f"coolsd sweep images/s, torchrun 2 ranks / 1 process, {a.images} images"}})


if __name__ == "__main__":
    main()
