"""Static (EAGLE-1, 25 nodes) vs dynamic (EAGLE-2) draft trees on the shipped MNIST models (real.zoo), EAGLE drafter,
the sweep's processing (the bundle's CFG and top-k, temperature 1).

Part 1 (speed): vanilla verification; tokens per target call and tokens/s at B = 1 (--images-b1 images, one at a
time) and B = 32 (32 images in one batch), for the static 25-node tree, a dynamic tree with as many nodes
(total 26 = root + 25, depth 4, topk 4) and the LANTERN release's dynamic defaults (total 59, depth 4, topk 10),
both dynamic sampling modes. Tokens/s = image tokens / wall seconds of ``real.decode.engine.generate`` (after a
warm-up), one thread.

Part 2 (predictions, T10 on recorded dynamic rounds, docs/theory.md section 10): one vanilla run with
``record_rows`` stores each round's own tree (parents), p and q rows; ``theory.likelihood.recorded.predict_tree_rounds`` with
those ``RowTrees`` (``theory.tree.row_trees``) predicts every other rule's accepted drafts per round; the measured
figure is the mean accepted drafts per drafted round of that rule's own run (tokens per round = 1 + accepted).
Each round's walk stops at its recorded depth bound (the end of an image).

  python benchmarks/bench_dynamic_tree.py [--images-b1 8] [--images-pred 200] [--threads 1] [--short] [--json [FILE]] [--save FILE]

``--short`` (for benchmarks/run_all.py): part 1 only, the static tree and the 26-node lossless dynamic tree, 4 images at
B = 1; the two trees' runs interleaved (static, dynamic, static, ...) ``SHORT_REPEATS`` times per batch size, each
timed by the fastest repeat in CPU time of this thread (``time.thread_time``: at one torch thread the work runs
on the calling thread, measured within 1% of wall time on an idle core, and time slices lost to other processes on
a shared machine do not count); the runs are deterministic (fixed seed), so every repeat does the same work. ``--json FILE``:
the JSON object with run_all's ratios (``_timing.write_ratios``; ``--json`` alone: printed); ``--save FILE``: the
JSON object too, beside the text table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _timing import interleaved_best, single_thread_clock, write_ratios  # noqa: E402  (benchmarks/_timing.py)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import theory.rules.methods as tm  # noqa: E402
from real.decode.dynamic_tree import DynamicTree  # noqa: E402
from real.decode.engine import generate, summarize  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from real.registry import build  # noqa: E402
from theory.likelihood.recorded import predict_tree_rounds  # noqa: E402
from theory.tree import EAGLE_25, Tree, row_trees  # noqa: E402

# report name -> (method, parameters), as the committed sweep comparison (docs/results/dynamic_tree)
RULES = {"vanilla": ("vanilla", {}), "lantern++ lambda=2": ("lantern++", {"lambda": 2}),
         "lantern++ lambda=4": ("lantern++", {"lambda": 4}), "cool-sd delta=2": ("cool-sd", {"delta": 2}),
         "cool-sd delta=4": ("cool-sd", {"delta": 4})}


SHORT_REPEATS = 8


def _trees(short: bool) -> dict:
    out = {"static eagle25": Tree(EAGLE_25), "dynamic 26/4/4 lossless": DynamicTree(26, 4, 4, "lossless")}
    if not short:
        out |= {"dynamic 26/4/4 release": DynamicTree(26, 4, 4, "release"),
                "dynamic 59/4/10 lossless": DynamicTree(59, 4, 10, "lossless"),
                "dynamic 59/4/10 release": DynamicTree(59, 4, 10, "release")}
    return out


def _depth(tree) -> int:
    return tree.max_depth if isinstance(tree, DynamicTree) else tree.depth


def _run(b, conds, tree, verifier, proc, batch, seed=1, record=False):
    t0 = time.perf_counter()
    gens = generate(b.target, b.draft, conds, num_tokens=b.num_tokens, verifier=verifier, drafting=tree, processing=proc,
                    seed=seed, batch_size=batch, record_rows=record)
    return gens, time.perf_counter() - t0


def speed(b, proc, images_b1: int, short: bool) -> list[dict]:
    """Part 1's rows; ``short``: the times are the fastest of SHORT_REPEATS interleaved runs in thread CPU time."""
    out = []
    v = tm.build("vanilla", 5, None, {})
    trees = _trees(short)
    for tree in trees.values():
        _run(b, [0], tree, v, proc, 1)                                           # warm-up
    for B, n in ((1, images_b1), (32, 32)):
        conds = [i % 10 for i in range(n)]
        last = {}
        run = lambda name: last.__setitem__(name, _run(b, conds, trees[name], v, proc, B))  # noqa: E731
        best = interleaved_best({name: lambda name=name: run(name) for name in trees}, SHORT_REPEATS,
                                clock=single_thread_clock()) if short else {}
        for name in trees:
            if not short:
                run(name)
            gens, wall = last[name][0], best.get(name, last[name][1])
            s = summarize(gens)
            out.append({"tree": name, "batch_size": B, "images": n, "tokens_per_target_call": s["tokens_per_target_call"],
                        "tokens_per_target_call_se": s["tokens_per_target_call_se"],
                        "tokens_per_second": s["tokens"] / wall, "wall_s": wall})
    return out


