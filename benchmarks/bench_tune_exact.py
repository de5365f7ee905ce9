"""One evaluation of the exact-law objective (``theory.likelihood.objective``, docs/theory.md section 8c) on one core.

(a) KL(P||P^) and TV of one candidate schedule (free weights 2.0, 1.5, 1.2, 1.0; and the row-conditioned entropy
    family) on N plain-AR MNIST images (default 2,000; T = 49, V = 512, L = 4, EAGLE rows q (N, T, L, V), CFG 2):
    value alone, and value + gradient, against ``theory.likelihood.log_likelihood`` computing log P^ for the same
    images and rule (the exact path the objective must agree with: checked here to 1e-10). Times are process CPU
    time (XLA at one thread, this process pinned to one CPU; time slices lost to other processes do not count) and
    wall time, best of --repeats interleaved rounds, after a warm-up (compilation) that is reported apart. The AR
    rows are made once (``coolsd.rowfiles.make_ar_rows``: ``real.decode.engine.generate`` + teacher-forced rows,
    about 20 ms per image) and cached under --out-dir (default out/bench_tune_exact, ignored by git).
(b) LlamaGen-XL-shaped synthetic rows (T = 576, V = 16,384, L = 4, 64 images, made chunk by chunk from seeds, never
    all in memory): one evaluation (value + gradient) streamed with ``keep=False``, in a child process whose peak
    resident memory (VmHWM) is reported; the target is <= 4 GB.

  python benchmarks/bench_tune_exact.py [--images 2000] [--repeats 5] [--no-xl] [--json [FILE]] [--short]
                                        [--model natural256 --draft small [--scale-to 2000]]

``--model natural256`` (issue 49): the natural-image zoo's AR rows (T = 256, V = 1024; its small independent draft,
whose rows are one per position, q (N, T, V), until its EAGLE head ships); ``--scale-to N``: the times are also
reported scaled linearly to N images (one evaluation is one pass over the rows) and, for natural256, the ratio
of the scaled value + gradient CPU time to issue 49's budget (2 s for 2,000 images on one core).

``--short`` (benchmarks/run_all.py): 500 images, 5 repeats, no XL part; ratios objective / log_likelihood.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

from _timing import write_ratios  # noqa: E402

XL = {"T": 576, "V": 16384, "L": 4, "images": 64, "chunk": 2}
WHAT = {"value": "value", "value_and_grad": "value + gradient"}
THETA = {"free": np.log([2.0, 1.5, 1.2, 1.0]), "entropy": np.r_[np.log([2.0, 1.5, 1.2, 1.0]), 0.2]}


def _pin() -> None:
    """This process on one CPU (the benchmark's "one core"); XLA at one thread (XLA_FLAGS above)."""
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    except (AttributeError, OSError):
        pass


def ar_rows(n: int, out_dir: pathlib.Path, model: str = "mnist", draft: str = "eagle"):
    """n AR images' rows of ``model`` (``draft``, L = 4, CFG 2), from the cache when it holds at least n images."""
    from theory.likelihood import arrows

    out_dir.mkdir(parents=True, exist_ok=True)
    have = sorted(out_dir.glob(f"{model}_{draft}_L4_ar_*.npz"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    for path in have:
        if int(path.stem.rsplit("_", 1)[1]) >= n:
            rows = arrows.load_ar_rows(path, "cache")
            return rows.subset(np.arange(n)), str(path), 0.0
    import torch

    from coolsd.rowfiles import make_ar_rows, save_ar_rows

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = make_ar_rows(model, n, draft=draft, L=4, seed=0, batch_size=100)
    made = time.perf_counter() - t0
    path = out_dir / f"{model}_{draft}_L4_ar_{n}.npz"
    save_ar_rows(path, rows)
    return rows, str(path), made


def part_a(n: int, repeats: int, out_dir: pathlib.Path, model: str = "mnist", draft: str = "eagle") -> dict:
    from theory.likelihood import log_likelihood, objective as ob

    rows, path, made = ar_rows(n, out_dir, model, draft)
    res = {"model": model, "draft": draft, "images": n, "T": rows.T, "V": rows.V, "L": rows.L, "q_shape": list(rows.q.shape), "cache": path,
           "rows_made_s": made, "families": {}}
    for fam, theta in THETA.items():
        obj = ob.ExactObjective(rows, fam)
        t0 = time.perf_counter()
        obj.values(theta)
        obj.value_and_grad(theta)
        warm = time.perf_counter() - t0
        rule = ob.rule_of(fam, theta, rows.L)
        ll = lambda: np.concatenate([log_likelihood(rows.p[a:a + 100], rows.q[a:a + 100], rows.tokens[a:a + 100], rule,  # noqa: E731
                                                    rows.L, convention=rows.convention) for a in range(0, n, 100)])
        fns = {"value": lambda: obj.values(theta), "value_and_grad": lambda: obj.value_and_grad(theta), "log_likelihood": ll}
        best = {k: {"cpu": float("inf"), "wall": float("inf")} for k in fns}
        for _ in range(repeats):   # interleaved rounds: a load spike hits every contender alike
            for k, f in fns.items():
                c0, w0 = time.process_time(), time.perf_counter()
                f()
                best[k]["cpu"] = min(best[k]["cpu"], time.process_time() - c0)
                best[k]["wall"] = min(best[k]["wall"], time.perf_counter() - w0)
        ref = ll()
        mine = obj.log_p_hat(theta)
        fin = np.isfinite(ref)
        err = float(np.max(np.abs(mine[fin] - ref[fin]) / np.abs(ref[fin])))
        if err > 1e-10 or not np.array_equal(np.isfinite(mine), fin):
            raise SystemExit(f"bench_tune_exact: the objective disagrees with log_likelihood ({fam}: {err:.2e})")
        res["families"][fam] = {"warmup_s": warm, "best": best, "values": obj.values(theta), "max_rel_err_vs_ll": err}
    return res


def xl_child() -> dict:
    """(b), in this (child) process: stream XL-shaped rows chunk by chunk and evaluate once (value + gradient)."""
    from theory.likelihood import objective as ob

    T, V, L, n, ch = XL["T"], XL["V"], XL["L"], XL["images"], XL["chunk"]

    class Stream:
        stamp = {"model": "xl-synthetic", "draft": "eagle", "processing": {}, "L": L, "convention": "eagle", "T": T, "V": V}

        def __init__(self):
            self.n = n

        def chunk(self, a, b):
            p, q, x = [], [], []
            for i in range(a, b):            # one image at a time from its own seed: never all in memory
                rng = np.random.default_rng(1000 + i)
                lp = rng.standard_normal((T, V), dtype=np.float32) * 3
                lq = lp[:, None, :] + rng.standard_normal((T, L, V), dtype=np.float32)
                pi = np.exp(lp - lp.max(-1, keepdims=True))
                pi /= pi.sum(-1, keepdims=True)
                qi = np.exp(lq - lq.max(-1, keepdims=True))
                qi /= qi.sum(-1, keepdims=True)
                c = np.cumsum(pi.astype(np.float64), -1)
                x.append(np.minimum((c < rng.random((T, 1)) * c[:, -1:]).sum(-1), V - 1))
                p.append(pi)
                q.append(qi)
            return np.stack(p), np.stack(q), np.stack(x)

    obj = ob.ExactObjective(Stream(), "free", chunk_images=ch, keep=False)
    t0 = time.perf_counter()
    v, g = obj.value_and_grad(THETA["free"])
    dt = time.perf_counter() - t0
    hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return {**XL, "seconds": dt, "values": v, "grad_kl": g["kl"].tolist(), "peak_rss_bytes": hwm}


def part_b() -> dict:
    r = subprocess.run([sys.executable, __file__, "--xl-child"], capture_output=True, text=True, env=os.environ)
    if r.returncode:
        raise SystemExit(f"bench_tune_exact: the XL child failed: {r.stderr.strip().splitlines()[-3:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out-dir", default=str(ROOT / "out" / "bench_tune_exact"))
    ap.add_argument("--no-xl", action="store_true")
    ap.add_argument("--xl-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE")
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--model", default="mnist", choices=("mnist", "natural256"))
    ap.add_argument("--draft", default=None, help="draft kind (default: eagle on mnist, small on natural256)")
    ap.add_argument("--scale-to", type=int, default=None, help="also report the times scaled to this many images")
    a = ap.parse_args(argv)
    a.draft = a.draft or ("eagle" if a.model == "mnist" else "small")
    if a.model != "mnist" and a.scale_to is None:
        a.scale_to = 2000
    _pin()
    if a.xl_child:
        print(json.dumps(xl_child()))
        return {}
    if a.short:
        a.images, a.repeats, a.no_xl = (500, 5, True) if a.model == "mnist" else (250, 3, True)
    if a.images < 2 or a.repeats < 1:
        raise SystemExit("bench_tune_exact: --images must be >= 2 and --repeats >= 1")
    out = {"a": part_a(a.images, a.repeats, pathlib.Path(a.out_dir), a.model, a.draft)}
    if a.scale_to:
        f = a.scale_to / a.images
        out["a"]["scaled"] = {"images": a.scale_to, "factor": f, **{
            fam: {k: r["best"][k]["cpu"] * f for k in ("value", "value_and_grad", "log_likelihood")}
            for fam, r in out["a"]["families"].items()}}
    if not a.no_xl:
        out["b"] = part_b()
    if a.json not in (None, "-"):
        fr = out["a"]["families"]
        tag = "" if a.model == "mnist" else f"{a.model}_"
        ratios = {f"tune_exact_{tag}{fam}_{k}_over_log_likelihood": {
            "value": fr[fam]["best"][k]["cpu"] / fr[fam]["best"]["log_likelihood"]["cpu"], "better": "lower",
            "what": f"CPU s, one exact-law objective {WHAT[k]} ({fam}) / log_likelihood of the same {a.images} "
                    f"{a.model} AR images"} for fam in fr for k in WHAT}
        if a.model != "mnist":
            sc = out["a"]["scaled"]
            ratios |= {f"tune_exact_{tag}{fam}_value_and_grad_{sc['images']}_over_2s": {
                "value": sc[fam]["value_and_grad"] / 2.0, "better": "lower",
                "what": f"CPU s of one value + gradient ({fam}) on {a.images} {a.model} AR images scaled to "
                        f"{sc['images']}, over issue 49's 2 s budget"} for fam in fr}
        write_ratios(a.json, ratios, extra=out)
    if a.json == "-":
        print(json.dumps(out))
        return out
    A = out["a"]
    print(f"(a) {A['images']} {A['model']} AR images ({A['draft']} draft), T = {A['T']}, V = {A['V']}, L = {A['L']}, q {tuple(A['q_shape'])}; "
          f"one core; best of {a.repeats} (CPU s / wall s)")
    for fam, r in A["families"].items():
        b = r["best"]
        print(f"  {fam:8s} value {b['value']['cpu']:.3f} / {b['value']['wall']:.3f}   value+grad "
              f"{b['value_and_grad']['cpu']:.3f} / {b['value_and_grad']['wall']:.3f}   log_likelihood "
              f"{b['log_likelihood']['cpu']:.3f} / {b['log_likelihood']['wall']:.3f}   (warm-up {r['warmup_s']:.1f} s; "
              f"KL {r['values']['kl']:.5f}, TV {r['values']['tv']:.4f}; max rel. err. vs log_likelihood "
              f"{r['max_rel_err_vs_ll']:.1e})")
    if "scaled" in A:
        sc = A["scaled"]
        print(f"  scaled to {sc['images']} images (x {sc['factor']:.2f}, linear): " + "; ".join(
            f"{fam} value + gradient {sc[fam]['value_and_grad']:.2f} CPU s" for fam in A["families"]))
    if "b" in out:
        B = out["b"]
        print(f"(b) XL-shaped rows streamed (T = {B['T']}, V = {B['V']}, L = {B['L']}, {B['images']} images, chunks of "
              f"{B['chunk']}): value + gradient in {B['seconds']:.1f} s, peak RSS {B['peak_rss_bytes'] / 2**30:.2f} GiB "
              f"(target <= 4 GB)")
    return out


if __name__ == "__main__":
    main()
