"""Batched generation on the shipped MNIST models (real.zoo): images/s of plain AR and of vanilla and
Cool-SD chain speculative decoding (EAGLE-1 drafter, L = 4, CFG 2, as the demo) at batch sizes B, the
SD / AR speed-up at each B measured (both batched at the same B) and predicted by the unit-cost model of
``theory.markov.image.batch_speedup`` (unit costs measured at each B: one AR step of the batch, one speculative
round = L draft steps + the target pass over L + 1 tokens + the verifier; rounds per batch = the
expected maximum of B images' round counts from the vanilla run), and the share of a round spent outside
model forwards (every model call timed).

  python benchmarks/bench_batch.py [--batches 1 8 32 64] [--images 128] [--threads 2] [--json out.json]
  python benchmarks/bench_batch.py --short --json out.json   # B = 1 (8 images) and 64 (64), 1 thread (run_all.py)
  python benchmarks/bench_batch.py --families [--json out.json]  # the tiny transformers families: B = 16 / B = 1

The JSON also holds "ratios" (SD / AR at B = 1 and 64, SD at B = 64 / SD at B = 1), which run_all.py reads.
``--short`` times the six cells (3 methods x B = 1, 64) interleaved, one run of each in turn, ``SHORT_REPEATS``
rounds, each cell timed by its fastest round in CPU time of this thread (``time.thread_time``: at one torch thread
the work runs on the calling thread, within 1% of wall time on an idle core, and the time slices other processes
take on a shared machine do not count); the runs have fixed seeds, so every round does the same work. Without
``--short`` each cell is one wall-clock run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


import numpy as np  # noqa: E402
import torch  # noqa: E402
from _timing import interleaved_best, write_ratios  # noqa: E402  (benchmarks/_timing.py)

from real.decode import engine  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from real.zoo import gpt  # noqa: E402
from theory import rules  # noqa: E402
from theory.markov.image import batch_speedup  # noqa: E402
from coolsd.studies.batching import unit_costs  # noqa: E402

T, L = gpt.TOKENS, 4
METHODS = ("ar", "vanilla", "cool-sd")
SHORT_REPEATS = 5


class Timed:
    """A model whose prefill / forward calls are timed (the rest of the engine is the overhead)."""

    def __init__(self, model):
        self.model, self.seconds = model, 0.0

    def __getattr__(self, k):
        return getattr(self.model, k)

    def _t(self, f, *a, **kw):
        t0 = time.perf_counter()
        out = f(*a, **kw)
        self.seconds += time.perf_counter() - t0
        return out

    def prefill(self, *a, **kw):
        return self._t(self.model.prefill, *a, **kw)

    def forward(self, *a, **kw):
        return self._t(self.model.forward, *a, **kw)


def run(method: str, target, eagle, conds, B: int, proc: Processing, seed: int):
    """(images/s, per-image rounds, forward share of the wall time) of one method at batch size B."""
    t, d = Timed(target), Timed(eagle)
    kw = {} if method == "ar" else dict(verifier=rules.vanilla() if method == "vanilla" else rules.cool_sd(4.0), drafting=L)
    t0 = time.perf_counter()
    gens = engine.generate(t, None if method == "ar" else d, conds, num_tokens=T, processing=proc, seed=seed,
                           batch_size=B, **kw)
    wall = time.perf_counter() - t0
    rounds = np.array([len(g.rounds) for g in gens])
    return len(conds) / wall, rounds, (t.seconds + d.seconds) / wall, engine.summarize(gens)


FAMILIES = ("chameleon-tiny", "janus-tiny", "emu3-tiny", "glm-image-tiny")


def families() -> dict:
    """The tiny transformers image families (issue 39), batched through ``real.adapters.batched_imagelm``: images/s of
    plain AR and of Cool-SD (delta 2; layer-skip draft, chain L = 4; each family's default CFG) at B = 16 over B = 1
    (16 images at B = 16, 4 at B = 1), each cell the fastest of ``SHORT_REPEATS`` interleaved runs in thread CPU time.
    On the shared 2-core CPU these models are compute-bound per row, so the ratio says what batching buys on CPU; it
    is reported, not a goal. Returns the ratios for run_all.py."""
    from real.registry import build

    ratios, cells = {}, {}
    for name in FAMILIES:
        b = build(name, num_images=16, seed=0)
        proc = Processing(cfg_scale=b.cfg_scale)
        for m in ("ar", "cool-sd"):
            for B in (1, 16):
                conds = b.conds[:4] if B == 1 else b.conds
                kw = {} if m == "ar" else dict(verifier=rules.cool_sd(2.0), drafting=L)
                cells[name, m, B] = (lambda b=b, proc=proc, conds=conds, B=B, m=m, kw=kw: engine.generate(
                    b.target, None if m == "ar" else b.draft, conds, num_tokens=b.num_tokens, processing=proc,
                    batch_size=B, seed=1, **kw))
    for f in cells.values():       # warm-up
        f()
    best = interleaved_best(cells, SHORT_REPEATS, clock=time.thread_time)
    print(f"tiny transformers families, layer-skip draft, L = {L}, Cool-SD delta 2, {torch.get_num_threads()} thread(s)")
    print(f"{'model':>16} {'method':>8} {'img/s B=1':>10} {'img/s B=16':>11} {'B=16 / B=1':>10}")
    for name in FAMILIES:
        for m in ("ar", "cool-sd"):
            one, six = 4 / best[name, m, 1], 16 / best[name, m, 16]
            print(f"{name:>16} {m:>8} {one:10.1f} {six:11.1f} {six / one:10.2f}")
            ratios[f"{name}_{m}_b16_over_b1"] = {"value": six / one, "better": "higher",
                                                 "what": f"images/s of {m} on {name}, batch 16 / batch 1"}
    return ratios


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", action="store_true",
                    help="the tiny transformers families (chameleon, janus, emu3, glm-image): B = 16 / B = 1 images/s")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--images", type=int, default=128, help="images per method and batch size (>= max batch)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--short", action="store_true",
                    help="--batches 1 64 --images 64 --threads 1 --repeats 10, 8 of the images at batch 1")
    args = ap.parse_args(argv)
    command = " ".join(["python", "benchmarks/bench_batch.py"] + (argv or sys.argv[1:]))
    if args.families:
        torch.set_num_threads(1)
        write_ratios(args.json, families(), {"command": command})
        return
    if args.short:
        args.batches, args.images, args.threads, args.repeats = [1, 64], 64, 1, 10
    if args.images < max(args.batches):
        raise SystemExit(f"--images ({args.images}) must be >= the largest batch size ({max(args.batches)})")
    torch.set_num_threads(args.threads)
    target = gpt.load_target()
    eagle = gpt.load_eagle(target)
    proc = Processing(cfg_scale=2.0)
    conds = [i % 10 for i in range(args.images)]
    engine.generate(target, eagle, conds[:8], num_tokens=T, processing=proc, verifier=rules.vanilla(), drafting=L,
                    batch_size=8)                                              # warm-up
    cells = {(B, m): conds[:max(B, 8)] if args.short else conds for B in args.batches for m in METHODS}  # --short: 8 at B=1
    res = {}
    run_cell = lambda B, m: res.__setitem__((B, m), run(m, target, eagle, cells[B, m], B, proc, seed=B))  # noqa: E731
    if args.short:     # images/s from the fastest of the interleaved rounds, in thread CPU time (docstring)
        best = interleaved_best({k: lambda k=k: run_cell(*k) for k in cells}, SHORT_REPEATS, clock=time.thread_time)
        res = {k: (len(cells[k]) / best[k], *r[1:]) for k, r in res.items()}
    rows, base = [], {}
    print(f"MNIST zoo target + EAGLE-1 drafter, L = {L}, CFG 2, {args.images} images per cell, "
          f"{args.threads} threads")
    print(f"{'B':>4} {'method':>8} {'img/s':>8} {'x batch-1':>9} {'tok/call':>8} {'speed-up':>8} {'pred.':>6} "
          f"{'non-fwd':>7}")
    for B in args.batches:
        c = unit_costs(target, eagle, B, proc, L, args.repeats, reduce=statistics.median)   # coolsd.studies.batching
        if not args.short:
            for m in METHODS:
                run_cell(B, m)
        round_cost = L * c["draft_step"] + c["verify_pass"] + c["verifier"]
        for m in METHODS:
            ips, rounds, fwd_share, st = res[B, m]
            base.setdefault(m, ips)
            measured = ips / res[B, "ar"][0]
            pred = 1.0 if m == "ar" else batch_speedup(rounds, B, T, c["ar_step"], round_cost)
            row = {"B": B, "method": m, "images_per_s": ips, "vs_batch1": ips / base[m],
                   "tokens_per_target_call": st["tokens_per_target_call"], "speedup_measured": measured,
                   "speedup_predicted": pred, "non_forward_share": 1 - fwd_share, **{f"cost_{k}": v for k, v in c.items()}}
            rows.append(row)
            print(f"{B:>4} {m:>8} {ips:8.1f} {row['vs_batch1']:9.2f} {row['tokens_per_target_call']:8.2f} "
                  f"{measured:8.2f} {pred:6.2f} {100 * row['non_forward_share']:6.1f}%")
    stop = [r["B"] for r in rows if r["method"] == "vanilla" and r["speedup_measured"] < 1]
    print(f"vanilla SD stops paying (measured speed-up < 1) from B = {stop[0]}" if stop else
          "vanilla SD still pays at every batch size measured")
    if args.json:
        at = {(r["B"], r["method"]): r for r in rows}
        ratios = {}
        for m in ("vanilla", "cool-sd"):
            for B in (1, 64):
                if (B, m) in at:
                    ratios[f"sd_{m}_over_ar_b{B}"] = {"value": at[B, m]["speedup_measured"], "better": "higher",
                                                      "what": f"images/s, {m} SD / plain AR, both at batch {B}"}
            if (1, m) in at and (64, m) in at:
                ratios[f"sd_{m}_b64_over_b1"] = {"value": at[64, m]["vs_batch1"], "better": "higher",
                                                 "what": f"images/s, {m} SD at batch 64 / at batch 1"}
        write_ratios(args.json, ratios, {"command": command, "rows": rows})


if __name__ == "__main__":
    main()
