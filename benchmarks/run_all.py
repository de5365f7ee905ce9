"""Every ratio benchmark in its short mode, compared with the committed baseline (issue 30).

Each benchmark runs as a subprocess (``--short --json FILE``) and reports ratios measured within its own
run (interleaved against a baseline of the same run: theory vs the touch-once numpy limit, simulator vs a
Python loop, the engine vs transformers assisted generation, SD vs plain AR at batch 1 and 64, batched vs
batch-1 SD, 2 ranks vs 1, likelihood scoring vs generation for chains and trees, the exact-law objective vs
log_likelihood). Each ratio is compared with
``benchmarks/results/baseline.json``: a regression is a ratio worse than the baseline value by more than
its tolerance, which ``--update`` sets from the ratio's run-to-run spread over ``--runs`` runs. A ratio
that flags is confirmed before it counts: its benchmark runs ``CONFIRM_RUNS`` more times and the ratio is
judged on the median of all its runs (``judge``), printed as a confirmed regression or a transient one
(machine noise). Prints a table now vs baseline and exits 1 on a confirmed regression (2 when a benchmark
fails or a ratio is missing). The
baseline records the commit it was measured at and the machine (/proc/cpuinfo model name, cores); a
different machine is reported, since ratios move with the hardware. Not a test: CI does not run it.

  python benchmarks/run_all.py                   # one run of each (+2 of a flagged one), compare (about 4-6 minutes)
  python benchmarks/run_all.py --update          # 3 runs of each, rewrite the baseline from them
  python benchmarks/run_all.py --only theory sim # a subset
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
BASELINE = HERE / "results" / "baseline.json"

# name -> (script in benchmarks/, its short-mode arguments): each under about a minute on a quiet machine
BENCHMARKS = {
    "theory": ("bench_theory.py", ["--short"]),
    "sim": ("bench_sim.py", ["--short"]),
    "engine_vs_hf": ("bench_engine_vs_hf.py", ["--short", "--tokens", "256", "--repeats", "10", "--threads", "1"]),
    "batch": ("bench_batch.py", ["--short"]),
    "batch_families": ("bench_batch.py", ["--families"]),   # the transformers image families, B = 16 / B = 1 (issue 39)
    "sweep_ranks": ("bench_sweep_ranks.py", ["--short"]),
    "likelihood": ("bench_likelihood.py", ["--short"]),
    "tree_likelihood": ("bench_tree_likelihood.py", ["--short"]),
    "tree_likelihood_mc": ("bench_tree_likelihood.py", ["--short", "--modes", "static_sampled"]),   # T14 (issue 54)
    "dynamic_tree": ("bench_dynamic_tree.py", ["--short"]),
    "tune_exact": ("bench_tune_exact.py", ["--short"]),
    "ops": ("bench_ops.py", ["--short"]),       # exact counts (issue 42): each carries its own tolerance, 0
    "relaxed_verify": ("bench_relaxed_verify.py", ["--short"]),   # LANTERN(++) / vanilla verify time, V = 16,384 (issue 55)
    "lantern_engine": ("bench_lantern_engine.py", ["--short"]),   # LANTERN(++)'s verify share in the engine (issue 55)
    "relaxed_mnist": ("bench_relaxed_mnist.py", ["--short"]),   # GSD / LANTERN++ verify share, MNIST batch 50 (issue 55)
    "sjd_pac": ("bench_sjd_pac.py", ["--short"]),   # SJD-PAC's draft + verify per round / its release's (issue 55)
    "train_drafter": ("bench_train_drafter.py", ["--short"]),   # feature extraction / AR; 2 ranks / 1 (issue 48)
    # issue 49: the natural256 zoo (256 tokens, V = 1024) with its shipped EAGLE head
    "natural256_ar": ("bench_natural256.py", ["--short", "--part", "ar"]),   # 1,000 AR images on 2 cores / 5 min
    "natural256_likelihood": ("bench_likelihood.py", ["--short", "--model", "natural256", "--drafts", "eagle"]),
    "natural256_tree_likelihood": ("bench_tree_likelihood.py", ["--short", "--model", "natural256", "--draft", "eagle",
                                                                "--modes", "static_topk"]),
    "natural256_tune_exact": ("bench_tune_exact.py", ["--short", "--model", "natural256"]),   # scaled to 2,000 / 2 s
    "natural256_predict": ("bench_natural256.py", ["--short", "--part", "predict"]),   # --predict / measured sweep
    # issue 54: generate --record's peak memory at V = 16,384 (dynamic tree), 100 images / 10 (goal <= 1.10)
    "record_memory": ("bench_record_memory.py", ["--short"]),
    # issue 54: exact chain scoring / plain AR at V = 16,384 (random-weight 2-layer LlamaGen, layer-skip draft)
    "realsize_likelihood": ("bench_likelihood.py", ["--short", "--model", "llamagen-16k"]),
    # ... and at LlamaGen-B's depth (12 layers, width 768), where plain-AR steps cost what they do in practice
    "realsize_B_likelihood": ("bench_likelihood.py", ["--short", "--model", "llamagen-16k-B"]),
    # issue 54: tune --objective bound's peak memory at V = 16,384, 576 tokens / 256 (goal <= 1.5; <= 2 GiB at 256)
    "tune_memory": ("bench_tune_memory.py", ["--short"]),
    # issue 55: --vq-ckpt's cost for a rule without a neighbour table, LANTERN++'s table build vs its cache, V = 16,384
    "vq_ckpt": ("bench_vq_ckpt.py", ["--short"]),
}
TIMEOUT_S = 600
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# tolerance = max(SPREAD_FACTOR x (max - min) over the runs, REL_FLOOR x value). The range of three runs is
# about 1.7 standard deviations on average and timings on a shared machine are heavy-tailed: at 1.5 ranges
# the theory pair ratio (baseline runs 1.48-1.55) was flagged at 1.69 on the next run, unchanged code
SPREAD_FACTOR = 3.0
REL_FLOOR = 0.10
# reruns of a benchmark with a flagged ratio before the flag counts (judged on the median of all its runs)
CONFIRM_RUNS = 2


def tolerance(runs: list[float]) -> float:
    """The regression tolerance of a ratio from its runs (the rule above)."""
    return max(SPREAD_FACTOR * (max(runs) - min(runs)), REL_FLOOR * abs(statistics.median(runs)))


def machine() -> dict:
    """The CPU model (/proc/cpuinfo's first model name) and the number of CPUs this process may use."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": len(os.sched_getaffinity(0))}


def commit() -> str:
    """HEAD's short hash, with "+dirty" when tracked files differ from it."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    h = git("rev-parse", "--short", "HEAD") or "unknown"
    return h + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def run_one(name: str) -> tuple[str, dict | None, float, str]:
    """Run benchmark ``name`` once: (status "ok" / "skipped" / "failed", its ratios or None, seconds, note)."""
    script, args = BENCHMARKS[name]
    path = HERE / script
    if not path.exists():
        return "skipped", None, 0.0, f"benchmarks/{script} is absent"
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "ratios.json"
        # one BLAS/OpenMP thread unless set (the benchmarks time one thread; the 2-rank sweep sets its own)
        env = {**{k: "1" for k in THREAD_VARS}, **os.environ,
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t0 = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, str(path), *args, "--json", str(out)], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "failed", None, time.perf_counter() - t0, f"timed out after {TIMEOUT_S} s"
        dt = time.perf_counter() - t0
        if r.returncode or not out.exists():
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            return "failed", None, dt, f"exit {r.returncode}: " + " | ".join(tail)
        ratios = json.loads(out.read_text())["ratios"]
    return "ok", ratios, dt, ""


def regressed(now: float, base: dict) -> bool:
    """Whether ``now`` is worse than the baseline value by more than its tolerance."""
    if base["better"] == "higher":
        return now < base["value"] - base["tolerance"]
    return now > base["value"] + base["tolerance"]


def judge(first: list[float], reruns: list[float], base: dict) -> str:
    """"ok" when the median of the ``first`` runs is within the tolerance of ``base``; else, judged on the median
    of ``first + reruns`` (the confirming runs): "confirmed" (a regression: it reproduces) or "transient"."""
    if not regressed(statistics.median(first), base):
        return "ok"
    return "confirmed" if regressed(statistics.median(first + reruns), base) else "transient"


def blind(base: dict) -> bool:
    """Whether the tolerance is so wide that no value of a "higher is better" ratio can fall below it (the
    ratio's short mode is too noisy for its run-to-run spread to leave room for a regression): flagged in
    the table, so that an ``ok`` there is not read as a check."""
    return base["better"] == "higher" and base["value"] - base["tolerance"] <= 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--update", action="store_true", help="rewrite the baseline from --runs runs of each benchmark")
    ap.add_argument("--runs", type=int, default=None, help="runs of each benchmark (default 3 with --update, else 1)")
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), default=None, help="run only these benchmarks")
    args = ap.parse_args(argv)
    runs = args.runs or (3 if args.update else 1)
    if runs < 1 or (args.update and runs < 2):
        ap.error("--runs must be >= 1 (>= 2 with --update: the tolerance comes from the spread)")
    names = args.only or list(BENCHMARKS)
    base = json.loads(BASELINE.read_text()) if BASELINE.exists() else None
    here = machine()
    print(f"run_all at {commit()} on {here['cpu']} ({here['cores']} CPUs), load average "
          f"{os.getloadavg()[0]:.1f}; {runs} run(s) of each benchmark")
    if base and base.get("machine") != here:
        print(f"  note: the baseline was measured on {base.get('machine')}; ratios move with the hardware")

    values: dict[str, list[float]] = {}
    meta: dict[str, dict] = {}
    failed, skipped = [], []

    def collect(names: list[str], runs: int, into: dict, label: str = "") -> None:
        for k in range(runs):     # runs one after another: each benchmark interleaves its own contenders
            for name in names:
                status, ratios, dt, note = run_one(name)
                print(f"  [{k + 1}/{runs}{label}] {name:13s} {status:8s} {dt:6.1f} s  {note}")
                if status == "skipped":
                    if name not in skipped:
                        skipped.append(name)
                    continue
                if status == "failed":
                    failed.append(name)
                    continue
                for r, v in ratios.items():
                    into.setdefault(r, []).append(float(v["value"]))
                    meta[r] = {"better": v["better"], "what": v["what"], "benchmark": name,
                               **({"fixed_tolerance": v["tolerance"]} if "tolerance" in v else {})}

    collect(names, runs, values)
    base_r = (base or {}).get("ratios", {})
    reruns: dict[str, list[float]] = {}
    flagged = sorted({meta[r]["benchmark"] for r, vs in values.items()
                      if r in base_r and regressed(statistics.median(vs), base_r[r])})
    if flagged and not args.update:
        print(f"  flagged: {', '.join(flagged)}; {CONFIRM_RUNS} more run(s) to confirm")
        collect(flagged, CONFIRM_RUNS, reruns, " confirm")

    rc = 2 if failed else 0
    print(f"\n{'ratio':46s} {'now':>8s} {'baseline':>9s} {'tol':>7s} {'better':>7s}  status")
    for r in sorted(set(values) | {r for r, b in base_r.items() if b.get("benchmark") in names}):
        b = base_r.get(r)
        if r not in values:
            if b and b.get("benchmark") in skipped:
                print(f"{r:46s} {'-':>8s} {b['value']:9.3f} {b['tolerance']:7.3f} {b['better']:>7s}  skipped")
            else:
                print(f"{r:46s} {'-':>8s} {b['value']:9.3f} {b['tolerance']:7.3f} {b['better']:>7s}  MISSING")
                rc = 2
            continue
        now = statistics.median(values[r])
        if b is None:
            print(f"{r:46s} {now:8.3f} {'-':>9s} {'-':>7s} {meta[r]['better']:>7s}  new (not in the baseline)")
            continue
        verdict = judge(values[r], reruns.get(r, []), b)
        rc = max(rc, 1) if verdict == "confirmed" else rc
        again = " ".join(f"{v:.3f}" for v in reruns.get(r, [])) if verdict != "ok" else ""
        print(f"{r:46s} {now:8.3f} {b['value']:9.3f} {b['tolerance']:7.3f} {b['better']:>7s}  "
              + {"ok": "ok", "confirmed": f"REGRESSION, confirmed (reruns {again})",
                 "transient": f"ok, transient (reruns {again})"}[verdict]
              + (" (tolerance too wide to detect a regression)" if blind(b) else ""))
    for name in skipped:
        print(f"skipped {name}: benchmarks/{BENCHMARKS[name][0]} is absent")

    if args.update:
        if failed:
            print(f"not updating the baseline: {', '.join(sorted(set(failed)))} failed")
            return 2
        ratios = dict(base_r) if args.only else {}
        for r, vs in values.items():
            fixed = meta[r].get("fixed_tolerance")     # exact counts: their own tolerance (0), not the spread's
            ratios[r] = {**meta[r], "value": statistics.median(vs),
                         "tolerance": tolerance(vs) if fixed is None else float(fixed), "runs": vs,
                         "spread": max(vs) - min(vs), "commit": commit(),
                         "measured": datetime.datetime.now().isoformat(timespec="seconds")}
        BASELINE.parent.mkdir(parents=True, exist_ok=True)
        doc = {"commit": commit(), "machine": here,  # of the last update; each ratio records its own "measured": datetime.datetime.now().isoformat(timespec="seconds"),
               "load_average": os.getloadavg()[0], "runs": runs,
               "tolerance_rule": f"max({SPREAD_FACTOR} x (max - min) over the runs, {REL_FLOOR} x value)",
               "ratios": dict(sorted(ratios.items()))}
        tmp = BASELINE.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, BASELINE)
        print(f"baseline rewritten: {BASELINE.relative_to(ROOT)} ({len(ratios)} ratios)")
        return 0
    if base is None:
        print("no baseline yet: python benchmarks/run_all.py --update")
    return rc


if __name__ == "__main__":
    sys.exit(main())
