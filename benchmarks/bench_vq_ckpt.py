"""What ``--vq-ckpt`` costs at LlamaGen's vocabulary (V = 16,384; issue 55), each run a fresh ``coolsd generate``
subprocess on ``real.realsize.llamagen_files`` (the published vocabulary and VQ-16's codebook, random weights, 2
layers of width 64), one image cut to ``--tokens`` tokens, a chain of 4 layer-skip drafts, one thread:

* a rule that reads no neighbour table (vanilla) with and without ``--vq-ckpt``: the child's CPU time (user + sys,
  ``RUSAGE_CHILDREN``: other processes on a shared machine do not count) and its peak resident memory
  (``ru_maxrss``). Goals: each at most 1.2x (the issue measured 28.6 s / 2.6 s and 2.85 GB / 0.41 GB when every
  command built the full (V, V - 1) table);
* LANTERN++ (k = 1,000) twice on an empty neighbour cache (``$COOLSD_CACHE``, a temporary folder): the first run
  builds its (V, 1,001) table in bounded memory and saves it, the second reads it. Printed: both runs' CPU time and
  peak, the cache file's size; goals: the build's peak at most 1.5x the cached run's (bounded: one (1,024, V) chunk
  of distances beyond the table; 2.7 GB, 4.1x, before each chunk's whole sorted index array stopped being kept), the
  second run's CPU time below the first's, and the cache file unchanged by the second run.

  python benchmarks/bench_vq_ckpt.py [--short] [--tokens 16] [--json FILE]
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # run from a checkout, installed or not

from _timing import write_ratios  # noqa: E402  (benchmarks/_timing.py)
from bench_record_memory import PEAK, ROOT  # noqa: E402  (the peak-RSS child, one place)

GOAL = 1.2
BUILD_GOAL = 1.5


def run(argv: list[str], env_extra: dict | None = None) -> tuple[float, int]:
    """(CPU seconds, peak resident bytes) of ``coolsd`` with ``argv`` in a fresh subprocess."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env_extra or {})}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-c", PEAK, *argv], capture_output=True, text=True, env=env, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(f"coolsd {' '.join(argv)} failed:\n{r.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, int(next(ln.split()[1] for ln in r.stderr.splitlines() if ln.startswith("PEAK")))


def main() -> None:
    from real.realsize import llamagen_files

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="the run_all mode (the defaults)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per image (default 16)")
    ap.add_argument("--json", default=None, help="write the ratios here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = llamagen_files(tmp, 256)
        i = files.index("--vq-ckpt")
        no_vq = files[:i] + files[i + 4:]                      # without --vq-ckpt PATH --vq-size SIZE
        assert "--vq-ckpt" not in no_vq and "--vq-size" not in no_vq
        common = ["--L", "4", "--num-images", "1", "--num-tokens", str(a.tokens), "--threads", "1", "--seed", "0",
                  "--json", "--save", os.path.join(tmp, "t.npz")]
        cache = {"COOLSD_CACHE": os.path.join(tmp, "cache")}
        van = ["generate", "--method", "vanilla", *common]
        cpu0, peak0 = run([*van[:1], *no_vq, *van[1:]], cache)
        cpu1, peak1 = run([*van[:1], *files, *van[1:]], cache)
        lpp = ["generate", *files, "--method", "lantern++", *common]
        cpu2, peak2 = run(lpp, cache)
        folder = os.path.join(tmp, "cache", "neighbors")
        cached = [os.path.join(folder, f) for f in os.listdir(folder)] if os.path.isdir(folder) else []
        if len(cached) != 1:
            raise SystemExit(f"LANTERN++'s first run left {len(cached)} cache files (expected 1) in {folder}")
        stamp = (os.path.getsize(cached[0]), os.path.getmtime(cached[0]))
        cpu3, peak3 = run(lpp, cache)
        unchanged = stamp == (os.path.getsize(cached[0]), os.path.getmtime(cached[0]))
    mib = 2 ** 20
    print(f"V = 16,384, {a.tokens} tokens, chain L = 4, 1 thread (CPU s / peak MiB):")
    print(f"  vanilla without --vq-ckpt   {cpu0:6.2f} s  {peak0 / mib:6.0f} MiB")
    print(f"  vanilla with --vq-ckpt      {cpu1:6.2f} s  {peak1 / mib:6.0f} MiB   x{cpu1 / cpu0:.2f} time, "
          f"x{peak1 / peak0:.2f} memory (goal <= {GOAL})")
    print(f"  lantern++ k = 1,000, build  {cpu2:6.2f} s  {peak2 / mib:6.0f} MiB   (cache file {stamp[0] / mib:.0f} MiB)")
    print(f"  lantern++ k = 1,000, cached {cpu3:6.2f} s  {peak3 / mib:6.0f} MiB   x{cpu3 / cpu2:.2f} time, "
          f"x{peak3 / peak2:.2f} memory; cache file {'unchanged' if unchanged else 'REWRITTEN'}")
    print(f"  the build's peak / the cached run's: x{peak2 / peak3:.2f} (goal <= {BUILD_GOAL})")
    write_ratios(a.json, {
        "vq_ckpt_cpu_over_none": {"value": cpu1 / cpu0, "better": "lower",
                                  "what": "CPU time of generate --method vanilla with --vq-ckpt / without, V = 16,384"},
        "vq_ckpt_peak_over_none": {"value": peak1 / peak0, "better": "lower",
                                   "what": "peak RSS of generate --method vanilla with --vq-ckpt / without, V = 16,384"},
        "lantern_pp_build_peak_over_cached": {"value": peak2 / peak3, "better": "lower",
                                              "what": "peak RSS of LANTERN++ (k = 1,000) building its table / reading "
                                                      "it from the cache, V = 16,384"},
        "lantern_pp_cached_cpu_over_build": {"value": cpu3 / cpu2, "better": "lower",
                                             "what": "CPU time of LANTERN++ (k = 1,000) reading its cached table / "
                                                     "building it, V = 16,384"},
    }, extra={"cpu_s": [cpu0, cpu1, cpu2, cpu3], "peak_bytes": [peak0, peak1, peak2, peak3],
              "cache_bytes": stamp[0], "cache_unchanged": unchanged})
    bad = [m for m, ok in (("time with --vq-ckpt", cpu1 / cpu0 <= GOAL), ("memory with --vq-ckpt", peak1 / peak0 <= GOAL),
                          ("cached run not faster", cpu3 < cpu2), ("table build's memory", peak2 / peak3 <= BUILD_GOAL),
                          ("cache rewritten", unchanged)) if not ok]
    if bad:
        raise SystemExit(f"goals not met: {', '.join(bad)}")


if __name__ == "__main__":
    main()
