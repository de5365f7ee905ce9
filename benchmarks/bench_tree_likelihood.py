"""Scoring a tree-drafted image exactly vs generating it with plain AR, on the shipped MNIST models (real.zoo; ``--model
natural256``: the natural-image zoo, 256 tokens, V = 1024, with its shipped EAGLE head).

Scoring = teacher-forced tree rows (``real.decode.score_tree.tree_rows``: one target prefill and the EAGLE drafter's
D chain passes re-indexed by round start for the static EAGLE-1 25-node tree with top-k candidates; for the release
dynamic tree (59 nodes, depth 4, top 10), the tree REGROWN at every round start: one drafter pass over the committed
pairs, then 4 level forwards per chunk of round starts) plus the recursion (``theory.likelihood.tree_log_likelihood``
through ``score_tree.tree_likelihood``) for one rule; generating = ``real.decode.engine.generate`` with draft=None
(plain AR) on the same classes at the same batch size, CFG 2, as the sweep runs. Reported per image and as the ratio
score / generate (issue 38's target for static trees: <= 3; dynamic trees: reported). ``--modes static_sampled``: the
EAGLE-1 tree with sampled candidates, scored by the Monte Carlo likelihood (T14; reported, issue 54). Timed interleaved (one call of
each in turn, --repeats rounds, after a warm-up), each by its fastest round, in CPU time of this thread at one
thread (``time.thread_time``, as ``bench_likelihood.py``).

  python benchmarks/bench_tree_likelihood.py [--images 50] [--repeats 3] [--threads 1] [--json [FILE]] [--short]

``--short``: 5 repeats of 20 images, cool-sd only (for benchmarks/run_all.py); ``--json``: one JSON object on stdout,
``--json FILE``: the same object written to FILE with the "ratios" benchmarks/run_all.py reads.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from _timing import interleaved_best, single_thread_clock, write_ratios  # noqa: E402  (benchmarks/_timing.py)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import theory.rules.methods as tm  # noqa: E402
from real.decode.engine import generate  # noqa: E402
from real.decode.modes import DynamicTree, StaticTree  # noqa: E402
from real.decode.sampling import Processing  # noqa: E402
from real.decode.score_tree import tree_likelihood, tree_rows  # noqa: E402
from real.registry import build  # noqa: E402
from theory.tree import EAGLE_25, Tree  # noqa: E402

RULES = {"cool-sd": ("cool-sd", {"delta": 3}), "lantern++": ("lantern++", {"lambda": 3})}
MODES = {"static_topk": StaticTree(Tree(EAGLE_25), "topk"), "dynamic_release": DynamicTree(sampling="release"),
         # sampled candidates: 4 at the root is above the exact path's guard at V = 512, so the recursion is the
         # Monte Carlo likelihood (theory.likelihood.tree_mc, T14; 64 draws per row); on request (--modes)
         "static_sampled": StaticTree(Tree(EAGLE_25), "sampled")}
DEFAULT_MODES = ["static_topk", "dynamic_release"]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                    help="JSON on stdout, or (with FILE) to FILE with run_all.py's ratios")
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--model", default="mnist", choices=("mnist", "natural256"))
    ap.add_argument("--draft", default="eagle", choices=("eagle", "small", "layerskip"))
    ap.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=list(MODES))
    a = ap.parse_args(argv)
    if a.short:
        a.images, a.repeats = 20, 5
    if a.images < 1 or a.repeats < 1 or a.threads < 1:
        raise SystemExit("bench_tree_likelihood: --images, --repeats and --threads must be >= 1")
    torch.set_num_threads(a.threads)
    proc = Processing(cfg_scale=2.0)
    out = {"model": a.model, "draft": a.draft, "images": a.images, "batch_size": a.images, "threads": a.threads,
           "results": []}
    modes = {k: MODES[k] for k in a.modes}
    rules = {"cool-sd": RULES["cool-sd"]} if a.short else RULES
    clock = single_thread_clock()
    b = build(a.model, draft=a.draft, num_images=a.images, seed=0)
    nb = np.asarray(b.neighbors)
    gen = lambda: generate(b.target, None, b.conds, num_tokens=b.num_tokens, processing=proc, seed=1,  # noqa: E731
                           batch_size=a.images)
    fns = {"gen": gen}
    toks = {}
    for name, mode in modes.items():   # tree images of each mode (cool-sd), the rows and each rule's recursion
        v0 = tm.build("cool-sd", mode.max_depth, nb, {"delta": 3})
        gens = generate(b.target, b.draft, b.conds, num_tokens=b.num_tokens, verifier=v0, drafting=mode,
                        processing=proc, seed=2, batch_size=a.images)
        tok = toks[name] = torch.stack([g.tokens for g in gens])
        fns["rows", name] = lambda m=mode, t=tok: tree_rows(b.target, b.draft, b.conds, t, m, processing=proc)
        rows = fns["rows", name]()                                     # also the warm-up
        for rule, (method, params) in rules.items():
            v = tm.build(method, mode.max_depth, nb, params)
            fns["rec", name, rule] = lambda r=rows, t=tok, v=v, m=mode: tree_likelihood(r, t, v, m)
    gen()
    best = interleaved_best(fns, a.repeats, clock=clock)
    t_gen = best["gen"]
    for name in modes:
        for rule in rules:
            t_rows, t_rec = best["rows", name], best["rec", name, rule]
            out["results"].append({"tree": name, "rule": rule, "generate_ar_s_per_image": t_gen / a.images,
                                   "rows_s_per_image": t_rows / a.images, "recursion_s_per_image": t_rec / a.images,
                                   "ratio": (t_rows + t_rec) / t_gen})
    if a.json not in (None, "-"):
        tag = "" if (a.model, a.draft) == ("mnist", "eagle") else f"{a.model}_{a.draft}_"
        write_ratios(a.json, {f"tree_likelihood_{tag}{r['tree']}_{r['rule']}_score_over_generate": {
            "value": r["ratio"], "better": "lower",
            "what": f"s per image, scoring ({r['tree']} tree rows + {r['rule']} recursion) / plain AR generation"
                    + ("" if not tag else f" ({a.model}, {a.draft} draft)")}
            for r in out["results"]}, extra=out)
    if a.json == "-":
        print(json.dumps(out))
    else:
        print(f"{a.model}: {a.images} images per batch, CFG 2, {a.draft} drafter, {a.threads} thread(s); per image:")
        print(f"{'tree':<16} {'rule':<10} {'AR generate':>12} {'rows':>10} {'recursion':>10} {'score/AR':>9}")
        for r in out["results"]:
            print(f"{r['tree']:<16} {r['rule']:<10} {r['generate_ar_s_per_image'] * 1e3:9.2f} ms "
                  f"{r['rows_s_per_image'] * 1e3:7.2f} ms {r['recursion_s_per_image'] * 1e3:7.2f} ms {r['ratio']:9.2f}")
    return out


if __name__ == "__main__":
    main()