def predictions(b, proc, images: int, spec: DynamicTree) -> list[dict]:
    """Part 2: T10 on the recorded dynamic rounds of one vanilla run vs each rule's measured accepted drafts."""
    nb = np.asarray(b.neighbors)
    L = spec.max_depth
    conds = [i % 10 for i in range(images)]
    van, _ = _run(b, conds, spec, tm.build("vanilla", L, nb, {}), proc, min(50, images), seed=7, record=True)
    groups: dict = {}
    for g in van:
        for r in g.rounds:
            if r.drafted > 0:                     # rounds with a tree (AR-only rounds draft nothing)
                groups.setdefault(len(r.parent), []).append(r)
    out = []
    for name, (method, params) in RULES.items():
        v = tm.build(method, L, nb, params)
        pred = []
        for n1, rs in sorted(groups.items()):     # a loop over the few node counts (the tree shrinks at image ends)
            p = np.stack([r.p for r in rs]).astype(np.float64)
            q = np.stack([r.q for r in rs]).astype(np.float64)
            tok = np.stack([r.drafts for r in rs])
            trees = row_trees(np.stack([r.parent for r in rs]), spec.topk, depth=L)
            cap = np.array([r.depth for r in rs])
            for a in range(0, len(rs), 64):       # chunks of rounds (memory: R x (N+1) x V float64)
                sl = slice(a, a + 64)
                t = type(trees)(trees.children[sl], trees.node_depth[sl], trees.depth)
                pred.append(np.asarray(predict_tree_rounds(p[sl], q[sl], tok[sl], t, v, max_depth=cap[sl]).accepted))
        pred = np.concatenate(pred)
        gens = van if method == "vanilla" else _run(b, conds, spec, v, proc, min(50, images), seed=11)[0]
        meas = np.array([r.accepted for g in gens for r in g.rounds if r.drafted > 0], np.float64)
        P, M = 1 + pred.mean(), 1 + meas.mean()
        out.append({"rule": name, "predicted_tokens_per_round": float(P), "measured_tokens_per_round": float(M),
                    "measured_se": float(meas.std(ddof=1) / np.sqrt(len(meas))), "rounds_recorded": int(len(pred)),
                    "rounds_measured": int(len(meas)), "relative_error": float(P / M - 1)})
    return out


def ratios(speed: list[dict]) -> dict:
    """run_all's ratios: tokens/s of the 26-node dynamic tree (lossless) over the static 25-node tree, B = 1 and 32."""
    tps = {(r["tree"], r["batch_size"]): r["tokens_per_second"] for r in speed}
    return {f"dynamic26_over_static25_b{B}": {"value": tps[("dynamic 26/4/4 lossless", B)] / tps[("static eagle25", B)],
                                             "better": "higher",
                                             "what": f"MNIST tokens/s, dynamic 26-node tree / static 25-node tree, B = {B}"}
            for B in (1, 32)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images-b1", type=int, default=8)
    ap.add_argument("--images-pred", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                    help="the JSON object (with run_all's ratios) to FILE, or to stdout without FILE")
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--save", default=None, metavar="FILE", help="also write the JSON object to FILE")
    a = ap.parse_args(argv)
    if a.short:
        a.images_b1 = 4
    if a.images_b1 < 1 or a.images_pred < 2 or a.threads < 1:
        raise SystemExit("bench_dynamic_tree: --images-b1 and --threads must be >= 1, --images-pred >= 2")
    torch.set_num_threads(a.threads)
    b = build("mnist", draft="eagle", num_images=1, seed=0)
    proc = Processing(temperature=1.0, top_k=b.top_k, cfg_scale=b.cfg_scale)
    t0 = time.perf_counter()
    out = {"model": "mnist", "draft": "eagle", "cfg_scale": b.cfg_scale, "top_k": b.top_k, "threads": a.threads,
           "speed": speed(b, proc, a.images_b1, a.short)}
    if not a.short:
        out["predictions"] = {"tree": DynamicTree(26, 4, 4).params(), "images": a.images_pred,
                              "rules": predictions(b, proc, a.images_pred, DynamicTree(26, 4, 4, "lossless"))}
    out["wall_s"] = time.perf_counter() - t0
    out["ratios"] = ratios(out["speed"])
    if a.save:
        with open(a.save, "w") as fh:
            json.dump(out, fh, indent=1)
    if a.json == "-":
        print(json.dumps(out))
        return out
    if a.json:
        write_ratios(a.json, out["ratios"], {k: v for k, v in out.items() if k != "ratios"})
    print(f"MNIST, EAGLE drafter, CFG {b.cfg_scale}, top-k {b.top_k}, temperature 1, vanilla, {a.threads} thread(s)")
    print(f"{'tree':<26} {'B':>3} {'images':>6} {'tokens/call':>16} {'tokens/s':>9}")
    for r in out["speed"]:
        print(f"{r['tree']:<26} {r['batch_size']:>3} {r['images']:>6} {r['tokens_per_target_call']:8.3f} +- "
              f"{r['tokens_per_target_call_se']:.3f} {r['tokens_per_second']:9.1f}")
    if "predictions" in out:
        print(f"\nT10 on recorded dynamic rounds (26/4/4 lossless) of one vanilla run of {a.images_pred} images:")
        print(f"{'rule':<20} {'predicted tok/round':>19} {'measured (SE)':>16} {'error':>7}")
        for r in out["predictions"]["rules"]:
            print(f"{r['rule']:<20} {r['predicted_tokens_per_round']:19.3f} {r['measured_tokens_per_round']:9.3f} "
                  f"({r['measured_se']:.3f}) {100 * r['relative_error']:+6.1f}%")
    print(f"wall clock {out['wall_s']:.0f} s")
    return out


if __name__ == "__main__":
    main()
